"""The GPU inverted index: ``InvertedIndex`` (lsr.index.inverted) and its builder (lsr.index.build).

Names are resolved lazily so ``import lsr.index`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "InvertedIndex": "lsr.index.inverted",
    "build_postings": "lsr.index.build",
    "PostingArrays": "lsr.index.build",
    "PAD": "lsr.index.build",
}

__all__ = ["PAD", "InvertedIndex", "PostingArrays", "build_postings"]

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.build import PAD, PostingArrays, build_postings
    from lsr.index.inverted import InvertedIndex


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lsr.index' has no attribute {name!r}")
