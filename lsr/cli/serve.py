"""``lsr serve``: the search server (lsr.serve.app) under uvicorn."""

from __future__ import annotations

import argparse
from typing import Any

from lsr.cli.args import integer, ranged
from lsr.search.config import BACKENDS
from lsr.serve.limits import BATCH_TIMEOUT_S, MAX_BATCH, MAX_WAIT_MS, REQUEST_TIMEOUT_S, SWITCH_INTERVAL_MS
from lsr.serve.replicas import DEVICES_HELP, parse_devices

__all__ = ["cmd_serve", "register"]


def register(sub: Any, command: Any) -> None:
    from lsr.cli.args import add_device_arg

    p = command(sub, "serve", "serve an index over HTTP/JSON with dynamic batching (POST /search, GET /health, /stats)")
    p.add_argument("--index", required=True, help="index directory written by lsr index")
    p.add_argument("--model", help="query encoder: a fitted BM25 folder (lsr encode's OUT/encoder) or a SPLADE "
                   "checkpoint; without it requests send pre-encoded vectors")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=integer(1, 65535), default=8000, help="port to listen on")
    p.add_argument("--max-batch", type=ranged(MAX_BATCH), default=64, help="most queries searched together (1 = no batching)")
    p.add_argument("--max-wait-ms", type=ranged(MAX_WAIT_MS), default=2.0,
                   help="how long a batch waits for more requests after its first one")
    p.add_argument("--k", type=integer(1), default=1000, help="hits per query when a request does not give k")
    p.add_argument("--max-k", type=integer(1), default=None, help="the largest k a request may ask for (default: "
                   "max(--k, 1000))")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="search backend: torch ops, or lsr's GPU kernels (auto: gpu on CUDA)")
    p.add_argument("--no-warmup", action="store_true", help="skip compiling and capturing before serving")
    p.add_argument("--pipeline", action="store_true", help="tokenize and build answers on a second thread, "
                   "overlapping the device work (off by default: the threads contend for the GIL; docs/performance/serve.md)")
    p.add_argument("--no-freeze-gc", action="store_true", help="leave the objects alive after warm-up to the garbage "
                   "collector (by default they are frozen: a full collection during serving skips them)")
    p.add_argument("--log-level", default="warning", help="uvicorn log level")
    p.add_argument("--switch-interval-ms", type=ranged(SWITCH_INTERVAL_MS), default=0.5,
                   help="the interpreter's thread switch interval: the event loop and the search thread share the "
                        "GIL, and Python's default of 5 ms lets one wait that long for it (scripts/bench_serve.py measures it)")
    p.add_argument("--request-timeout", type=ranged(REQUEST_TIMEOUT_S), default=30.0, metavar="SECONDS",
                   help="how long a request waits for its answer once its body arrived (a request's timeout_ms may "
                        "shorten it); past it: 503 with Retry-After")
    p.add_argument("--batch-timeout", type=ranged(BATCH_TIMEOUT_S), default=10.0, metavar="SECONDS",
                   help="how long one batch may run on a device: past it the replica counts as hung, leaves the "
                        "dispatch until the batch returns, its requests go to another replica and /health says degraded")
    p.add_argument("--openapi", action="store_true", help="also serve FastAPI's /docs, /redoc and /openapi.json on the "
                   "search port")
    add_device_arg(p)
    p.add_argument("--devices", type=_devices, default=None,
                   help="serve from several devices behind the one endpoint, one index replica and query encoder each "
                        f"(requests go to the least-loaded): {DEVICES_HELP}; instead of --device")
    p.set_defaults(func=cmd_serve)


def _devices(text: str) -> list[str]:
    try:
        return parse_devices(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--devices: ")) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from lsr.errors import UsageError

    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise RuntimeError(f"lsr serve needs FastAPI and uvicorn ({e}); install them with: "
                           "pip install lsr-gpu[serve]") from e
    if args.devices is not None and args.device != "auto":
        raise UsageError(f"give --device ({args.device}) or --devices ({','.join(args.devices)}), not both")
    max_k = args.max_k if args.max_k is not None else max(args.k, 1000)
    if not 1 <= args.k <= max_k:
        raise UsageError(f"--k ({args.k}) must lie in [1, --max-k={max_k}]")
    import sys

    from lsr.serve.app import create_app
    from lsr.serve.protocol import json_error_protocol

    sys.setswitchinterval(args.switch_interval_ms / 1000)

    app = create_app(args.index, args.model, device=args.device, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                     k=args.k, max_k=max_k, backend=args.backend, warmup=not args.no_warmup,
                     pipeline=args.pipeline, freeze_gc=not args.no_freeze_gc, devices=args.devices,
                     request_timeout_s=args.request_timeout, batch_timeout_s=args.batch_timeout, openapi=args.openapi)
    health = app.state.engine.describe()
    runner = app.state.engine.query_runner()
    graphs = f", {runner.describe()['held']} query-encoder CUDA graphs" if runner is not None and runner.graphs else ""
    devices = [r.device for r in app.state.replicas.replicas]
    where = devices[0] if len(devices) == 1 else f"{len(devices)} replicas ({','.join(devices)})"
    print(f"serving {health['n_docs']} documents on {where} ({health['backend']}; encoder: "
          f"{health['encoder'] or 'none, pre-encoded vectors'}{graphs}) at http://{args.host}:{args.port} "
          f"(max batch {args.max_batch}, max wait {args.max_wait_ms} ms, deadlines: request {args.request_timeout:g} s, "
          f"batch {args.batch_timeout:g} s)", flush=True)
    # a client that holds its connection open cannot keep the server from stopping past this; a request the
    # HTTP parser cannot read is answered in the server's JSON (lsr.serve.protocol)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=10,
                http=json_error_protocol())
    return 0
