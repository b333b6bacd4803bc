"""Dynamic batching: concurrent requests share one encoder call and one search.

One asyncio worker task owns the device. It waits for a request, then keeps collecting until the batch holds
``max_batch`` queries or ``max_wait_ms`` have passed since the first request arrived (the latency bound), and
runs the batch in a single worker thread so the event loop keeps accepting requests meanwhile; requests that
arrive during a batch form the next one. ``max_batch=1`` turns batching off (one request per device call):
the baseline the benchmark compares with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchStats", "DynamicBatcher"]

log = logging.getLogger(__name__)

LATENCY_WINDOW = 10_000  # requests whose latency the quantiles describe (the most recent ones)


@dataclass
class _Job:
    item: Any
    size: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    """Counters since start: requests, queries, batches, errors, the latency (arrival -> answer) window and
    the time per stage of a batch (mean ms per batch, where the process function reports them)."""

    requests: int = 0
    queries: int = 0
    batches: int = 0
    errors: int = 0
    max_batch_seen: int = 0
    busy_s: float = 0.0
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    started: float = field(default_factory=time.time)
    stage_ms: dict = field(default_factory=dict)  # stage -> total ms over the batches that reported stages
    stage_batches: int = 0

    def record_stages(self, timings: dict[str, float]) -> None:
        """One batch's stage times (ms by stage name, e.g. ``SearchEngine.run_batch``'s ``timings``); called
        by the batch's process function in the worker thread."""
        stage_ms = dict(self.stage_ms)  # replaced whole: /stats reads it from the event loop's thread
        for key, ms in timings.items():
            stage_ms[key.removesuffix("_ms")] = stage_ms.get(key.removesuffix("_ms"), 0.0) + ms
        self.stage_ms, self.stage_batches = stage_ms, self.stage_batches + 1

    def record_batch(self, jobs: Sequence[_Job], busy_s: float, failed: int) -> None:
        now = time.perf_counter()
        self.batches += 1
        self.requests += len(jobs)
        size = sum(j.size for j in jobs)
        self.queries += size
        self.max_batch_seen = max(self.max_batch_seen, size)
        self.busy_s += busy_s
        self.errors += failed
        self.latencies_ms.extend((now - j.arrived) * 1000 for j in jobs)

    def as_dict(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 3)) if lat else (lambda q: None)
        return {"uptime_s": round(time.time() - self.started, 3), "requests": self.requests, "queries": self.queries,
                "batches": self.batches, "errors": self.errors,
                "mean_batch_queries": round(self.queries / self.batches, 3) if self.batches else None,
                "mean_batch_requests": round(self.requests / self.batches, 3) if self.batches else None,
                "max_batch_queries": self.max_batch_seen, "device_busy_s": round(self.busy_s, 3),
                "latency_ms": {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": pick(1.0),
                               "window": len(lat)},
                "stage_ms_mean": {k: round(v / self.stage_batches, 4) for k, v in self.stage_ms.items()},
                "stage_ms_total": {k: round(v, 3) for k, v in self.stage_ms.items()},
                "stage_batches": self.stage_batches}


class DynamicBatcher:
    """Gathers submitted items into batches for ``process(items) -> results`` (same length and order).

    Args:
        process: runs one batch; called in one worker thread, one batch at a time.
        max_batch: most queries per batch (an item larger than this runs alone); 1 = no batching.
        max_wait_ms: longest wait for more items after the first of a batch arrived.
        thread_init: run once in the worker thread (e.g. select the CUDA device).
    """

    def __init__(self, process: Callable[[list[Any]], list[Any]], max_batch: int = 64, max_wait_ms: float = 2.0,
                 thread_init: Callable[[], None] | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.process, self.max_batch, self.max_wait_s = process, int(max_batch), max_wait_ms / 1000
        self.stats = BatchStats()
        self._pending: deque[_Job] = deque()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="lsr-serve", initializer=thread_init)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch (not counting the batch on the device)."""
        return len(self._pending)

    async def submit(self, item: Any, size: int = 1) -> Any:
        """Queue ``item`` (``size`` queries) and wait for its result; the batch's exception if it failed."""
        self._ensure_worker()
        job = _Job(item, size, self._loop.create_future())
        self._pending.append(job)
        self._wakeup.set()
        return await job.future

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            # first request, or a new event loop (test clients start one per session): a worker on this loop
            self._loop, self._wakeup = loop, asyncio.Event()
            self._task = loop.create_task(self._work(), name="lsr-serve-batcher")

    async def _work(self) -> None:
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = await self._gather()
            t0 = time.perf_counter()
            outcomes = await self._run(batch)
            failed = sum(isinstance(o, Exception) for o in outcomes)
            self.stats.record_batch(batch, time.perf_counter() - t0, failed)
            for job, outcome in zip(batch, outcomes):
                if job.future.done():  # a client that went away has cancelled its future
                    continue
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)

    async def _run(self, batch: list[_Job]) -> list[Any]:
        """Results of the batch in the worker thread; where the batch fails, each request alone, so that one
        request the parser let through cannot fail the others (an item's outcome is then its exception)."""
        run = self._loop.run_in_executor
        try:
            return list(await run(self._executor, self.process, [j.item for j in batch]))
        except Exception as e:  # noqa: BLE001 - reported to the requests, the worker goes on
            log.error("a batch of %d requests failed (%s: %s)", len(batch), type(e).__name__, e)
            if len(batch) == 1:
                return [e]
        outcomes: list[Any] = []
        for job in batch:
            try:
                outcomes.extend(await run(self._executor, self.process, [job.item]))
            except Exception as e:  # noqa: BLE001
                outcomes.append(e)
        return outcomes

    async def _gather(self) -> list[_Job]:
        """The next batch: what is queued, then what arrives until the deadline, up to max_batch queries."""
        first = self._pending.popleft()
        batch, n = [first], first.size
        deadline = first.arrived + self.max_wait_s
        while n < self.max_batch:
            if self._pending:
                if n + self._pending[0].size > self.max_batch:
                    break
                job = self._pending.popleft()
                batch.append(job)
                n += job.size
                continue
            timeout = deadline - time.perf_counter()
            if timeout <= 0:
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except asyncio.TimeoutError:
                break
        return batch

    async def close(self) -> None:
        """Stop the worker (queued requests get a RuntimeError) and the thread."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        while self._pending:
            job = self._pending.popleft()
            if not job.future.done():
                job.future.set_exception(RuntimeError("the server is shutting down"))
        self._executor.shutdown(wait=True)
