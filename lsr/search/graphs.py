"""CUDA graphs of the block path: one captured chunk per (batch size, query-length bucket, k, plan).

A small batch spends more time launching the block path's dozen kernels than running them; replaying a
captured graph removes that host cost. Larger batches gain too: between the two passes the host launches ~40
small kernels slower than the GPU runs them, so an eager 500-query batch leaves the GPU idle for ~1.4 ms of its
~15 ms (graphs up to B = 512, the Searcher's batch: +10% at B = 500, +23-37% at B = 128-250; docs/benchmarks.md,
session 21). Graphs are cached per index, the least recently used dropped beyond GRAPH_CACHE graphs or
GRAPH_BYTES of memory they keep by estimate (a 500-query graph at 8.8M docs keeps ~176 MB: its candidate slots).

With ``SHARED_POOL`` (the default) the graphs of one index share one memory pool and one lock, as
``lsr.encode.splade.query_graphs`` does: safe because a caller replays a graph and copies what it keeps under that
lock, so no graph's memory is read after another graph of the index ran. Twelve graphs of one 8.8M-doc index
(B = 1-64, k = 10 and 1000) held 214 MiB in one pool against 660 MiB in private pools, with the same bits as
the eager path (docs/benchmarks.md, session 15); ``tests/search/test_kernels_search.py::test_gpu_block_graphs_share_one_pool``
replays shared-pool graphs in a shuffled order against the eager path.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex

__all__ = ["CAPTURE_AT_ONCE_B", "GRAPH_BYTES", "GRAPH_CACHE", "GRAPH_MAX_B", "ChunkGraph", "cached_chunk_graph", "captures", "trim_graphs"]

GRAPH_MAX_B = 512              # block path: batches up to this size replay a captured CUDA graph
GRAPH_CACHE = 32               # graphs kept per index (one per batch size x query-length bucket x k); a server's
                               # warm-up captures up to 2 buckets x 10 sizes (lsr.serve.engine.SearchEngine.warmup)
GRAPH_BYTES = 1 << 29          # GPU memory the kept graphs of one index hold at most, by their ``bytes`` estimates
                               # (the newest is always kept)
CAPTURE_AT_ONCE_B = 64         # batches up to this size are captured at their first search, larger ones at their
                               # second (the first runs eagerly): a one-off shape, such as the last batch of a
                               # query set, never pays a capture (a warm-up run and the capture: ~2 batches' time)
SEEN = 64                      # shapes of large batches remembered per index until their second search
SHARED_POOL = True             # one memory pool and one lock for all graphs of an index (module docstring)

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
        main = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):  # compile / autotune every kernel outside the capture
            body(self.indptr, self.terms, self.weights)
        main.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = body(self.indptr, self.terms, self.weights)
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


class _IndexGraphs:
    """The graphs of one index (least recently used first), with the pool and lock they share when
    ``SHARED_POOL`` is on."""

    def __init__(self) -> None:
        self.graphs: OrderedDict[Hashable, ChunkGraph | None] = OrderedDict()
        self.seen: OrderedDict[Hashable, bool] = OrderedDict()   # large-batch shapes: captured yet?
        self.book = threading.Lock()   # the two dicts above
        self.lock = threading.Lock()
        self.pool: Any = None

    def capture(self, body: ChunkBody, B: int, n_terms: int, device: torch.device) -> ChunkGraph:
        _CAPTURES[0] += 1
        if not SHARED_POOL:
            return ChunkGraph(body, B, n_terms, device)
        with self.lock:   # no graph of this pool runs while another is captured into it
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            return ChunkGraph(body, B, n_terms, device, pool=self.pool, lock=self.lock)


_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CAPTURES = [0]


def captures() -> int:
    """Block-path graphs captured (or tried) in this process: a server's count after warm-up should not grow."""
    return _CAPTURES[0]


def cached_chunk_graph(index: InvertedIndex, body: ChunkBody, B: int, n_terms: int, key: Hashable) -> ChunkGraph | None:
    """The cached graph for ``key`` (``trim_graphs`` drops the least recently used); None where the caller runs
    eagerly: the first search of a batch above CAPTURE_AT_ONCE_B queries, every later one whose graph was captured
    once and dropped since (recapturing shapes that evict each other from the memory budget would cost a warm-up
    run and a capture a search), and every search with a key whose capture failed. Safe for several threads: the
    cache's bookkeeping runs under its own lock (a capture, which takes milliseconds, outside it; two threads may
    then capture one key, and the later one is kept)."""
    entry = _GRAPHS.setdefault(index, _IndexGraphs())
    with entry.book:
        if key in entry.graphs:
            entry.graphs.move_to_end(key)
            return entry.graphs[key]
        # a large batch's shape: None = not searched yet, False = searched once (capture now), True = captured before
        captured = entry.seen.get(key) if B > CAPTURE_AT_ONCE_B else False
        if captured is not False:
            entry.seen[key] = bool(captured)
            entry.seen.move_to_end(key)
            while len(entry.seen) > SEEN:
                entry.seen.popitem(last=False)
            return None
    try:
        graph = entry.capture(body, B, n_terms, index.device)
    except Exception as e:  # noqa: BLE001 - a capture problem must not fail the search
        warnings.warn(f"CUDA graph capture of the block path failed ({type(e).__name__}: {e}); "
                      "running it eagerly", RuntimeWarning, stacklevel=3)
        graph = None
    with entry.book:
        entry.graphs[key] = graph
        entry.graphs.move_to_end(key)
        trim_graphs(entry.graphs)   # keeps the newest: this one
        if B > CAPTURE_AT_ONCE_B:
            entry.seen[key] = True   # captured: once dropped, the shape runs eagerly
    return graph


def trim_graphs(graphs: OrderedDict[Hashable, Any]) -> None:
    """Drop the least recently used graphs (first in ``graphs``) while more than GRAPH_CACHE are kept or they
    hold more than GRAPH_BYTES (``bytes``; None entries, failed captures, hold none); the newest stays."""
    held = sum(getattr(g, "bytes", 0) for g in graphs.values())
    while len(graphs) > 1 and (len(graphs) > GRAPH_CACHE or held > GRAPH_BYTES):
        _, dropped = graphs.popitem(last=False)
        held -= getattr(dropped, "bytes", 0)
