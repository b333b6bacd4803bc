"""Python's garbage collector in a server: freeze what warm-up left alive, and count the pauses.

A full (generation 2) collection walks every tracked object of the process: with torch, transformers and an
index loaded, hundreds of thousands of them, long enough to stall every request in flight (docs/performance/serve.md).
``gc.freeze()`` after warm-up moves those objects to a permanent generation that collections skip,
so a full collection during serving walks only what was created since. ``GcWatch`` records every collection's pause by generation for ``/stats``.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["GcWatch", "frozen"]


_FREEZE_LOCK = threading.Lock()
_FREEZING = [False]   # a frozen() block of this process is active


@contextmanager
def frozen(enabled: bool = True) -> Iterator[bool]:
    """Collect, then freeze every object alive (after warm-up: the server's long-lived state) for the ``with``
    block, and unfreeze everything after it; yields whether this block froze. A block inside another one of
    this process (a server and its load generator in one process) leaves the outer freeze as it is.

    Objects frozen by others do not stop the freeze: Python 3.12 starts with a few hundred objects in the
    permanent generation, which a check of ``gc.get_freeze_count() == 0`` would take for another user, so the
    server would never freeze.
    """
    with _FREEZE_LOCK:
        mine = enabled and not _FREEZING[0]
        if mine:
            gc.collect()   # (an interrupt here leaves nothing marked: a later block still freezes)
            gc.freeze()
            _FREEZING[0] = True
    try:
        yield mine
    finally:
        if mine:
            with _FREEZE_LOCK:
                gc.unfreeze()
                _FREEZING[0] = False


class GcWatch:
    """Collections and their pauses (ms) per generation, from ``gc.callbacks``, until ``close()``."""

    def __init__(self) -> None:
        # re-entrant: a collection can start inside as_dict (it allocates) and call _on_gc on this thread
        self._lock = threading.RLock()
        self._start: float | None = None
        self.collections = [0, 0, 0]
        self.pause_ms = [0.0, 0.0, 0.0]
        self.max_pause_ms = [0.0, 0.0, 0.0]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        if self._start is None:
            return
        ms = (time.perf_counter() - self._start) * 1000
        g = min(int(info.get("generation", 2)), 2)
        with self._lock:
            self.collections[g] += 1
            self.pause_ms[g] += ms
            self.max_pause_ms[g] = max(self.max_pause_ms[g], ms)

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"collections": list(self.collections), "pause_ms": [round(x, 3) for x in self.pause_ms],
                    "max_pause_ms": [round(x, 3) for x in self.max_pause_ms], "frozen": gc.get_freeze_count()}

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
