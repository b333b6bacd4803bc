"""CUDA graphs of the block path: one captured chunk per (batch size, query-length bucket, k, plan).

A small batch spends more time launching the block path's dozen kernels than running them; replaying a
captured graph removes that host cost. Larger batches gain too: between the two passes the host launches ~40
small kernels slower than the GPU runs them, so an eager large batch leaves the GPU idle for part of its time
(graphs up to ``SearchConfig.graphs.max_batch``, the Searcher's batch; the measurements are in
docs/performance/search.md). Graphs are kept per index (a ``GraphCache`` in ``lsr.search.index_cache``), in a
``lsr.utils.cuda_graphs.GraphSet`` whose policy the config gives: at most ``graphs.cache`` graphs and
``graphs.bytes`` of memory they keep by estimate (a large batch's graph keeps its candidate slots), batches above
``graphs.capture_at_once`` queries captured at their shape's second search (``graphs.shapes_seen`` such shapes
remembered), and with ``graphs.shared_pool`` (the default) one memory pool and one lock for the graphs of an
index. ``tests/search/test_graphs.py::test_gpu_block_graphs_share_one_pool``
replays shared-pool graphs in a shuffled order against the eager path.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import torch

from lsr.utils.cuda_graphs import GraphPolicy, GraphSet, capture_graph
from lsr.utils.cuda_graphs import captures as _captures_of
from lsr.utils.runtime import failure_memory

if TYPE_CHECKING:  # pragma: no cover
    from lsr.search.config import GraphTuning

__all__ = ["CAPTURE_FAILED", "ChunkGraph", "GraphCache", "captures"]

ChunkBody = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]

CAPTURE_FAILED = failure_memory("search.block_graphs", "a CUDA graph capture of the block path",
                                "the batches of that shape run eagerly", category=RuntimeWarning)


class ChunkGraph:
    """A chunk body captured once as a CUDA graph for a fixed batch size and query-term buffer; a call
    copies the queries into the graph's input buffers and replays it. The outputs live in the graph's
    memory until the next replay (``lock`` serialises callers, who copy what they keep)."""

    def __init__(self, body: ChunkBody, B: int, n_terms: int, device: torch.device, *, pool: Any = None,
                 lock: threading.Lock | None = None) -> None:
        before = torch.cuda.memory_allocated(device)
        self.indptr = torch.zeros(B + 1, dtype=torch.int64, device=device)
        self.terms = torch.zeros(n_terms, dtype=torch.int32, device=device)
        self.weights = torch.zeros(n_terms, dtype=torch.float32, device=device)
        self.lock = lock or threading.Lock()
        # warm-up (every kernel compiled and tuned outside the capture), then the capture on this device's own stream
        self.graph, self.out = capture_graph(lambda: body(self.indptr, self.terms, self.weights), device, pool=pool)
        # what the graph keeps alive, estimated as the growth of the device's allocated memory over the capture (a
        # concurrent allocation elsewhere skews it; a dropped graph's blocks return to its pool, not the device)
        self.bytes = max(0, torch.cuda.memory_allocated(device) - before)

    def __call__(self, indptr: torch.Tensor, terms: torch.Tensor, weights: torch.Tensor) -> Any:
        n = terms.numel()
        self.indptr.copy_(indptr)
        self.terms[:n].copy_(terms)
        self.weights[:n].copy_(weights)
        self.graph.replay()
        return self.out


@functools.lru_cache(maxsize=64)
def _policy(cfg: GraphTuning) -> GraphPolicy:
    return GraphPolicy(cfg.cache, cfg.bytes, cfg.shapes_seen, cfg.shared_pool)


class GraphCache:
    """The graphs of one index. ``capture`` makes a graph (``ChunkGraph``; tests pass a stand-in to check the
    bookkeeping)."""

    def __init__(self, capture: Callable[..., Any] = ChunkGraph) -> None:
        self.set: GraphSet[Any] = GraphSet(CAPTURE_FAILED)
        self._capture = capture

    @property
    def graphs(self) -> OrderedDict[Hashable, Any]:
        """Key -> graph (None: its capture failed), least recently used first."""
        return self.set.graphs

    @property
    def lock(self) -> threading.Lock:
        return self.set.lock

    @property
    def pool(self) -> Any:
        return self.set.pool

    def lookup(self, body: ChunkBody, B: int, n_terms: int, key: Hashable, cfg: GraphTuning,
               device: torch.device) -> Any:
        """The cached graph for ``key``; None where the caller runs eagerly: the first search of a batch above
        ``cfg.capture_at_once`` queries, every later one whose graph was captured once and dropped since, and
        every search with a key whose capture failed."""
        policy = _policy(cfg)
        lock = self.set.lock if policy.shared_pool else None

        def capture(pool: Any) -> Any:
            return self._capture(body, B, n_terms, device, pool=pool, lock=lock)

        return self.set.lookup(key, capture, defer=B > cfg.capture_at_once, policy=policy)


def captures() -> int:
    """Block-path graphs captured (or tried) in this process: a server's count after warm-up should not grow."""
    return _captures_of(CAPTURE_FAILED.name)
