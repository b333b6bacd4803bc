"""The one CUDA-graph capture of lsr: search chunks, query-encoder buckets and training steps capture through it.

    graph, out = capture_graph(lambda: body(buf), device, pool=pool)   # warm-up, then capture
    graph.replay()                                                     # out is refreshed in place

What it takes care of, so that no caller does it its own way:

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
* **A failed capture leaves the process usable.** A capture registers the device's default CUDA generator,
  which then counts random offsets for the graph; when the capture fails (a host sync in the body, an
  unsupported operation), ``capture_end`` raises before it hands the generator back, and every later random
  draw on that device (``nn.Linear(..., device="cuda")``, dropout) fails with "Offset increment outside graph
  capture encountered unexpectedly". The generator's state is saved before the capture and put back after a
  failure, so the caller's eager fall-back and everything after it draw the same numbers as if no capture had
  been tried.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["GraphCaptureError", "capture_graph"]

T = TypeVar("T")

_STREAMS: dict[int, torch.cuda.Stream] = {}   # device index -> its capture stream
_LOCKS: dict[int, threading.Lock] = {}        # device index -> one capture at a time on that stream
_BOOK = threading.Lock()


class GraphCaptureError(RuntimeError):
    """A CUDA-graph capture failed; the message says why. The process can go on eagerly."""


def capture_graph(body: Callable[[], T], device: torch.device | str, *, pool: Any = None,
                  warm_up: bool = True) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture ``body()`` as a CUDA graph on a stream of ``device``; returns the graph and the body's outputs
    (static tensors that each ``graph.replay()`` refreshes).

    ``warm_up`` runs the body once eagerly first, on the same stream, so that every kernel is compiled and tuned
    outside the capture. ``pool`` is a ``torch.cuda.graph_pool_handle()`` shared by graphs that never run at
    once. Raises ``GraphCaptureError`` (the CUDA generator restored, no capture left open) when the capture fails.
    """
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    side, lock = _capture_stream(index)
    with lock:
        return _capture_on(side, body, torch.device("cuda", index), pool, warm_up)


def _capture_stream(index: int) -> tuple[torch.cuda.Stream, threading.Lock]:
    with _BOOK:
        if index not in _STREAMS:
            _STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index))
            _LOCKS[index] = threading.Lock()
        return _STREAMS[index], _LOCKS[index]


def _capture_on(side: torch.cuda.Stream, body: Callable[[], T], device: torch.device, pool: Any,
                warm_up: bool) -> tuple[torch.cuda.CUDAGraph, T]:
    main = torch.cuda.current_stream(device)
    side.wait_stream(main)
    generator = torch.cuda.default_generators[device.index]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        if warm_up:
            body()
        saved = generator.clone_state()   # what the generator was before the capture registered it
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            out = body()
        except BaseException as e:
            _abandon(graph, generator, saved)
            if isinstance(e, Exception):
                raise GraphCaptureError(f"CUDA graph capture failed: {' '.join(str(e).split())}") from e
            raise
        try:
            graph.capture_end()
        except RuntimeError as e:   # the capture was invalidated (a host sync in the body, say)
            generator.graphsafe_set_state(saved)
            raise GraphCaptureError(f"CUDA graph capture failed: {' '.join(str(e).split())}") from e
    main.wait_stream(side)
    return graph, out


def _abandon(graph: torch.cuda.CUDAGraph, generator: torch.Generator, saved: torch.Generator) -> None:
    """End a capture whose body raised (its error is the one to report) and hand the generator its old state."""
    with contextlib.suppress(RuntimeError):
        graph.capture_end()
    generator.graphsafe_set_state(saved)
