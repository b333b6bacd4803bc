"""What lsr writes to disk and how: atomic files, Parquet vector shards, provenance.

* ``files``: the gzip-aware openers and the atomic writers every reader and writer shares.
* ``vector_format``: the vector directory format: names, manifest checks, Arrow table <-> ``SparseVectors``.
* ``shards``: reading vector directories (whole, by shard, by row range) and ``write_vectors``.
* ``shard_writer``: ``ShardWriter``, writing a vector directory shard by shard, resumably.
* ``provenance``: what produced an artefact, and the checks that refuse to reuse or overwrite the wrong thing.

The names below are imported on first use (``from lsr.storage import read_vectors``): ``files`` and
``provenance`` stay free of torch and pyarrow for the modules that need only them.
"""

from __future__ import annotations

from lsr.utils.lazy import lazy_exports

__all__ = ["ShardWriter", "atomic_write_text", "iter_shards", "read_manifest", "read_vector_rows", "read_vectors",
           "write_vectors"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "lsr.storage.files": ("atomic_write_text",),
    "lsr.storage.shard_writer": ("ShardWriter",),
    "lsr.storage.shards": ("iter_shards", "read_manifest", "read_vector_rows", "read_vectors", "write_vectors"),
})
