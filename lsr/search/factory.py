"""``open_searcher``: the searcher that fits an index, or an index folder, sharded or not.

It lives apart from ``lsr.search.searcher`` because ``lsr.search.sharded`` (the sharded searcher) imports that
module: this one imports both.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lsr.index.inverted import InvertedIndex
from lsr.index.sharded import ShardedIndex, is_sharded
from lsr.search.config import SearchConfig
from lsr.search.searcher import Searcher
from lsr.search.sharded import ShardedSearcher
from lsr.utils.devices import torch_device

__all__ = ["metadata_loader", "open_searcher"]


def open_searcher(index_or_path: Any, *, device: str | torch.device | None = None,
                  config: SearchConfig | None = None, **kwargs: Any) -> Any:
    """A ``Searcher`` for an ``InvertedIndex``, a ``lsr.search.sharded.ShardedSearcher`` for a
    ``lsr.index.sharded.ShardedIndex`` (same API; partitions searched in turn, exact merge).

    Args:
        index_or_path: an index, or the folder ``lsr index`` wrote (a sharded one is recognised by its manifest),
            loaded onto ``device`` (default: CUDA when available, else the CPU).
        device: where to search (default: the index's device).
        config: the search's ``SearchConfig``.
        **kwargs: further arguments of the searcher (``backend``, ``max_memory_bytes``, ``metadata``: by default
            an index folder's own metadata columns; a sharded index also ``stream``).
    """
    index = index_or_path
    if isinstance(index_or_path, (str, os.PathLike)):
        where = torch_device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        loader = ShardedIndex if is_sharded(index_or_path) else InvertedIndex
        index = loader.load(index_or_path, device=where)
        if "metadata" not in kwargs:   # the columns ``lsr index --metadata`` attached, read at the first expression
            kwargs["metadata"] = metadata_loader(index_or_path, index)
    if isinstance(index, ShardedIndex):
        return ShardedSearcher(index, device, config=config, **kwargs)
    if isinstance(index, InvertedIndex):
        return Searcher(index, device, config=config, **kwargs)
    raise TypeError(f"open_searcher takes an InvertedIndex, a ShardedIndex or an index folder, "
                    f"got {type(index_or_path).__name__}")


def metadata_loader(folder: str | os.PathLike, index: Any) -> Any:
    """A function returning ``folder``'s metadata columns checked against ``index``'s docnos (None without
    them), read once, at its first call: a search that no expression filters reads nothing."""
    import functools

    from lsr.index.metadata import load_metadata

    return functools.cache(lambda: load_metadata(folder, index.docnos))
