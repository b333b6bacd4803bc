"""Adapters between lsr and the formats and tools of the field.

* ``anserini``: Anserini / Pyserini JsonVectorCollection documents and pre-encoded query files (token
  repeated or weighted, ``.gz`` accepted) to and from ``SparseVectors``.
"""

from lsr.interop.anserini import (
    ANSERINI_QUERY_SCALE,
    load_vocab,
    read_anserini_documents,
    read_anserini_queries,
    write_anserini_queries,
    write_jsonl_vectors,
)

__all__ = [
    "ANSERINI_QUERY_SCALE",
    "load_vocab",
    "read_anserini_documents",
    "read_anserini_queries",
    "write_anserini_queries",
    "write_jsonl_vectors",
]
