"""Work items of the block path's passes, made once per shape and cached outside the CUDA graphs.

An item is one (query group, span) with its output offset (``lsr.search.kernels.block.span_items``, 16 B). Made
per call inside a graph they were ~20-30 of its kernels (each a node that the graph's launch pays for); cached, a
graph's warm-up run makes them and the graph reads them. A graph holds its items in its ChunkResult, so an entry
dropped from a cache stays allocated while that graph lives. The caches belong to the index
(``lsr.search.index_cache``); their sizes are ``SearchConfig.caches.items_*``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["ItemsCache", "make_span_items"]


def make_span_items(B: int, n_items: int, n_spans: int, group: int, width: int,
                    device: torch.device) -> tuple[torch.Tensor, ...]:
    """``span_items`` of ``n_items`` spans spread evenly over ``n_spans`` (all of them when equal)."""
    from lsr.search.kernels.block import span_items  # here: the torch backend (no items) loads no kernel module

    spans = (torch.arange(n_items, device=device) * n_spans) // n_items
    return span_items(B, spans, group, width)


class ItemsCache:
    """Work items per shape (``make_span_items``'s arguments), the least recently used dropped beyond ``size``
    entries; items above ``max_bytes`` or made during a graph capture (their kernels have not run yet) are not kept."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple, tuple[torch.Tensor, ...]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[Any, ...], size: int, max_bytes: int | None = None) -> tuple[torch.Tensor, ...]:
        with self.lock:
            items = self.entries.get(key)
            if items is not None:
                self.entries.move_to_end(key)
                return items
        items = make_span_items(*key)
        device = key[-1]
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not capturing and (max_bytes is None or items[0].numel() * 16 <= max_bytes):
            with self.lock:
                self.entries[key] = items
                while len(self.entries) > size:
                    self.entries.popitem(last=False)
        return items

    def cache_clear(self) -> None:
        with self.lock:
            self.entries.clear()
