"""Adapters between lsr and the formats and tools of the field.

* ``anserini``: Anserini / Pyserini JsonVectorCollection documents and pre-encoded query files (token
  repeated or weighted, ``.gz`` accepted) to and from ``SparseVectors``.
* ``pyterrier``: PyTerrier indexer / retriever / encoder transformers (import it explicitly: needs PyTerrier).
* ``hf_datasets``: ``hf:ORG/NAME`` and Parquet / JSONL datasets (used by :func:`lsr.data.sources.load_dataset`).
* ``ir_datasets_source``: ir_datasets ids as datasets, offline-safe (used by :func:`lsr.data.sources.load_dataset`).
* ``ciff``: CIFF import / export (needs protobuf); ``cli``: ``lsr export-ciff`` / ``lsr import-ciff``.
"""

from lsr.interop.anserini import *  # noqa: F403 - the package re-exports the Anserini adapters
from lsr.interop.anserini import __all__  # noqa: F401
