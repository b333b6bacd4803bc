"""The server's fault hook for tests and drills: ``LSR_SERVE_FAULT`` makes replicas' devices hang.

``LSR_SERVE_FAULT=hang:N`` blocks replica N's device thread in every batch it is given, until the server stops
(as a hung GPU would); ``hang:N:SECONDS`` blocks each batch for SECONDS, then runs it (a device that stalls and
comes back). Entries are comma-separated (``hang:0,hang:2:1.5``); replicas count from 0 in ``--devices`` order
(a one-device server is replica 0). The variable is read here only, when the replicas start
(``lsr.serve.replicas.ReplicaSet.start``); unset, nothing changes. It exercises the batch and request
deadlines (``lsr serve --batch-timeout / --request-timeout``) without a broken device.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FAULT_ENV", "Hang", "hangs_from_env"]

FAULT_ENV = "LSR_SERVE_FAULT"
_FORMAT = "hang:N or hang:N:SECONDS (replica N's device hangs in every batch), comma-separated"


def hangs_from_env(n_replicas: int, env: Mapping[str, str] | None = None) -> dict[int, float | None]:
    """``LSR_SERVE_FAULT``'s hangs: replica number -> seconds per batch (None: until the server stops); {} when
    unset. A one-line ValueError naming the variable, the entry and the format for anything else."""
    text = (os.environ if env is None else env).get(FAULT_ENV, "").strip()
    hangs: dict[int, float | None] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        parts = entry.split(":")
        try:
            if parts[0] != "hang" or len(parts) not in (2, 3):
                raise ValueError
            number = int(parts[1])
            seconds = float(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise ValueError(f"{FAULT_ENV}={text!r}: {entry!r} is not {_FORMAT}; unset {FAULT_ENV} to serve "
                             "without faults") from None
        if not 0 <= number < n_replicas:
            raise ValueError(f"{FAULT_ENV}={text!r} names replica {number}; this server has replicas 0 to "
                             f"{n_replicas - 1}")
        if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"{FAULT_ENV}={text!r}: the seconds of {entry!r} must be a finite number >= 0")
        hangs[number] = seconds
    return hangs


class Hang:
    """A batcher's ``process`` that first blocks the device thread: ``seconds`` (None: until ``released``), then
    runs the batch; released (the server stops), the batch fails instead."""

    def __init__(self, process: Callable[[Any], Any], seconds: float | None, released: threading.Event) -> None:
        self.process, self.seconds, self.released = process, seconds, released

    def __call__(self, batch: Any) -> Any:
        if self.released.wait(self.seconds):
            raise RuntimeError(f"the server is stopping ({FAULT_ENV} held this batch)")
        return self.process(batch)
