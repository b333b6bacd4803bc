"""The allowed values of the server's batching and deadline options, shared by ``lsr serve``'s flags and
``create_app`` (a light module: the command line imports it without FastAPI or torch)."""

from __future__ import annotations

from lsr.utils.ranges import NumberRange

__all__ = ["BATCH_TIMEOUT_S", "MAX_BATCH", "MAX_WAIT_MS", "REQUEST_TIMEOUT_S", "SWITCH_INTERVAL_MS",
           "check_batching", "check_deadlines"]

MAX_BATCH = NumberRange(int, 1, 65536)
"""Queries searched together: warm-up searches every batch size up to it, so it stays within device memory."""
MAX_WAIT_MS = NumberRange(float, 0, 60_000)
"""How long a batch waits for more requests: beyond a minute every lone request would wait that long."""
SWITCH_INTERVAL_MS = NumberRange(float, 0, 1000, low_open=True)
"""The interpreter's thread switch interval (``sys.setswitchinterval``)."""
REQUEST_TIMEOUT_S = NumberRange(float, 0, 3600, low_open=True)
"""How long a request may wait for its answer (its body having arrived): past it the client gets 503."""
BATCH_TIMEOUT_S = NumberRange(float, 0, 3600, low_open=True)
"""How long one batch may run on a replica's device before the replica counts as hung and leaves the dispatch."""


def _check(*checks: tuple[str, object, NumberRange]) -> None:
    for name, value, allowed in checks:
        why = allowed.problem(value)
        if why is not None:
            raise ValueError(f"{name} {why}")


def check_batching(max_batch: int, max_wait_ms: float) -> None:
    """ValueError naming the argument, value and range for a ``max_batch`` / ``max_wait_ms`` outside theirs."""
    _check(("max_batch", max_batch, MAX_BATCH), ("max_wait_ms", max_wait_ms, MAX_WAIT_MS))


def check_deadlines(request_timeout_s: float, batch_timeout_s: float | None) -> None:
    """ValueError naming the argument, value and range for a deadline outside its range (None: no batch
    deadline)."""
    _check(("request_timeout_s", request_timeout_s, REQUEST_TIMEOUT_S),
           *([("batch_timeout_s", batch_timeout_s, BATCH_TIMEOUT_S)] if batch_timeout_s is not None else []))
