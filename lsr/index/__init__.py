"""The GPU inverted index.

Module map:

* ``inverted``: ``InvertedIndex`` (posting arrays on one device, save / load / check, no pickle).
* ``build``: ``build_postings``, the chunked GPU (or CPU) build of the warp-padded, block-aligned layout.

``import lsr`` stays light because lsr resolves ``lsr.index`` lazily; importing this package loads torch.
"""

from lsr.index.build import PAD, PostingArrays, build_postings
from lsr.index.inverted import InvertedIndex

__all__ = ["PAD", "InvertedIndex", "PostingArrays", "build_postings"]
