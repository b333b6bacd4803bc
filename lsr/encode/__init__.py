"""Encoders: text to ``SparseVectors``.

Module map (sub-packages by concern; each ``__init__`` exports its public names):

* ``base``: the ``Encoder`` protocol every encoder follows (``encode_query`` / ``encode_document`` / ``describe``).
* ``splade/``: ``SpladeEncoder`` (Hugging Face masked LMs and sentence-transformers sparse checkpoints), the batch
  forward, short-query CUDA graphs, CSR extraction, checkpoint loading and saving.
* ``backbone/``: the padding-free BERT / DistilBERT body with its kernels (packed attention, add + LayerNorm).
* ``tokenize/``: bulk WordPiece, tokenizer worker processes, length-sorted batching.
* ``bm25/``: ``LexicalEncoder`` (BM25 weights) over a Lucene-like English analyzer.
* ``sparton/``: the Sparton head op: torch reference, padded / resident (sm_90, experimental) / packed forwards,
  backward, CPU head, and the dispatch that says which one runs and why.
* ``kernels/``: ``kernels.sparton`` re-exports ``sparton_head`` under the design guide's public-API path.
* ``corpus``: ``encode_corpus``, a document stream to resumable Parquet shards.
* ``stream``: the window pipeline ``encode_corpus`` and long ``encode_document`` calls share.

``import lsr`` stays light: this package is resolved lazily and imports nothing heavy itself; its public names
load their modules on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_LAZY = {
    "Encoder": "lsr.encode.base",
    "LexicalEncoder": "lsr.encode.bm25.lexical",
    "SpladeEncoder": "lsr.encode.splade.encoder",
    "encode_corpus": "lsr.encode.corpus",
    "sparton_head": "lsr.encode.sparton.dispatch",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lsr.encode' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
