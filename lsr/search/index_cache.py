"""What searches keep per index, in one object: plans, work items, CUDA graphs and counts of what ran.

``index_cache(index)`` is the index's ``IndexCache`` (made at its first search, held weakly: it goes with the
index, and nothing in it keeps the index alive); ``clear()`` drops everything it holds. Its bounds come from the
``SearchConfig`` of each search (``caches.*``, ``graphs.*``).

``ran`` counts what the executors actually ran, step by step (the route, the span scorer's launches, pass 2 exact
or coarse, the rescoring kernel, replayed or eager chunks), in the step names ``--explain`` prints: a test or a
server can check that what ran is what the plan said.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from lsr.search.graphs import GraphCache
from lsr.search.work_items import ItemsCache, make_span_items

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from lsr.index.inverted import InvertedIndex
    from lsr.search.config import CacheTuning

__all__ = ["IndexCache", "RunCounts", "index_cache"]


class RunCounts:
    """How often each (step, choice) ran, e.g. ("span scorer", "triton"): 3 (safe for several threads)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def note(self, step: str, choice: str) -> None:
        with self._lock:
            self._counts[step, choice] += 1

    def choices(self, step: str) -> dict[str, int]:
        """{choice: times it ran} of ``step``."""
        with self._lock:
            return {c: n for (s, c), n in self._counts.items() if s == step}

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


class IndexCache:
    """The plans (least recently used first), work items, graphs and run counts of one index."""

    def __init__(self) -> None:
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()
        self._subsets: OrderedDict[Hashable, Any] = OrderedDict()
        self._docnos: Any = None   # pyarrow.Array of the docnos, once a filter needs them
        self._lock = threading.Lock()
        self.items_small = ItemsCache()   # work items of batches up to caches.items_max_batch
        self.items_large = ItemsCache()   # ... and of larger ones up to graphs.max_batch
        self.graphs = GraphCache()
        self.ran = RunCounts()

    def plan(self, key: Hashable, make: Callable[[], Any], size: int) -> Any:
        """The plan cached for ``key``, else ``make()``'s, kept with at most ``size`` plans (``caches.plans``)."""
        return self._lru(self._plans, key, make, size)

    def subset(self, key: Hashable, make: Callable[[], Any], size: int) -> Any:
        """The index of a filter's allowed documents cached for ``key`` (``lsr.search.filtered``), else ``make()``'s,
        kept with at most ``size`` of them (``filters.subset_cache``)."""
        return self._lru(self._subsets, key, make, size)

    def docno_array(self, docnos: list[str]) -> Any:
        """The index's docnos as one Arrow array (what filters are resolved against), made once."""
        if self._docnos is None:
            import pyarrow as pa

            self._docnos = pa.array(docnos, type=pa.large_string())
        return self._docnos

    def _lru(self, store: OrderedDict[Hashable, Any], key: Hashable, make: Callable[[], Any], size: int) -> Any:
        with self._lock:
            value = store.get(key)
            if value is not None:
                store.move_to_end(key)
                return value
        value = make()
        with self._lock:
            store[key] = value
            while len(store) > size:
                store.popitem(last=False)
        return value

    def work_items(self, caches: CacheTuning, graph_max_batch: int, B: int, n_items: int, n_spans: int, group: int,
                   width: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The work items of one pass (``work_items.make_span_items``): batches up to ``caches.items_max_batch``
        from the small-batch cache, up to ``graph_max_batch`` from the large-batch one (``items_large`` entries of
        up to ``items_large_bytes``), made afresh for batches no graph holds."""
        key = (B, n_items, n_spans, group, width, device)
        if B <= caches.items_max_batch:
            return self.items_small.get(key, caches.items_small)
        if B <= graph_max_batch:
            return self.items_large.get(key, caches.items_large, caches.items_large_bytes)
        return make_span_items(*key)

    def plan_keys(self) -> list[Hashable]:
        """The keys (batch size, k, config, query-length bucket) of the cached plans, least recently used first."""
        with self._lock:
            return list(self._plans)

    def clear(self) -> None:
        """Drop every plan, work item and graph, and the run counts (a graph being replayed finishes first: its
        caller holds it)."""
        with self._lock:
            self._plans.clear()
            self._subsets.clear()
            self._docnos = None
        self.items_small.cache_clear()
        self.items_large.cache_clear()
        self.graphs = GraphCache()
        self.ran.clear()


_CACHES: weakref.WeakKeyDictionary[InvertedIndex, IndexCache] = weakref.WeakKeyDictionary()
_BOOK = threading.Lock()


def index_cache(index: InvertedIndex) -> IndexCache:
    """The cache of ``index`` (made at its first use)."""
    cache = _CACHES.get(index)
    if cache is None:
        with _BOOK:
            cache = _CACHES.setdefault(index, IndexCache())
    return cache
