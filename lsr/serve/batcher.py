"""Dynamic batching: concurrent requests share one encoder call and one search.

One asyncio worker task owns the device. It waits for a request, then keeps collecting until the batch holds
``max_batch`` queries or ``max_wait_ms`` have passed since the first request arrived (the latency bound), and
runs the batch in a single worker thread so the event loop keeps accepting requests meanwhile; requests that
arrive during a batch form the next one. ``max_batch=1`` turns batching off (one request per device call):
the baseline the benchmark compares with.

Pipelining (``prepare`` / ``finish`` given): a batch's host work before and after the device (tokenizing;
building the answers) runs on a second thread, so the next batch is gathered and tokenized while this one is on
the device, and this one's answers are built while the next one is; two batches are in flight at most, and the
device thread takes them in order.

A request whose caller stopped waiting before its batch was formed is dropped, not searched: its future was
cancelled (the awaiting task was), or its ``gone`` check (the server's: the HTTP client hung up) says so. The
check runs once, when the request is taken from the queue, so a busy server does not search for nobody.

Batch deadline (``batch_timeout_s``): a batch whose device work has not returned within it means a hung device.
Its requests, those queued behind it and those submitted while it overruns get ``DeviceHung`` at once (for the
caller to send elsewhere: ``lsr.serve.replicas``); ``hung`` says so until the device thread returns, and the
batcher then takes requests again. A thread cannot be stopped from outside, so the overdue batch keeps its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchStats", "ClientGone", "DeviceHung", "DynamicBatcher", "within"]

log = logging.getLogger(__name__)

LATENCY_WINDOW = 10_000  # requests whose latency the quantiles describe (the most recent ones)


class ClientGone(Exception):
    """The request's client hung up while it waited in the queue; it was dropped from its batch, not searched."""


class DeviceHung(RuntimeError):
    """The batcher's device has not finished a batch within the batch deadline: the request was not answered
    (it may be sent to another device)."""


async def within(awaitable: Any, seconds: float) -> Any:
    """``await awaitable``, or TimeoutError (the awaitable cancelled) once ``seconds`` have passed."""
    if hasattr(asyncio, "timeout"):  # 3.11+: runs in this task; wait_for would start a task per call
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


@dataclass(frozen=True)
class _Overdue:
    """A batch past its deadline: when it started on the device, its queries, the deadline it missed."""

    since: float
    queries: int
    limit_s: float

    def describe(self) -> str:
        return (f"a batch of {self.queries} queries has run {time.monotonic() - self.since:.1f} s on the device, "
                f"past the {self.limit_s:g} s batch deadline (the device hangs?)")


@dataclass
class _Job:
    item: Any
    size: int
    future: asyncio.Future
    gone: Callable[[], bool] | None = None   # whether the client hung up (checked when the batch is formed)
    arrived: float = field(default_factory=time.perf_counter)

    def dropped(self) -> bool:
        """Whether nobody waits for this request any more (its future is cancelled, or its client hung up)."""
        if self.future.done():
            return True
        if self.gone is None:
            return False
        try:
            return bool(self.gone())
        except Exception:  # noqa: BLE001 - a failing check must not stop the worker: the request is searched
            return False


@dataclass
class BatchStats:
    """Counters since start: requests, queries, batches, errors, requests dropped unsearched, the latency
    (arrival -> answer) window and the time per stage of a batch (mean ms per batch, where the process function
    reports them)."""

    requests: int = 0
    queries: int = 0
    batches: int = 0
    errors: int = 0
    dropped: int = 0      # requests whose caller was gone when their batch was formed (not searched)
    max_batch_seen: int = 0
    busy_s: float = 0.0
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    started: float = field(default_factory=time.time)
    stage_ms: dict = field(default_factory=dict)  # stage -> total ms over the batches that reported stages
    stage_batches: int = 0

    def record_stages(self, timings: dict[str, float]) -> None:
        """One batch's stage times (ms by stage name, e.g. ``SearchEngine.run_batch``'s ``timings``); called
        by the thread that finishes the batch."""
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
                "batches": self.batches, "errors": self.errors, "dropped": self.dropped,
                "mean_batch_queries": round(self.queries / self.batches, 3) if self.batches else None,
                "mean_batch_requests": round(self.requests / self.batches, 3) if self.batches else None,
                "max_batch_queries": self.max_batch_seen, "device_busy_s": round(self.busy_s, 3),
                "latency_ms": {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": pick(1.0),
                               "window": len(lat)},
                "stage_ms_mean": {k: round(v / self.stage_batches, 4) for k, v in self.stage_ms.items()},
                "stage_ms_total": {k: round(v, 3) for k, v in self.stage_ms.items()},
                "stage_batches": self.stage_batches}


def _timed(fn: Callable[[Any], Any], arg: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    return fn(arg), time.perf_counter() - t


class DynamicBatcher:
    """Gathers submitted items into batches for ``finish(process(prepare(items))) -> results`` (same length
    and order as the items; ``prepare`` / ``finish`` default to passing their argument through).

    Args:
        process: runs one batch on the device; called in one worker thread, one batch at a time, in order.
        max_batch: most queries per batch (an item larger than this runs alone); 1 = no batching.
        max_wait_ms: longest wait for more items after the first of a batch arrived.
        thread_init: run once in the worker thread (e.g. select the CUDA device).
        prepare, finish: a batch's host work before and after ``process``, run in a second thread; given
            either, two batches are in flight at once (see the module doc).
        batch_timeout_s: the batch deadline (see the module doc); None: none.
    """

    def __init__(self, process: Callable[[Any], Any], max_batch: int = 64, max_wait_ms: float = 2.0,
                 thread_init: Callable[[], None] | None = None, prepare: Callable[[list[Any]], Any] | None = None,
                 finish: Callable[[Any], list[Any]] | None = None, batch_timeout_s: float | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.process, self.max_batch, self.max_wait_s = process, int(max_batch), max_wait_ms / 1000
        self.prepare, self.finish = prepare, finish
        self.pipelined = prepare is not None or finish is not None
        self.stats = BatchStats()
        self._pending: deque[_Job] = deque()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="lsr-serve", initializer=thread_init)
        self._host = ThreadPoolExecutor(1, thread_name_prefix="lsr-serve-host") if self.pipelined else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()
        self.batch_timeout_s = batch_timeout_s
        # set on the event loop when a batch misses its deadline; cleared by the thread when the step returns
        self._overdue: _Overdue | None = None
        self._overdue_step: concurrent.futures.Future | None = None

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch (not counting the batch on the device)."""
        return len(self._pending)

    @property
    def hung(self) -> str | None:
        """While a batch overruns the batch deadline, what overruns (one line); else None."""
        return self._overdue.describe() if self._overdue is not None else None

    async def submit(self, item: Any, size: int = 1, gone: Callable[[], bool] | None = None) -> Any:
        """Queue ``item`` (``size`` queries) and wait for its result; the batch's exception if it failed.

        ``gone``: a cheap check whether the caller left (e.g. its HTTP client hung up), made when the batch is
        formed; True drops the item unsearched and raises ClientGone here. Cancelling this call drops it too.
        """
        self._ensure_worker()
        job = _Job(item, size, self._loop.create_future(), gone)
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
            if not batch:  # every queued request was dropped
                continue
            task = self._loop.create_task(self._complete(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            limit = 2 if self.pipelined else 1  # pipelined: the next batch is gathered while this one runs
            while len(self._inflight) >= limit:
                done, _ = await asyncio.wait(set(self._inflight), return_when=asyncio.FIRST_COMPLETED)
                self._inflight.difference_update(done)

    async def _complete(self, batch: list[_Job]) -> None:
        """Run one batch and hand each request its outcome."""
        try:
            outcomes, busy_s = await self._run(batch)
            failed = sum(isinstance(o, Exception) for o in outcomes)
            self.stats.record_batch(batch, busy_s, failed)
            for job, outcome in zip(batch, outcomes):
                if job.future.done():  # a client that went away has cancelled its future
                    continue
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)
        finally:  # cancelled (the server is closing): nobody may wait forever
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(RuntimeError("the server is shutting down"))

    async def _chain(self, items: list[Any], steps: list[concurrent.futures.Future] | None = None,
                     ) -> tuple[list[Any], float]:
        """prepare (host thread), process (device thread), finish (host thread) of one batch: the results and
        the seconds ``process`` took. ``steps`` gets each thread step's future as it is submitted."""

        async def run(executor: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any) -> Any:
            step = executor.submit(fn, *args)   # as run_in_executor does, keeping the thread's own future
            if steps is not None:
                steps.append(step)
            return await asyncio.wrap_future(step)

        state = await run(self._host, self.prepare, items) if self.prepare is not None else items
        state, busy_s = await run(self._executor, _timed, self.process, state)
        results = await run(self._host, self.finish, state) if self.finish is not None else state
        return list(results), busy_s

    async def _run(self, batch: list[_Job]) -> tuple[list[Any], float]:
        """Results of the batch and its device seconds; where the batch fails, each request alone, so that one
        request the parser let through cannot fail the others (an item's outcome is then its exception). Past the
        batch deadline (or while an earlier batch overruns it) the outcomes are DeviceHung."""
        try:
            return await self._in_time([j.item for j in batch], sum(j.size for j in batch))
        except DeviceHung as e:
            return [e] * len(batch), 0.0
        except Exception as e:  # noqa: BLE001 - reported to the requests, the worker goes on
            log.error("a batch of %d requests failed (%s: %s)", len(batch), type(e).__name__, e)
            if len(batch) == 1:
                return [e], 0.0
        outcomes: list[Any] = []
        busy = 0.0
        for i, job in enumerate(batch):
            try:
                results, busy_s = await self._in_time([job.item], job.size)
                outcomes.extend(results)
                busy += busy_s
            except DeviceHung as e:
                return outcomes + [e] * (len(batch) - i), busy
            except Exception as e:  # noqa: BLE001
                outcomes.append(e)
        return outcomes, busy

    async def _in_time(self, items: list[Any], queries: int) -> tuple[list[Any], float]:
        """``_chain(items)`` within the batch deadline; DeviceHung past it (the batch goes on in its thread, and
        the batcher takes requests again when that step returns) or while an earlier batch overruns."""
        if self._overdue is not None:
            raise DeviceHung(self.hung)
        if self.batch_timeout_s is None:
            return await self._chain(items)
        steps: list[concurrent.futures.Future] = []
        task = self._loop.create_task(self._chain(items, steps))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.batch_timeout_s)  # does not cancel the task
        except asyncio.CancelledError:  # the server is closing: the batch goes with it
            task.cancel()
            raise
        if done:
            return task.result()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # its outcome goes nowhere: no warning
        if self._overdue is None:   # (else this batch waited behind the overdue one: that one says when it returns)
            self._overdue = _Overdue(time.monotonic() - self.batch_timeout_s, queries, self.batch_timeout_s)
            log.error("%s; its requests and the queued ones are answered elsewhere until it returns", self.hung)
            # the thread step it waits in (its callback runs in that thread when it returns), else the task
            self._overdue_step = steps[-1] if steps else None
            (steps[-1] if steps else task).add_done_callback(self._returned)
        error = DeviceHung(self.hung)
        while self._pending:   # queued behind a hung device: answered elsewhere now, not after it returns
            job = self._pending.popleft()
            if not job.future.done():
                job.future.set_exception(error)
        raise error

    def _returned(self, step: Any) -> None:
        """The overdue batch's thread step returned (called in that thread, or at once where it had): the batcher
        takes requests again; the batch's results went nowhere."""
        overdue, self._overdue, self._overdue_step = self._overdue, None, None
        if overdue is not None:
            log.warning("the batch of %d queries past its deadline returned after %.1f s; the device takes requests "
                        "again", overdue.queries, time.monotonic() - overdue.since)

    def _live_head(self) -> _Job | None:
        """The first queued request that someone still waits for; the dropped ones before it leave the queue."""
        while self._pending:
            job = self._pending[0]
            if not job.dropped():
                return job
            self._pending.popleft()
            self.stats.dropped += 1
            if not job.future.done():
                job.future.set_exception(ClientGone("the client hung up before its batch was formed"))
        return None

    async def _gather(self) -> list[_Job]:
        """The next batch: what is queued, then what arrives until the deadline, up to max_batch queries;
        requests whose caller left are dropped on the way (empty: all were)."""
        first = self._live_head()
        if first is None:
            return []
        self._pending.popleft()
        batch, n = [first], first.size
        deadline = first.arrived + self.max_wait_s
        while n < self.max_batch:
            job = self._live_head()
            if job is not None:
                if n + job.size > self.max_batch:
                    break
                batch.append(self._pending.popleft())
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

    async def close(self, overdue_wait_s: float = 2.0) -> None:
        """Stop the worker (queued requests get a RuntimeError) and the thread; a batch past its deadline is
        waited for ``overdue_wait_s`` at most (a hung device may never return)."""
        overdue = self._overdue_step
        if overdue is not None:
            await asyncio.wait({asyncio.wrap_future(overdue)}, timeout=overdue_wait_s)
        for task in [self._task, *self._inflight]:
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        while self._pending:
            job = self._pending.popleft()
            if not job.future.done():
                job.future.set_exception(RuntimeError("the server is shutting down"))
        still_hung = self._overdue is not None
        if still_hung:
            log.error("closing while %s: its thread is left running", self.hung)
        self._executor.shutdown(wait=not still_hung, cancel_futures=still_hung)
        if self._host is not None:
            self._host.shutdown(wait=not still_hung, cancel_futures=still_hung)
