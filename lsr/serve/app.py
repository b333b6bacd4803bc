"""The HTTP/JSON application: ``create_app(index, model=...)`` returns a FastAPI (ASGI) app.

Endpoints:

* ``POST /search``: ``{"queries": [text, ...]}``, ``{"query": text}`` or ``{"vectors": [{term: weight}, ...]}``
  (keys: tokens of the encoder's vocabulary when the server has one, else term ids), optional ``"k"``;
  answers ``{"results": [{"docnos": [...], "scores": [...]}, ...]}``, one entry per query, best first.
  An optional ``"timeout_ms"`` shortens the request's deadline (the server's ``request_timeout_s``); an optional
  ``"filter"`` (``{"allow": [docno, ...]}``, ``{"deny": [...]}``, ``{"where": "expression"}``, ``{"and" | "or":
  [filter, ...]}``, ``{"not": filter}``: ``lsr.serve.filters``) limits the documents its queries may return.
* ``GET /health``: ``{"status": "ok", ...}`` with the index size, device, backend and encoder, and each replica
  (device, ready, hung, queue depth, the error that stopped it); "degraded" (HTTP 200) while some replica has
  failed or is past its batch deadline, "unavailable" (HTTP 503) while none can take requests.
* ``GET /stats``: requests, queries, batches, mean batch size, latency quantiles, queue depth, the mean ms
  per batch of each stage in the worker thread (``stage_ms_mean``: tokenize, encode, search, answers, json) and
  the garbage collector's collections and pauses per generation (``gc``) and the search's CUDA graph captures
  and kernel variants compiled so far (``compiled``); with several devices the counters are totals over the
  replicas and ``replicas`` lists each one's own.

Every error is a JSON object ``{"error": "one line"}`` with a 4xx code for a bad request (400 malformed body,
404/405 wrong route, 408 a body that stops arriving, 413 too many queries or too large a body, 422 invalid
values), 500 for a failure on the server and 503 with ``Retry-After`` for a request that no replica answered
within its deadline or that no replica can take (all hung); never a traceback. Search work runs in the batcher's
worker thread, never on the event loop. ``/docs``, ``/redoc`` and ``/openapi.json`` exist only with
``openapi=True``. A request the HTTP parser cannot read gets the same one-line JSON from ``lsr serve``
(``lsr.serve.protocol``).
"""

# no ``from __future__ import annotations``: FastAPI reads the endpoints' annotations (Request, imported
# inside create_app) at definition time
import asyncio
import gc
import json
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsr.serve.batcher import ClientGone, DynamicBatcher, within
from lsr.serve.body import RequestError, decode_json, request_timeout, shorten
from lsr.serve.engine import SearchEngine
from lsr.serve.gcwatch import GcWatch, frozen
from lsr.serve.limits import check_batching, check_deadlines
from lsr.serve.replicas import ReplicaSet, Unavailable, parse_devices, visible_devices
from lsr.utils.runtime import failures

__all__ = ["BodyLimits", "create_app"]

log = logging.getLogger(__name__)
SERVE_EXTRA_HINT = "pip install lsr-gpu[serve]"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": shorten(str(message), 500)}, status_code=status, headers=headers)


def _thread_init(device: str) -> Any:
    def init() -> None:
        if device.startswith("cuda"):
            import torch

            torch.cuda.set_device(torch.device(device))
    return init


@dataclass(frozen=True)
class BodyLimits:
    """What a request body may be: at most ``max_bytes`` (4,096 queries of a few hundred terms each fit in a few
    MB), arriving within ``timeout_s`` (a client that stops sending mid-body is answered 408, not waited for)."""

    max_bytes: int = 64 << 20
    timeout_s: float = 30.0


def create_app(index: str | Path | Any, model: str | Path | None = None, *, device: str = "auto", max_batch: int = 64,
               max_wait_ms: float = 2.0, k: int = 1000, max_k: int | None = None, backend: str = "auto",
               pad_batches: bool | None = None, warmup: bool = True, pipeline: bool = False,
               freeze_gc: bool = True, body_limits: BodyLimits | None = None, devices: str | Sequence[str] | None = None,
               engine_factory: Callable[[str], SearchEngine] | None = None, request_timeout_s: float = 30.0,
               batch_timeout_s: float | None = 10.0, openapi: bool = False) -> Any:
    """The search server as a FastAPI app (serve it with uvicorn: ``lsr serve``).

    Args:
        index: index directory written by ``lsr index`` (or an InvertedIndex).
        model: query encoder: a fitted BM25 folder (``lsr encode`` writes OUT/encoder) or a SPLADE checkpoint;
            None: requests send pre-encoded ``vectors``.
        device: "auto" | "cpu" | "cuda" | "cuda:N".
        max_batch: most queries searched together; 1 turns dynamic batching off.
        max_wait_ms: how long a batch waits for more requests after its first one arrived.
        k: hits per query when a request does not say; max_k: the largest k a request may ask for
            (default: max(k, 1000)).
        backend: the search backend ("auto", "torch", "gpu"); pad_batches: see ``SearchEngine``; warmup: compile
            and capture before serving.
        pipeline: tokenize the next batch and build this batch's answers on a second thread while the device
            works (``lsr.serve.batcher``); False (default): every step of a batch in the device thread (the two
            threads contend for the GIL; docs/performance/serve.md compares them).
        freeze_gc: at startup, after warm-up, freeze the objects alive (``lsr.serve.gcwatch``: a full garbage
            collection during serving then skips them; undone at shutdown). ``/stats`` reports the collector's
            pauses either way.
        body_limits: the largest request body and how long it may take to arrive (``BodyLimits()``).
        devices: serve from several devices ("cuda:0,cuda:1", a list, "all" GPUs; "cpu" may repeat): one index
            replica, query encoder and batcher per device behind the one endpoint (``lsr.serve.replicas``);
            None: the one ``device``.
        engine_factory: builds a replica's ``SearchEngine`` for a device name (default: ``SearchEngine(index,
            model, device=..., ...)`` with the arguments above); for engines of one's own.
        request_timeout_s: how long a request waits for its answer once its body arrived (a request's
            ``timeout_ms`` may shorten it); past it: 503 with Retry-After.
        batch_timeout_s: how long one batch may run on a replica's device; past it the replica counts as hung:
            it leaves the dispatch until the batch returns, and its requests go to another replica (503 where
            none is left). None: no batch deadline.
        openapi: serve FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` (off: the search port describes
            nothing it does not need to).
    """
    try:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse
        from starlette.exceptions import HTTPException
    except ImportError as e:
        raise ImportError(f"serving needs FastAPI and uvicorn ({e}): {SERVE_EXTRA_HINT}") from e

    check_batching(max_batch, max_wait_ms)  # before loading anything
    check_deadlines(request_timeout_s, batch_timeout_s)
    if devices is not None and device != "auto":
        raise ValueError(f"give device ({device!r}) or devices ({devices!r}), not both")
    names = [device] if devices is None else visible_devices(parse_devices(devices))

    def make_engine(name: str) -> SearchEngine:
        engine = engine_factory(name) if engine_factory is not None else \
            SearchEngine(index, model, device=name, k=k, max_k=max_k, backend=backend, pad_batches=pad_batches)
        if warmup:
            engine.warmup(max_batch)
        return engine

    replicas = ReplicaSet.start(names, make_engine,
                                lambda e: _make_batcher(e, max_batch, max_wait_ms, pipeline, batch_timeout_s))

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202 - FastAPI's own protocol
        try:
            with frozen(freeze_gc) as froze:
                if froze:
                    log.info("froze %d objects for the garbage collector", gc.get_freeze_count())
                app.state.gc = GcWatch()   # after the freeze's own collection: /stats counts serving's
                yield
        finally:
            await replicas.close()
            if getattr(app.state, "gc", None) is not None:
                app.state.gc.close()

    docs = {} if openapi else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="lsr search", lifespan=lifespan, **docs)
    # the first replica's engine and batcher: what a one-device server has (its benchmarks and tests read them)
    app.state.engine, app.state.batcher, app.state.replicas = replicas.first.engine, replicas.first.batcher, replicas

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, exc.detail)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # the last resort: Starlette would answer a plain-text 500; the log keeps the traceback
        return _error(500, f"the server failed on this request: {type(exc).__name__}: {exc}")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "; ".join(str(e.get("msg", e)) for e in exc.errors()))

    _add_routes(app, replicas, body_limits or BodyLimits(), {
        "max_batch": max_batch, "max_wait_ms": max_wait_ms, "pipeline": pipeline, "freeze_gc": freeze_gc,
        "request_timeout_s": request_timeout_s, "batch_timeout_s": batch_timeout_s})
    return app


DECODE_INLINE_BYTES = 256 << 10  # bodies up to this size are decoded on the event loop (they decode quickly)


async def _read_body(request: Any, limits: BodyLimits) -> Any:
    """The request body as bytes, or the error response: 413 above ``limits.max_bytes`` (from Content-Length
    or while reading), 408 when it does not arrive within ``limits.timeout_s``, and a one-line log (no
    traceback) when the client hung up."""
    from starlette.requests import ClientDisconnect

    max_bytes = limits.max_bytes
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > max_bytes:
        return _error(413, f"the body has {int(size)} bytes; send at most {max_bytes}")
    chunks: list[bytes] = []

    async def read() -> bool:
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_bytes:
                return False
            chunks.append(chunk)
        return True

    try:
        complete = await within(read(), limits.timeout_s)
        if not complete:
            return _error(413, f"the body exceeds {max_bytes} bytes")
    except (asyncio.TimeoutError, TimeoutError):
        return _error(408, f"the body did not arrive within {limits.timeout_s:g} s")
    except ClientDisconnect:
        log.info("client disconnected before its request body was complete")
        return _error(400, "the client disconnected")
    return b"".join(chunks)


def _hung_up(receive: Callable[[], Any]) -> Callable[[], bool]:
    """A check whether the HTTP client hung up, for the batcher to make when it forms the request's batch.

    Neither uvicorn nor Starlette cancels a handler whose client left: the ASGI ``receive`` answers
    ``http.disconnect`` instead. The check runs ``receive`` one step without awaiting it: a server that knows of
    the disconnect answers at once; otherwise ``receive`` would wait, and is closed unfinished. No task or
    timer per request (a watcher task would cost event-loop time for every request)."""

    def gone() -> bool:
        step = receive()
        if not asyncio.iscoroutine(step):
            return False
        try:
            step.send(None)
        except StopIteration as done:
            return isinstance(done.value, dict) and done.value.get("type") == "http.disconnect"
        except Exception:  # noqa: BLE001 - a server's receive that fails here: treat the client as present
            return False
        finally:
            step.close()
        return False

    return gone


def _decode(engine: SearchEngine, body: bytes, limit_s: float) -> tuple[Any, float]:
    """JSON body -> the engine's parsed request and the seconds it may wait for its answer (``timeout_ms`` within
    ``limit_s``); RequestError for a malformed or invalid one."""
    payload = decode_json(body)
    timeout_s = request_timeout(payload, limit_s)
    return engine.parse(payload), timeout_s


def _compiled() -> dict[str, int]:
    """What this process has captured and compiled for the search (counts that should stop growing after
    warm-up: a first capture or compile stalls the batch that needs it)."""
    import sys

    from lsr.search.graphs import captures

    # the kernel module only where a search loaded it (it needs Triton): else nothing was compiled
    block_cuda = sys.modules.get("lsr.search.kernels.block_cuda")
    return {"search_graph_captures": captures(),
            "cuda_kernel_variants": block_cuda.compiled_variants() if block_cuda is not None else 0}


def _make_batcher(engine: SearchEngine, max_batch: int, max_wait_ms: float, pipeline: bool,
                  batch_timeout_s: float | None) -> DynamicBatcher:
    """The dynamic batcher over ``engine``: every step of a batch in the device thread, or (``pipeline``)
    tokenizing and answering on a second host thread; ``batch_timeout_s``: its batch deadline."""

    def prepare(requests: list[Any]) -> Any:  # host thread: tokenize (and pack) the batch's texts
        return engine.prepare_batch(requests, {})

    def finish(batch: Any) -> list[bytes]:  # host thread: the answers as JSON bodies
        answers = engine.answer_batch(batch)
        t = time.perf_counter()
        body = [json.dumps(r, separators=(",", ":")).encode() for r in answers]
        batch.timings["json_ms"] = (time.perf_counter() - t) * 1000
        batcher.stats.record_stages(batch.timings)
        return body

    def process(requests: list[Any]) -> list[bytes]:  # all steps in the device thread (pipeline=False)
        return finish(engine.search_batch(prepare(requests)))

    batcher = DynamicBatcher(engine.search_batch if pipeline else process, max_batch=max_batch,
                             max_wait_ms=max_wait_ms, thread_init=_thread_init(str(engine.searcher.device)),
                             prepare=prepare if pipeline else None, finish=finish if pipeline else None,
                             batch_timeout_s=batch_timeout_s)
    return batcher


def _add_routes(app: Any, replicas: ReplicaSet, limits: BodyLimits, config: dict[str, Any]) -> None:
    """POST /search, GET /health and GET /stats."""
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response
    from starlette.routing import Route

    async def search(request: Request) -> Response:
        body = await _read_body(request, limits)
        if isinstance(body, Response):
            return body
        engine = replicas.first.engine   # every replica parses alike (same index, encoder and limits)
        try:   # a large body is decoded off the event loop (it would hold /health and every other request)
            parsed, timeout_s = _decode(engine, body, config["request_timeout_s"]) \
                if len(body) < DECODE_INLINE_BYTES else \
                await asyncio.to_thread(_decode, engine, body, config["request_timeout_s"])
            if getattr(parsed, "filter", None) is not None:   # O(documents): off the event loop; its errors are this request's
                await asyncio.to_thread(engine.resolve_filter, parsed)
        except RequestError as e:
            return _error(e.status, str(e))
        try:
            body = await within(replicas.submit(parsed, parsed.n_queries, gone=_hung_up(request.receive)), timeout_s)
        except ClientGone:  # nobody reads the answer (uvicorn sends nothing on a closed connection)
            log.info("client disconnected while its request was queued; it was not searched")
            return Response(status_code=499)
        except (TimeoutError, asyncio.TimeoutError):
            log.warning("a request was not answered within its deadline of %g s", timeout_s)
            return _unavailable(f"no answer within the request's deadline of {timeout_s:g} s (its timeout_ms, or "
                                f"the server's --request-timeout); the server is {replicas.status()} (GET /health)")
        except Unavailable as e:
            return _unavailable(f"{e}; GET /health lists the replicas")
        except Exception as e:  # noqa: BLE001 - the client gets one line, the log has the rest
            log.error("search failed: %s: %s", type(e).__name__, e)
            return _error(500, f"search failed: {type(e).__name__}: {e}")
        return Response(body, media_type="application/json")

    # a plain Starlette route: FastAPI's parameter and dependency handling doubles the framework's time per
    # request (measured in-process: docs/performance/serve.md), and every request pays it on the event loop
    app.router.routes.append(Route("/search", search, methods=["POST"]))

    @app.get("/health")
    async def health() -> Response:
        status = replicas.status()   # "unavailable" answers 503: a load balancer sends its requests elsewhere
        return JSONResponse({"status": status, **replicas.first.engine.describe(), **config,
                             "device": ",".join(r.device for r in replicas.replicas),
                             "replicas": [r.describe() for r in replicas.replicas]},
                            status_code=503 if status == "unavailable" else 200)

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        totals, per = replicas.stats()
        for entry, replica in zip(per, replicas.replicas):
            entry["query_graphs"] = _query_graphs(replica.engine)
        watch = getattr(app.state, "gc", None)
        return {**totals, **config, "query_graphs": per[0]["query_graphs"], "replicas": per,
                "gc": watch.as_dict() if watch is not None else None, "compiled": _compiled(),
                "disabled": failures()}   # the routes this process disabled, and why (lsr.utils.runtime)


RETRY_AFTER_S = 1  # a 503's advice: a hung replica may be back by then (its batch returned), or a load has passed


def _unavailable(message: str) -> Any:
    return _error(503, message, {"Retry-After": str(RETRY_AFTER_S)})


def _query_graphs(engine: SearchEngine) -> dict[str, Any] | None:
    runner = engine.query_runner()
    return runner.describe() if runner is not None else None
