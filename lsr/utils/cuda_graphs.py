"""The one CUDA-graph utility of lsr: search chunks, query-encoder buckets and training steps capture through it.

    graph, out = capture_graph(lambda: body(buf), device, pool=pool)   # warm-up, then capture
    graph.replay()                                                     # out is refreshed in place

    graphs = GraphSet(failure_memory("search.block_graphs", ...), GraphPolicy(max_graphs=32, max_bytes=1 << 29))
    graph = graphs.lookup(key, lambda pool: Captured(..., pool=pool), defer=B > 64)   # None: run eagerly

``capture_graph`` takes care of, so that no caller does it its own way:

* **One capture stream per device.** ``torch.cuda.graph``'s default capture stream is one per process, made on
  the device of the first capture; capturing another GPU's work on it fails (serving replicas on several GPUs, a
  searcher on ``cuda:1`` after one on ``cuda:0``). Each device gets one stream of its own, kept for the process,
  and one capture at a time runs on it: graphs that share a memory pool reuse each other's freed blocks only
  when they were captured on the same stream (the allocator hands a block back only to its own stream), so a
  new stream per capture made a shared pool hold as much as private pools. The capture stream first waits for
  the device's current stream, and the current stream waits for it afterwards.
* **Thread-local capture errors.** Other threads may use their GPUs meanwhile (serving replicas are threads of
  one process); the ``global`` mode would fail their calls while this one captures.
* **No device sync and no cache flush.** ``torch.cuda.graph`` synchronises the device and empties the
  allocator's caches before every capture; dozens of buckets are captured at a server's warm-up.
* **A failed capture leaves the process usable** (``_recover``). torch's ``capture_begin`` marks the device's
  default CUDA generator "capturing" before it starts the capture, and only a ``capture_end`` that completes
  clears the mark; while it is set, every random draw outside a capture on that device (``nn.Linear(...,
  device="cuda")``, dropout) and every replay of a graph captured earlier fails with "Offset increment outside
  graph capture encountered unexpectedly". ``capture_end`` also stops the allocator's recording into the graph's
  pool only when it completes: left recording, the next capture into a shared pool fails in ``capture_begin``
  ("already recording to mempool_id"), after marking the generator again. So where ``capture_begin``, the body
  or ``capture_end`` raises, the recording into the pool is ended and one tiny capture is made that completes,
  which clears the mark on the generator's own state (graphs captured earlier hold that state object; draws
  inside a capture never move its offset, so the draws after are those of a process that tried no capture).

``GraphSet`` is what each owner keeps: its graphs by key, least recently used first, within a count and a byte
bound (``GraphPolicy``); one memory pool and one lock for all of them where the policy shares the pool (a caller
replays a graph and copies what it keeps under that lock, so no graph's memory is read after another graph of
the set ran: one pool holds a fraction of what private pools hold); capture at a key's first use, or at its second
(``defer``: a large batch whose first search runs eagerly) and never again once its graph was dropped; a failed
capture runs eagerly from then on, recorded in the owner's failure memory (``lsr.utils.runtime``: warned once,
listed by ``lsr doctor`` and ``--explain``).

Not handled, because torch decides it: before torch 2.13 the "capturing" mark is one per device and process, so
a random draw in *another* thread on the same device while a capture runs fails with the same message (a
training step's dropout beside a server thread capturing its warm-up graphs). Capture at warm-up, before such
threads draw.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from lsr.utils.runtime import FailureMemory, per_device

__all__ = ["GraphCaptureError", "GraphPolicy", "GraphSet", "capture_graph", "captures", "trim_graphs"]

T = TypeVar("T")
G = TypeVar("G")

_CAPTURES: Counter[str] = Counter()   # failure-memory name of a set -> captures tried in this process
_COUNT_LOCK = threading.Lock()


class GraphCaptureError(RuntimeError):
    """A CUDA-graph capture failed; the message says why. The process can go on eagerly."""


def capture_graph(body: Callable[[], T], device: torch.device | str, *, pool: Any = None,
                  warm_up: bool = True) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture ``body()`` as a CUDA graph on a stream of ``device``; returns the graph and the body's outputs
    (static tensors that each ``graph.replay()`` refreshes).

    ``warm_up`` runs the body once eagerly first, on the same stream, so that every kernel is compiled and tuned
    outside the capture. ``pool`` is a ``torch.cuda.graph_pool_handle()`` shared by graphs that never run at
    once (None: a pool of the graph's own). Raises ``GraphCaptureError`` when the capture fails, with the CUDA
    generator and the allocator as before it (see the module doc); a device that is not CUDA is such a failure.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise GraphCaptureError(f"CUDA graphs need a CUDA device, got {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    side, lock = per_device("cuda_graphs.capture_stream", index,
                            lambda: (torch.cuda.Stream(torch.device("cuda", index)), threading.Lock()))
    with lock:
        return _capture_on(side, body, torch.device("cuda", index), pool, warm_up)


def _capture_on(side: torch.cuda.Stream, body: Callable[[], T], device: torch.device, pool: Any,
                warm_up: bool) -> tuple[torch.cuda.CUDAGraph, T]:
    main = torch.cuda.current_stream(device)
    side.wait_stream(main)
    # an explicit pool, also for a graph of its own: a failed capture must end the allocator's recording into it
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        if warm_up:
            body()
        try:
            out = _record(graph, body, pool)
        except BaseException as e:
            _recover(device, pool)
            if isinstance(e, Exception):
                raise GraphCaptureError(f"CUDA graph capture failed: {' '.join(str(e).split())}") from e
            raise
    main.wait_stream(side)
    return graph, out


def _record(graph: torch.cuda.CUDAGraph, body: Callable[[], T], pool: Any) -> T:
    graph.capture_begin(pool=pool, capture_error_mode="thread_local")
    try:
        out = body()
    except BaseException:
        with contextlib.suppress(RuntimeError):   # (the body's error is the one to report)
            graph.capture_end()
        raise
    graph.capture_end()   # raises where the capture was invalidated (a host sync in the body, say)
    return out


def _recover(device: torch.device, pool: Any) -> None:
    """Undo what a capture that raised leaves behind (the module doc): the allocator's recording into ``pool`` and
    the "capturing" mark on the device's default CUDA generator."""
    end_recording = getattr(torch._C, "_cuda_endAllocateToPool", None)   # (a private torch binding: optional)
    if end_recording is not None:
        with contextlib.suppress(RuntimeError):   # not recording: capture_end got that far, or capture_begin did not
            end_recording(device.index, pool)
    try:
        _clear_generator_mark(device)
    except RuntimeError as e:  # the device itself is broken: say so, the caller's error is the one raised
        warnings.warn(f"after a failed CUDA graph capture the CUDA generator of {device} could not be reset "
                      f"({' '.join(str(e).split())}); random draws on it may fail", RuntimeWarning, stacklevel=4)


def _clear_generator_mark(device: torch.device) -> None:
    """One capture of one kernel that completes: its ``capture_begin`` marks the default generator's state capturing
    (again) and its ``capture_end`` clears the mark, on the same state object; no draw happens, no offset moves."""
    scratch = torch.zeros(1, device=device)
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(capture_error_mode="thread_local")
    try:
        scratch.add_(1)   # (one node: torch warns about an empty graph)
    finally:
        graph.capture_end()


def captures(name: str) -> int:
    """Captures tried in this process by the graph sets of failure memory ``name`` (a server's count after its
    warm-up should not grow)."""
    with _COUNT_LOCK:
        return _CAPTURES[name]


def trim_graphs(graphs: OrderedDict[Hashable, Any], max_graphs: int | None, max_bytes: int | None) -> None:
    """Drop the least recently used graphs (first in ``graphs``) while more than ``max_graphs`` are kept or they
    hold more than ``max_bytes`` (``bytes``; None entries, failed captures, hold none); the newest stays.
    None bounds nothing."""
    max_graphs = len(graphs) if max_graphs is None else max_graphs
    max_bytes = float("inf") if max_bytes is None else max_bytes
    held = sum(getattr(g, "bytes", 0) for g in graphs.values())
    while len(graphs) > 1 and (len(graphs) > max_graphs or held > max_bytes):
        _, dropped = graphs.popitem(last=False)
        held -= getattr(dropped, "bytes", 0)


@dataclass(frozen=True)
class GraphPolicy:
    """The bounds and the pool of a ``GraphSet`` (per set, or per lookup where a config decides them per call)."""

    max_graphs: int | None = None   # graphs kept (the least recently used dropped; None: all)
    max_bytes: int | None = None    # memory the kept graphs hold at most, by their ``bytes`` (the newest stays)
    shapes_seen: int = 64           # deferred keys remembered until their second use
    shared_pool: bool = True        # one memory pool and one lock for the set's graphs


class GraphSet(Generic[G]):
    """The CUDA graphs of one owner by key (see the module doc); thread-safe: the bookkeeping runs under its own lock,
    a capture outside it (two threads may then capture one key; the later one is kept).

    ``memory`` records failed captures (their keys run eagerly). A graph is what ``capture(pool)`` returns (pool:
    the set's shared pool, or None for a pool of its own); its ``bytes``, where it has them, count against
    ``max_bytes``."""

    def __init__(self, memory: FailureMemory, policy: GraphPolicy | None = None) -> None:
        self.memory, self.policy = memory, policy or GraphPolicy()
        self.graphs: OrderedDict[Hashable, G | None] = OrderedDict()   # None: its capture failed (run eagerly)
        self.seen: OrderedDict[Hashable, bool] = OrderedDict()          # deferred keys: captured yet?
        self.book = threading.Lock()   # the two dicts above
        self.lock = threading.Lock()   # the shared pool: no graph of it runs while another is captured into it
        self.pool: Any = None

    def __len__(self) -> int:
        return len(self.graphs)

    def __contains__(self, key: Hashable) -> bool:
        """Whether ``key`` was captured (or tried: its entry is then None) and is still kept."""
        return key in self.graphs

    def get(self, key: Hashable) -> G | None:
        """The graph of ``key`` (None: not kept, or its capture failed), without capturing; a use (LRU)."""
        with self.book:
            if key in self.graphs:
                self.graphs.move_to_end(key)
            return self.graphs.get(key)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self.graphs))

    def held(self) -> list[G]:
        """The graphs kept (failed captures left out), least recently used first."""
        with self.book:
            return [g for g in self.graphs.values() if g is not None]

    def clear(self) -> None:
        """Drop every graph (their tensors changed: an optimizer step, a reload); deferred keys are forgotten too."""
        with self.book:
            self.graphs.clear()
            self.seen.clear()

    def lookup(self, key: Hashable, capture: Callable[[Any], G], *, defer: bool = False,
               policy: GraphPolicy | None = None) -> G | None:
        """The graph of ``key``, captured by ``capture`` at its first use (``defer``: its second; the first runs
        eagerly, and once its graph is dropped it runs eagerly from then on: recapturing shapes that evict each
        other from the memory bound would cost a warm-up run and a capture each time). None: run eagerly."""
        policy = policy or self.policy
        with self.book:
            if key in self.graphs:
                self.graphs.move_to_end(key)
                return self.graphs[key]
            if defer and not self._second_use(key, policy):
                return None
        graph = self._capture(capture, policy.shared_pool)
        with self.book:
            self.graphs[key] = graph
            self.graphs.move_to_end(key)
            trim_graphs(self.graphs, policy.max_graphs, policy.max_bytes)   # keeps the newest: this one
            if defer:
                self.seen[key] = True   # captured: once dropped, the key runs eagerly
        return graph

    def _second_use(self, key: Hashable, policy: GraphPolicy) -> bool:
        """Whether a deferred key is captured now (its second use); remembers the first (under ``book``)."""
        captured = self.seen.get(key)   # None: not used yet, False: used once, True: captured before (dropped since)
        if captured is False:
            return True
        self.seen[key] = bool(captured)
        self.seen.move_to_end(key)
        while len(self.seen) > policy.shapes_seen:
            self.seen.popitem(last=False)
        return False

    def _capture(self, capture: Callable[[Any], G], shared: bool) -> G | None:
        with _COUNT_LOCK:
            _CAPTURES[self.memory.name] += 1
        try:
            if not shared:
                return capture(None)
            with self.lock:   # no graph of this pool runs while another is captured into it
                if self.pool is None and torch.cuda.is_available():
                    self.pool = torch.cuda.graph_pool_handle()
                return capture(self.pool)
        except Exception as e:  # noqa: BLE001 - a capture problem must not fail the caller: it runs eagerly
            self.memory.record(e, stacklevel=4)
            return None
