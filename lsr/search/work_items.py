"""Work items of the block path's passes, made once per shape and cached outside the CUDA graphs.

An item is one (query group, span) with its output offset (``lsr.search.kernels.block.span_items``, 16 B). Made
per call inside a graph they were ~20-30 of its kernels (each a node that the graph's launch pays for); cached, a
graph's warm-up run makes them and the graph reads them. A graph holds its items in its ChunkResult, so an entry
dropped from a cache stays allocated while that graph lives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from lsr.search.graphs import GRAPH_MAX_B
from lsr.search.kernels.block import span_items

__all__ = ["ITEMS_CACHE_MAX_B", "LARGE", "LARGE_ITEMS_BYTES", "LARGE_ITEMS_CACHE", "SMALL", "ItemsCache", "make_span_items",
           "span_work_items"]

ITEMS_CACHE_MAX_B = 64         # batches whose work items are cached per shape, 64 shapes (``SMALL``)
LARGE_ITEMS_CACHE = 8          # larger batches (up to GRAPH_MAX_B): this many item sets, two a shape (``LARGE``)
LARGE_ITEMS_BYTES = 1 << 23    # ... of at most this many bytes each (~2.5 MB at B = 512 on 8.8M docs' coarse spans)


def make_span_items(B: int, n_items: int, n_spans: int, group: int, width: int,
                    device: torch.device) -> tuple[torch.Tensor, ...]:
    """``span_items`` of ``n_items`` spans spread evenly over ``n_spans`` (all of them when equal)."""
    spans = (torch.arange(n_items, device=device) * n_spans) // n_items
    return span_items(B, spans, group, width)


class ItemsCache:
    """Work items per shape (``make_span_items``'s arguments), the least recently used dropped beyond ``size``
    entries; items above ``max_bytes`` or made during a graph capture (their kernels have not run yet) are not kept."""

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self.size, self.max_bytes = size, max_bytes
        self.entries: OrderedDict[tuple, tuple[torch.Tensor, ...]] = OrderedDict()
        self.lock = threading.Lock()

    def __call__(self, *key: Any) -> tuple[torch.Tensor, ...]:
        with self.lock:
            items = self.entries.get(key)
            if items is not None:
                self.entries.move_to_end(key)
                return items
        items = make_span_items(*key)
        device = key[-1]
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not capturing and (self.max_bytes is None or items[0].numel() * 16 <= self.max_bytes):
            with self.lock:
                self.entries[key] = items
                while len(self.entries) > self.size:
                    self.entries.popitem(last=False)
        return items

    def cache_clear(self) -> None:
        with self.lock:
            self.entries.clear()


SMALL = ItemsCache(64)
LARGE = ItemsCache(LARGE_ITEMS_CACHE, LARGE_ITEMS_BYTES)


def span_work_items(B: int, n_items: int, n_spans: int, group: int, width: int,
                    device: torch.device) -> tuple[torch.Tensor, ...]:
    """The work items of one pass (``make_span_items``), from SMALL for batches up to ITEMS_CACHE_MAX_B, from LARGE
    up to GRAPH_MAX_B (LARGE_ITEMS_CACHE entries of up to LARGE_ITEMS_BYTES), made afresh for batches no graph holds."""
    key = (B, n_items, n_spans, group, width, device)
    if B <= ITEMS_CACHE_MAX_B:
        return SMALL(*key)
    return LARGE(*key) if B <= GRAPH_MAX_B else make_span_items(*key)
