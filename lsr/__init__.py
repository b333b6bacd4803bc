"""lsr: end-to-end GPU learned sparse retrieval.

Packages follow the pipeline, each with its kernels: ``encode`` (SPLADE with the Sparton head, BM25,
corpus encoding), ``index`` (the GPU inverted index), ``search`` (exact top-k), ``evaluation``
(ir-measures and the fast [B, k] metrics), ``train``, ``rerank``, ``serve``; ``parallel`` holds everything
torch.distributed. Around them: ``data`` (datasets, topics, qrels, run files), ``storage`` (atomic files,
Parquet vector shards, provenance), ``interop`` (Anserini / CIFF / PyTerrier), ``sparse`` (CSR vectors),
``config``, ``pipeline`` and ``cli``; ``utils`` (devices, ragged index arithmetic, kernel helpers);
``testing`` and ``benchmarks`` hold the references, the synthetic collections and the harness that the tests
and the benchmark scripts share.

Importing ``lsr`` is cheap: torch, triton and transformers are imported only when a public name
that needs them is first used (PEP 562 lazy attributes).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "SparseVectors": "lsr.sparse",
    "InvertedIndex": "lsr.index.inverted",
    "Searcher": "lsr.search.searcher",
    "SearchConfig": "lsr.search.config",
    "open_searcher": "lsr.search.factory",
    "SpladeEncoder": "lsr.encode.splade.encoder",
    "LexicalEncoder": "lsr.encode.bm25.lexical",
    "evaluate": "lsr.evaluation.measures",
    "load_dataset": "lsr.data.sources",
}
_SUBMODULES = {
    "benchmarks", "cli", "config", "data", "encode", "evaluation", "index", "interop", "parallel", "pipeline", "rerank",
    "search", "serve", "sparse", "storage", "train", "utils",
}

__all__ = sorted(_LAZY) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from lsr.data.sources import load_dataset
    from lsr.encode.bm25.lexical import LexicalEncoder
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.evaluation.measures import evaluate
    from lsr.index.inverted import InvertedIndex
    from lsr.search.config import SearchConfig
    from lsr.search.factory import open_searcher
    from lsr.search.searcher import Searcher
    from lsr.sparse import SparseVectors


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = importlib.import_module(f"lsr.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'lsr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)
