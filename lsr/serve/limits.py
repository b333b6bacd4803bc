"""The allowed values of the server's batching options, shared by ``lsr serve``'s flags and ``create_app``
(a light module: the command line imports it without FastAPI or torch)."""

from __future__ import annotations

from lsr.utils.ranges import NumberRange

__all__ = ["MAX_BATCH", "MAX_WAIT_MS", "SWITCH_INTERVAL_MS", "check_batching"]

MAX_BATCH = NumberRange(int, 1, 65536)
"""Queries searched together: warm-up searches every batch size up to it, so it stays within device memory."""
MAX_WAIT_MS = NumberRange(float, 0, 60_000)
"""How long a batch waits for more requests: beyond a minute every lone request would wait that long."""
SWITCH_INTERVAL_MS = NumberRange(float, 0, 1000, low_open=True)
"""The interpreter's thread switch interval (``sys.setswitchinterval``)."""


def check_batching(max_batch: int, max_wait_ms: float) -> None:
    """ValueError naming the argument, value and range for a ``max_batch`` / ``max_wait_ms`` outside theirs."""
    for name, value, allowed in (("max_batch", max_batch, MAX_BATCH), ("max_wait_ms", max_wait_ms, MAX_WAIT_MS)):
        why = allowed.problem(value)
        if why is not None:
            raise ValueError(f"{name} {why}")
