"""Adapters between lsr and the formats and tools of the field.

* ``anserini``: Anserini / Pyserini JsonVectorCollection documents and pre-encoded query files (token
  repeated or weighted, ``.gz`` accepted) to and from ``SparseVectors``.
* ``vectors``: pre-encoded vectors given by path (lsr folders, Anserini queries, pyserini documents): the one
  place that decides which format a path holds (``read_query_vectors``, ``read_doc_vectors``).
* ``pyterrier``: PyTerrier indexer / retriever / encoder transformers (import it explicitly: needs PyTerrier).
* ``ciff``: CIFF import / export (needs protobuf; ``ciff_wire``, ``ciff_reader``, ``ciff_postings``), behind
  ``lsr export-ciff`` / ``lsr import-ciff``.
"""

from lsr.interop.anserini import *  # noqa: F403 - the package re-exports the Anserini adapters
from lsr.interop.anserini import __all__  # noqa: F401
