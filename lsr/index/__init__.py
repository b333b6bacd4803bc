"""The GPU inverted index.

Module map:

* ``inverted``: ``InvertedIndex`` (posting arrays on one device, save / load / check, no pickle).
* ``build``: ``build_postings``, the chunked GPU (or CPU) build of the warp-padded, block-aligned layout.
* ``compact``: the compact posting layout (block-local 16-bit doc ids and weights).
* ``sharded``: ``ShardedIndex``, a collection split into contiguous partitions in one folder (built in this
  process by ``ShardedIndex.build``; on every rank of a torchrun job by ``lsr.parallel.sharded_build``).
* ``metadata``: filter columns from the corpus kept beside an index (``metadata.parquet``, doc-index order).
* ``filter_expr``: ``parse_filter``, the safe filter language over those columns; ``filter_nodes``: its tree
  and its evaluation with pyarrow.compute.

``import lsr`` stays light because lsr resolves ``lsr.index`` lazily; importing this package loads torch.
"""

from lsr.index.build import PAD, PostingArrays, build_postings
from lsr.index.inverted import InvertedIndex
from lsr.index.sharded import ShardedIndex

__all__ = ["PAD", "InvertedIndex", "PostingArrays", "ShardedIndex", "build_postings"]
