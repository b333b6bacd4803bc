"""CPU seconds of this process's Python threads, grouped by thread name: how busy a server's event loop and its
device threads were during a load level (``scripts/bench_serve.py``).

The event loop runs Python (HTTP parsing, JSON, dispatch) and holds the interpreter lock the whole time it
is busy: its CPU seconds per request bound what one process can answer, however many GPUs it drives
(docs/performance/serve.md).
"""

from __future__ import annotations

import threading
import time

__all__ = ["thread_cpu_seconds"]


def thread_cpu_seconds(groups: dict[str, str]) -> dict[str, float]:
    """CPU seconds so far of the live threads whose name starts with each group's prefix, summed per group
    (``{"loop": "uvicorn", "device": "lsr-serve_"}``), and ``"process"``: the whole process (every native
    thread too). Threads that ended are not counted: call it around a span in which they all live."""
    out = {name: 0.0 for name in groups}
    for thread in threading.enumerate():
        for name, prefix in groups.items():
            if thread.name.startswith(prefix) and thread.ident is not None:
                try:
                    out[name] += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                except (OSError, AttributeError):   # the thread ended meanwhile, or no such clock here
                    pass
    out["process"] = time.process_time()
    return out
