"""CUDA graphs of the block path: one captured chunk per (batch size, query-length bucket, k, plan).

A small batch spends more time launching the block path's dozen kernels than running them; replaying a
captured graph removes that host cost. Larger batches gain too: between the two passes the host launches ~40
small kernels slower than the GPU runs them, so an eager large batch leaves the GPU idle for part of its time
(graphs up to ``SearchConfig.graphs.max_batch``, the Searcher's batch; the measurements are in
docs/performance/search.md). Graphs are cached per index (a ``GraphCache`` in ``lsr.search.index_cache``), the least
recently used dropped beyond ``graphs.cache`` graphs or ``graphs.bytes`` of memory they keep by estimate (a large
batch's graph keeps its candidate slots).

With ``graphs.shared_pool`` (the default) the graphs of one index share one memory pool and one lock, as
``lsr.encode.splade.query_graphs`` does: safe because a caller replays a graph and copies what it keeps under that
lock, so no graph's memory is read after another graph of the index ran; one pool holds a fraction of what
private pools hold, with the same bits as the eager path (docs/performance/search.md).
``tests/search/test_graphs.py::test_gpu_block_graphs_share_one_pool`` replays shared-pool graphs in a shuffled
order against the eager path.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import torch

from lsr.utils.cuda_graphs import capture_graph

if TYPE_CHECKING:  # pragma: no cover
    from lsr.search.config import GraphTuning

__all__ = ["ChunkGraph", "GraphCache", "captures", "trim_graphs"]

ChunkBody = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]


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


class GraphCache:
    """The graphs of one index (least recently used first), with the pool and lock they share where the config
    asks for one. ``capture`` makes a graph (``ChunkGraph``; tests pass a stand-in to check the bookkeeping)."""

    def __init__(self, capture: Callable[..., Any] = ChunkGraph) -> None:
        self.graphs: OrderedDict[Hashable, Any] = OrderedDict()
        self.seen: OrderedDict[Hashable, bool] = OrderedDict()   # large-batch shapes: captured yet?
        self.book = threading.Lock()   # the two dicts above
        self.lock = threading.Lock()
        self.pool: Any = None
        self._capture = capture

    def capture(self, body: ChunkBody, B: int, n_terms: int, device: torch.device, shared_pool: bool) -> Any:
        _CAPTURES[0] += 1
        if not shared_pool:
            return self._capture(body, B, n_terms, device)
        with self.lock:   # no graph of this pool runs while another is captured into it
            if self.pool is None and self._capture is ChunkGraph:
                self.pool = torch.cuda.graph_pool_handle()
            return self._capture(body, B, n_terms, device, pool=self.pool, lock=self.lock)

    def lookup(self, body: ChunkBody, B: int, n_terms: int, key: Hashable, cfg: GraphTuning,
               device: torch.device) -> Any:
        """The cached graph for ``key`` (``trim_graphs`` drops the least recently used); None where the caller runs
        eagerly: the first search of a batch above ``cfg.capture_at_once`` queries, every later one whose
        graph was captured once and dropped since (recapturing shapes that evict each other from the memory budget
        would cost a warm-up run and a capture a search), and every search with a key whose capture failed. Safe
        for several threads: the bookkeeping runs under its own lock (a capture, which takes milliseconds, outside
        it; two threads may then capture one key, and the later one is kept)."""
        large = B > cfg.capture_at_once
        with self.book:
            if key in self.graphs:
                self.graphs.move_to_end(key)
                return self.graphs[key]
            # a large batch's shape: None = not searched yet, False = searched once (capture now), True = captured
            captured = self.seen.get(key) if large else False
            if captured is not False:
                self.seen[key] = bool(captured)
                self.seen.move_to_end(key)
                while len(self.seen) > cfg.shapes_seen:
                    self.seen.popitem(last=False)
                return None
        try:
            graph = self.capture(body, B, n_terms, device, cfg.shared_pool)
        except Exception as e:  # noqa: BLE001 - a capture problem must not fail the search
            warnings.warn(f"CUDA graph capture of the block path failed ({type(e).__name__}: {e}); "
                          "running it eagerly", RuntimeWarning, stacklevel=4)
            graph = None
        with self.book:
            self.graphs[key] = graph
            self.graphs.move_to_end(key)
            trim_graphs(self.graphs, cfg.cache, cfg.bytes)   # keeps the newest: this one
            if large:
                self.seen[key] = True   # captured: once dropped, the shape runs eagerly
        return graph


_CAPTURES = [0]


def captures() -> int:
    """Block-path graphs captured (or tried) in this process: a server's count after warm-up should not grow."""
    return _CAPTURES[0]


def trim_graphs(graphs: OrderedDict[Hashable, Any], max_graphs: int, max_bytes: int) -> None:
    """Drop the least recently used graphs (first in ``graphs``) while more than ``max_graphs`` are kept or they
    hold more than ``max_bytes`` (``bytes``; None entries, failed captures, hold none); the newest stays."""
    held = sum(getattr(g, "bytes", 0) for g in graphs.values())
    while len(graphs) > 1 and (len(graphs) > max_graphs or held > max_bytes):
        _, dropped = graphs.popitem(last=False)
        held -= getattr(dropped, "bytes", 0)
