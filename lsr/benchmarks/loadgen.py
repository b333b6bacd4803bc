"""A closed-loop HTTP load generator for the search server (standard library only, no torch).

``run_load`` opens ``concurrency`` keep-alive connections; each sends one request, waits for the answer and
sends the next (a bounded client: at most ``concurrency`` requests in flight). Requests answered inside the
measured window (after ``warmup_s``) count: QPS = answered / window, with their latencies (a request started
before the window counts when it ends inside: at high concurrency a latency can approach the window). It runs in its own process (``multiprocessing`` spawn) in ``scripts/bench_serve.py``, so
the client does not share the server's interpreter lock; a server on several GPUs answers more requests than
one client process can send, so ``merge_loads`` adds up the results of several such processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from lsr.serve.gcwatch import GcWatch, frozen

__all__ = ["merge_loads", "run_load"]

_HEAD = b"POST %s HTTP/1.1\r\nHost: lsr\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: bytes,
                    body: bytes) -> tuple[int, bytes]:
    writer.write(_HEAD % (path, len(body)) + body)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = next((int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:]) if k.strip().lower() ==
                   b"content-length"), None)
    if length is None:
        raise RuntimeError("the server answered without Content-Length (chunked answers are not read)")
    return status, await reader.readexactly(length)


async def _load(host: str, port: int, bodies: Sequence[bytes], concurrency: int, duration_s: float,
                warmup_s: float, keep: int, path: bytes, offset: int) -> dict[str, Any]:
    start = time.perf_counter() + warmup_s
    end = start + duration_s
    latencies: list[float] = []
    counts = {"ok": 0, "errors": 0, "sent": 0}
    answers: dict[int, str] = {}
    first_error: list[str] = []

    async def client(c: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        i = offset + c
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            q = i % len(bodies)
            i += concurrency
            try:
                status, data = await _exchange(reader, writer, path, bodies[q])
            except (OSError, asyncio.IncompleteReadError, ValueError, RuntimeError) as e:
                counts["errors"] += 1
                first_error[:] = first_error or [f"{type(e).__name__}: {e}"]
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            t1 = time.perf_counter()
            counts["sent"] += 1
            if status != 200:
                counts["errors"] += 1
                first_error[:] = first_error or [f"HTTP {status}: {data[:200].decode(errors='replace')}"]
            elif start <= t1 <= end:
                counts["ok"] += 1
                latencies.append((t1 - t0) * 1000)
            if status == 200 and q < keep and q not in answers:
                answers[q] = data.decode()
        writer.close()

    await asyncio.gather(*[client(c) for c in range(concurrency)])
    return {"latencies_ms": latencies, "qps": counts["ok"] / duration_s, **counts, "answers": answers,
            "first_error": first_error[0] if first_error else None}


def run_load(host: str, port: int, bodies: Sequence[bytes], concurrency: int, duration_s: float = 10.0,
             warmup_s: float = 1.0, keep: int = 0, path: str = "/search", offset: int = 0) -> dict[str, Any]:
    """Closed-loop load: client c sends bodies offset + c, offset + c + concurrency, ... (cycling; client
    processes side by side take different offsets).

    Returns {"latencies_ms": [...], "qps", "ok", "errors", "sent", "answers": {body index: answer text} for
    body indices < ``keep`` (their first answer), "first_error", "client_gc_full": full garbage collections in
    this process during the run}.
    """
    if concurrency < 1 or not bodies:
        raise ValueError("run_load needs concurrency >= 1 and at least one body")
    coro = _load(host, port, list(bodies), concurrency, duration_s, warmup_s, keep, path.encode(), offset)
    # the client's own full garbage collections would stall its clients and show as server latency: what this
    # process holds is frozen for the run (lsr.serve.gcwatch), and the ones that still happen are counted
    watch = None
    try:
        with frozen():
            watch = GcWatch()   # after the freeze's own collection
            try:
                import uvloop  # the faster event loop where installed (uvicorn[standard] brings it)
            except ImportError:
                out = asyncio.run(coro)
            else:
                out = uvloop.run(coro)
    finally:
        if watch is not None:
            watch.close()
    return {**out, "client_gc_full": watch.collections[2]}


def merge_loads(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``run_load`` results of client processes that ran side by side (same window) as one: counts and QPS
    summed, latencies pooled, each body's first answer kept, the first error."""
    out: dict[str, Any] = {"latencies_ms": [], "answers": {}, "first_error": None}
    for key in ("qps", "ok", "errors", "sent", "client_gc_full"):
        out[key] = sum(p.get(key, 0) for p in parts)
    for p in parts:
        out["latencies_ms"].extend(p["latencies_ms"])
        for i, text in p["answers"].items():
            out["answers"].setdefault(i, text)
        out["first_error"] = out["first_error"] or p.get("first_error")
    return out
