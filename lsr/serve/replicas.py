"""Several devices behind one endpoint: one index replica, query encoder and dynamic batcher per device.

``ReplicaSet.submit`` sends each request to the least-loaded healthy replica (fewest queries submitted and not
yet answered; ties rotate, so an idle server spreads its requests). Every replica searches the same index with
the same code, so a request's answer does not depend on the replica that served it (exact top-k, ties by doc
index).

A replica whose batch overruns the batch deadline (``DynamicBatcher``'s ``batch_timeout_s``: a hung device)
leaves the dispatch at once: that batch's requests and those queued on it are sent to another replica, and
when no replica is left they fail with ``Unavailable`` (the server answers 503). Unlike a failed replica it
comes back when its device thread returns; a hung last replica leaves the dispatch too (``status`` is then
"unavailable"). ``LSR_SERVE_FAULT`` (``lsr.serve.faults``) makes replicas hang for tests and drills.

A replica that fails a request which another replica then answers is broken (a lost device, a failed kernel):
it marks itself unhealthy with the error and gets no more requests, and the request is answered by the other.
A request that fails on every healthy replica is the request's own fault: the caller gets its error and every
replica stays healthy (one bad request cannot take the server down). The last healthy replica is never marked:
its failures go to their callers (HTTP 500), as with one device. A replica marked unhealthy stays out until the
server restarts.

All replicas live in one process (their device threads share the interpreter lock with the event loop):
docs/performance/serve.md measures what that costs against one process per GPU.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lsr.serve.batcher import LATENCY_WINDOW, BatchStats, ClientGone, DeviceHung, DynamicBatcher
from lsr.serve.faults import Hang, hangs_from_env

__all__ = ["DEVICES_HELP", "Replica", "ReplicaSet", "Unavailable", "combined_stats", "device_context",
           "parse_devices", "visible_devices"]

log = logging.getLogger(__name__)
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
DEVICES_HELP = "a comma-separated list of cpu | cuda | cuda:N (e.g. cuda:0,cuda:1), or all (every visible GPU)"


def parse_devices(text: str | Sequence[str]) -> list[str]:
    """``"cuda:0,cuda:1"`` / ``["cpu", "cpu"]`` / ``"all"`` -> the replicas' device names, checked without
    touching a GPU: one-line ValueError for a malformed name, an empty list or a GPU named twice ("cpu" may
    repeat: several CPU replicas). ``"all"`` is resolved by ``visible_devices``."""
    names = [d.strip() for d in text.split(",")] if isinstance(text, str) else [str(d).strip() for d in text]
    if names == ["all"]:
        return names
    if not names or not all(names):
        raise ValueError(f"--devices {','.join(names)!r} has an empty entry; use {DEVICES_HELP}")
    bad = next((d for d in names if not _DEVICE.fullmatch(d)), None)
    if bad is not None:
        raise ValueError(f"--devices: unknown device {bad!r}; use {DEVICES_HELP}")
    gpus = ["cuda:0" if d == "cuda" else d for d in names if d != "cpu"]
    twice = next((d for i, d in enumerate(gpus) if d in gpus[:i]), None)
    if twice is not None:
        raise ValueError(f"--devices names {twice} twice; give each GPU once (one replica per GPU)")
    return ["cuda:0" if d == "cuda" else d for d in names]


def visible_devices(names: list[str]) -> list[str]:
    """``parse_devices``' names with ``all`` expanded to every visible GPU; a one-line RuntimeError for a GPU that
    this machine does not have."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if names == ["all"]:
        if count == 0:
            raise RuntimeError("--devices all: no CUDA GPU is visible; name the devices (e.g. --devices cpu)")
        return [f"cuda:{i}" for i in range(count)]
    missing = next((d for d in names if d.startswith("cuda") and int(d.split(":")[1]) >= count), None)
    if missing is not None:
        raise RuntimeError(f"--devices: {missing} is not visible (this machine shows {count} CUDA GPUs)")
    return names


def device_context(device: str) -> contextlib.AbstractContextManager:
    """``device`` made the current CUDA device for the block (kernels and graph captures run on the current
    one); nothing for the CPU."""
    if not device.startswith("cuda"):
        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(torch.device(device))


class Unavailable(RuntimeError):
    """No replica can take the request now: every one is hung (past its batch deadline) or has failed it."""


@dataclass
class Replica:
    """One device's engine and batcher, with its health and the queries it has in flight."""

    number: int
    device: str
    engine: Any
    batcher: DynamicBatcher
    healthy: bool = True
    error: str | None = None
    in_flight: int = 0            # queries submitted to this replica and not answered yet
    failed_at: float | None = None

    @property
    def serving(self) -> bool:
        """Whether it takes requests: not failed, and no batch past its deadline."""
        return self.healthy and self.batcher.hung is None

    def describe(self) -> dict[str, Any]:
        """/health's entry: device, whether it takes requests, whether it is hung, its queue and the error that
        stopped it (or what overruns the batch deadline)."""
        hung = self.batcher.hung
        return {"replica": self.number, "device": self.device, "ready": self.serving, "healthy": self.serving,
                "hung": hung is not None, "queue_depth": self.batcher.queue_depth,
                "in_flight_queries": self.in_flight, "error": self.error or hung}


@dataclass
class ReplicaSet:
    """The replicas of one server and the dispatch between them (see the module doc)."""

    replicas: list[Replica]
    _turn: int = field(default=0, repr=False)
    _release: threading.Event = field(default_factory=threading.Event, repr=False)  # ends LSR_SERVE_FAULT hangs

    @classmethod
    def start(cls, devices: Sequence[str], make_engine: Callable[[str], Any],
              make_batcher: Callable[[Any], DynamicBatcher]) -> ReplicaSet:
        """Build (and warm up, as ``make_engine`` does) one replica per device, one after the other: CUDA graph
        capture on one GPU must not overlap work on another. A replica that cannot start stops the server with
        an error naming its device (better than serving on fewer GPUs than asked for). ``LSR_SERVE_FAULT``'s hangs
        (``lsr.serve.faults``) are applied to the batchers here."""
        hangs, release = hangs_from_env(len(devices)), threading.Event()   # a bad value: before anything loads
        replicas = []
        for number, device in enumerate(devices):
            try:
                with device_context(device):
                    engine = make_engine(device)
            except Exception as e:  # the replicas started so far hold no thread yet: dropping them frees them
                if len(devices) == 1:
                    raise
                raise _renamed(e, f"replica {number} on {device} did not start: {e}") from e
            batcher = make_batcher(engine)
            if number in hangs:
                log.warning("LSR_SERVE_FAULT: replica %d on %s hangs in every batch", number, device)
                batcher.process = Hang(batcher.process, hangs[number], release)
            replicas.append(Replica(number, str(engine.searcher.device), engine, batcher))
        return cls(replicas, _release=release)

    @property
    def first(self) -> Replica:
        return self.replicas[0]

    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas if r.healthy]

    def pick(self, exclude: Sequence[Replica] = ()) -> Replica | None:
        """The serving replica (not in ``exclude``) with the fewest queries in flight; ties go round in turn."""
        n = len(self.replicas)
        start, self._turn = self._turn, (self._turn + 1) % n
        candidates = [r for r in self.replicas if r.serving and r not in exclude]
        if not candidates:
            return None
        return min(candidates, key=lambda r: (r.in_flight, (r.number - start) % n))

    async def submit(self, item: Any, size: int = 1, gone: Callable[[], bool] | None = None) -> Any:
        """The item's result from the least-loaded serving replica; where a replica fails it, the next one (and
        the failed replica, once another answered, is marked unhealthy); where a replica hangs (DeviceHung), the
        next one. The last error where every healthy replica failed; ``Unavailable`` where none is left to try
        and no replica failed it (all hung); ``ClientGone`` as the batcher raises it."""
        failed: list[tuple[Replica, Exception]] = []
        while True:
            replica = self.pick(exclude=[r for r, _ in failed])
            if replica is None:
                errors = [e for _, e in failed if not isinstance(e, DeviceHung)]
                if errors:   # every replica that ran it failed it (the last healthy one is never marked)
                    raise errors[-1]
                raise Unavailable(self._why_unavailable())
            replica.in_flight += size
            try:
                result = await replica.batcher.submit(item, size, gone)
            except ClientGone:
                raise
            except Exception as e:  # noqa: BLE001 - tried on the next replica; raised if all fail
                failed.append((replica, e))
                continue
            finally:
                replica.in_flight -= size
            for broken, error in failed:  # they failed what this one answered: the replica is at fault
                if not isinstance(error, DeviceHung):   # a hung one is out of dispatch until it returns
                    self.mark_unhealthy(broken, error)
            return result

    def _why_unavailable(self) -> str:
        why = [f"replica {r.number} on {r.device}: {r.error or r.batcher.hung or 'it hung on this request'}"
               for r in self.replicas]
        return "no replica can take the request (" + "; ".join(why) + ")"

    def mark_unhealthy(self, replica: Replica, error: Exception) -> None:
        """Take ``replica`` out of the dispatch with ``error`` as the reason (never the last healthy one)."""
        if replica.healthy and len(self.healthy()) > 1:
            replica.healthy, replica.failed_at = False, time.time()
            replica.error = " ".join(f"{type(error).__name__}: {error}".split())
            log.error("replica %d on %s is unhealthy and gets no more requests: %s",
                                              replica.number, replica.device, replica.error)

    def status(self) -> str:
        """"ok" (every replica serves), "degraded" (some have failed or hang; at least one serves) or
        "unavailable" (none serves: every one hangs)."""
        serving = sum(r.serving for r in self.replicas)
        return "ok" if serving == len(self.replicas) else "degraded" if serving else "unavailable"

    def stats(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The totals over every replica (``BatchStats.as_dict`` keys plus the summed queue depth) and each
        replica's own counters, device and health."""
        totals = combined_stats([r.batcher.stats for r in self.replicas]).as_dict()
        totals["queue_depth"] = sum(r.batcher.queue_depth for r in self.replicas)
        per = [{**r.describe(), **r.batcher.stats.as_dict()} for r in self.replicas]
        return totals, per

    async def close(self) -> None:
        self._release.set()   # LSR_SERVE_FAULT's hangs end: their threads return
        for r in self.replicas:
            await r.batcher.close()


def _renamed(error: Exception, message: str) -> Exception:
    """``error``'s type with ``message`` (the CLI maps the type to its exit code), or a RuntimeError where the type
    cannot be built from one message."""
    try:
        return type(error)(message)
    except Exception:  # noqa: BLE001 - a type with another constructor
        return RuntimeError(message)


def combined_stats(parts: Sequence[BatchStats]) -> BatchStats:
    """One ``BatchStats`` over several batchers: counts and times summed, the latency windows pooled (the
    quantiles of every replica's recent requests), uptime from the earliest start."""
    out = BatchStats(latencies_ms=deque(maxlen=LATENCY_WINDOW * max(1, len(parts))))
    for s in parts:
        out.requests += s.requests
        out.queries += s.queries
        out.batches += s.batches
        out.errors += s.errors
        out.dropped += s.dropped
        out.max_batch_seen = max(out.max_batch_seen, s.max_batch_seen)
        out.busy_s += s.busy_s
        out.latencies_ms.extend(s.latencies_ms)
        out.started = min(out.started, s.started)
        out.stage_batches += s.stage_batches
        for key, ms in dict(s.stage_ms).items():
            out.stage_ms[key] = out.stage_ms.get(key, 0.0) + ms
    return out

