"""What lsr writes to disk and how: atomic files, Parquet vector shards, provenance.

* ``files``: the gzip-aware opener and the atomic writers every reader and writer shares.
* ``shards``: vector directories (Parquet shards + manifest) and their readers.
* ``shard_writer``: ``ShardWriter``, writing a vector directory shard by shard, resumably.
* ``provenance``: what produced an artefact, and the checks that refuse to reuse or overwrite the wrong thing.
"""
