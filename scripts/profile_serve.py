"""Where does a served batch's time go? The server's work for one batch, stage by stage, without HTTP.

    PYTHONPATH=. python scripts/profile_serve.py --out OUT [--n-docs 8.8m] [--model data/models/splade-tiny]
        [--batches 1,8,32,64] [--repeats 30] [--k 10]

On the index bench_serve.py builds (lsr.benchmarks.synth documents, seeded, on the device) and MS MARCO dev-small query
texts, per batch size B (median of --repeats, CUDA synchronised after every stage):

* ``prepare_ms``: ``encoder.prepare(texts, "query")`` (tokenize, sort, pad; the host part of the unbucketed path);
* ``encode_prepared_ms``: ``encoder.encode_prepared`` on that (the unbucketed eager path: backbone + head +
  extraction, vectors on the host; what ``encode_query`` ran for every batch before the query graphs);
* ``pack_ms``: ``QueryGraphs.pack`` (tokenize + bucketed pack; the host part of the bucketed path);
* ``encode_graph_ms``: ``QueryGraphs.encode_packed(device_output=True)`` replaying the bucket's CUDA graph
  (vectors stay on the device), ``encode_bucketed_eager_ms`` the same bucket run eagerly (``graphs=False``);
* ``encode_query_ms``: ``encoder.encode_query(texts)`` (CPU vectors; the graph path for these batch sizes);
* ``search_ms``: ``engine._stack`` + ``Searcher.search`` + copy of the top-k to the host, on pre-encoded CPU
  vectors; ``search_device_ms`` the same on the graph path's device vectors (what the server now does);
* ``run_batch_ms``: ``SearchEngine.run_batch`` (encode + search + answers as dicts), what the worker thread runs,
  and ``stage_*_ms`` its own breakdown (tokenize, encode, search, answers; means over the repeats);
* ``json_ms``: the answers serialised as the app does;
* ``run_batch_busy_ms``: ``run_batch`` while another thread runs Python without pause (as the event loop does
  under load; the interpreter's switch interval is set as ``lsr serve`` sets it), and
  ``run_batch_busy_eager_ms`` the same with the query graphs off: what the GIL hand-offs of each path cost.

Then ``torch.profiler`` traces of ``encode_query`` at the largest B, through the graph (``profile``) and the
unbucketed eager path (``profile_eager``): the ops with the most host time and the GPU kernels' total time, so
host-bound and GPU-bound parts can be told apart.

Last (``--loop-s``, 0 to skip), the event loop under load: the app served by uvicorn in a thread of this process,
text requests from --loop-clients closed-loop clients in another process. ``loop_us_per_req``: the event loop
thread's CPU µs per answered request (its thread clock; the loop holds the interpreter lock while it runs, so
1e6 / loop_us_per_req bounds the QPS of one server process, whatever its GPUs), then a second run under cProfile
on the thread's CPU clock (which slows Python, so read its shares, not its sums): where those µs go, by component (uvicorn + httptools,
Starlette / FastAPI, lsr's request reading and parsing, the batcher and dispatch, asyncio, json).
Writes OUT/profile_serve.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from bench_serve import TEXTS, parse_size  # noqa: E402

from lsr.benchmarks.harness import environment, synchronize  # noqa: E402
from lsr.benchmarks.synth import SynthSpec, synth_docs  # noqa: E402
from lsr.encode.splade.query_graphs import QueryGraphs  # noqa: E402
from lsr.index.inverted import InvertedIndex  # noqa: E402
from lsr.serve.engine import SearchEngine, SearchRequest  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median wall ms of ``fn()`` (synchronised), and its last result."""
    times, out = [], None
    for _ in range(repeats):
        synchronize()
        t = time.perf_counter()
        out = fn()
        synchronize()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), out


def stage_times(engine: SearchEngine, eager: QueryGraphs | None, texts: list[str], repeats: int, k: int) -> dict:
    enc, runner = engine.encoder, engine.encoder.query_runner()
    row: dict = {"batch": len(texts)}
    row["prepare_ms"], prepared = timed(lambda: enc.prepare(texts, "query"), repeats)
    row["encode_prepared_ms"], _ = timed(lambda: enc.encode_prepared(prepared), repeats)
    if runner is not None:
        row["pack_ms"], packed = timed(lambda: runner.pack(texts), repeats)
        row["encode_graph_ms"], on_device = timed(lambda: runner.encode_packed(packed, device_output=True), repeats)
        row["encode_bucketed_eager_ms"], _ = timed(lambda: eager.encode_packed(packed, device_output=True), repeats)
        row["bucket"] = list(packed.key)
    row["encode_query_ms"], vectors = timed(lambda: enc.encode_query(texts), repeats)

    def search(part: tuple) -> object:
        q = engine._stack([part], len(texts))
        scores, idx = engine.searcher.search(q, k=k, show_progress_bar=False)
        return scores.cpu(), idx.cpu()

    row["search_ms"], _ = timed(lambda: search((vectors, None)), repeats)
    if runner is not None:
        row["search_device_ms"], _ = timed(lambda: search(on_device), repeats)
    requests = [SearchRequest([t], None, k) for t in texts]
    stages: dict[str, float] = {}
    row["run_batch_ms"], answers = timed(lambda: engine.run_batch(requests, stages), repeats)
    row |= {f"stage_{key}": v / repeats for key, v in stages.items()}
    row["json_ms"], _ = timed(lambda: [json.dumps(a, separators=(",", ":")).encode() for a in answers], repeats)
    row["run_batch_busy_ms"], _ = busy(lambda: engine.run_batch(requests), repeats)
    if runner is not None:
        enc.query_graphs = False
        try:
            row["run_batch_busy_eager_ms"], _ = busy(lambda: engine.run_batch(requests), repeats)
        finally:
            enc.query_graphs = None
    return row


def busy(fn, repeats: int) -> tuple[float, object]:
    """``timed(fn)`` while a second thread spins in Python (it takes the GIL whenever fn's thread lets go)."""
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            for _ in range(1000):
                n += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        return timed(fn, repeats)
    finally:
        stop.set()
        thread.join()


def profile_encode(encode, texts: list[str]) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(5):
            encode(texts)
        synchronize()
    events = prof.key_averages()
    host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:20]
    gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in events) / 5
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                         "cuLaunchKernelEx", "cudaGraphLaunch")) / 5
    return {"gpu_us_per_call": gpu_us, "launches_per_call": launches,
            "top_host_ops": [{"op": e.key, "calls": e.count / 5, "self_cpu_us_per_call": e.self_cpu_time_total / 5}
                             for e in host]}


LOOP_GROUPS = (("lsr request parsing", ("lsr/serve/app.py", "lsr/serve/engine.py")),
               ("lsr batcher + dispatch", ("lsr/serve/batcher.py", "lsr/serve/replicas.py")),
               ("uvicorn + httptools", ("uvicorn", "httptools", "h11")), ("starlette / fastapi", ("starlette", "fastapi")),
               ("json", ("json",)), ("asyncio / uvloop", ("asyncio", "uvloop", "selectors")))


def event_loop_cost(app, texts: list[str], clients: int, seconds: float, k: int) -> dict:
    """The event loop's CPU per answered request, measured by its thread clock, then by component (cProfile)."""
    import cProfile
    import multiprocessing as mp
    import pstats

    from lsr.benchmarks.loadgen import run_load
    from lsr.benchmarks.servers import ThreadServer
    from lsr.benchmarks.threadcpu import thread_cpu_seconds

    bodies = [json.dumps({"query": t, "k": k}).encode() for t in texts]
    out: dict = {"clients": clients, "seconds": seconds}
    with mp.get_context("spawn").Pool(1) as pool:
        for profiled in (False, True):
            # the thread's CPU clock: wall time would count the waits for the lock and for a core
            profiler = cProfile.Profile(time.thread_time) if profiled else None
            server = ThreadServer(app, profiler=profiler)
            try:
                before = thread_cpu_seconds({"loop": "uvicorn"})["loop"]
                load = pool.apply(run_load, ("127.0.0.1", server.port, bodies, clients, seconds, 0.5))
                cpu_s = thread_cpu_seconds({"loop": "uvicorn"})["loop"] - before
            finally:
                server.stop()
            per_req = 1e6 / max(1, load["sent"])
            if not profiled:
                out |= {"qps": load["qps"], "loop_us_per_req": round(cpu_s * per_req, 1)}
                continue
            stats = pstats.Stats(profiler)
            groups = dict.fromkeys([g for g, _ in LOOP_GROUPS] + ["other"], 0.0)
            for (path, _, _), (_, _, tottime, _, _) in stats.stats.items():
                group = next((g for g, keys in LOOP_GROUPS if any(key in path for key in keys)), "other")
                groups[group] += tottime * per_req
            out["profiled_loop_us_per_req"] = round(cpu_s * per_req, 1)
            out["profiled_us_per_req_by_component"] = {g: round(us, 1) for g, us in groups.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench_results/profile_serve"))
    ap.add_argument("--n-docs", default="8.8m")
    ap.add_argument("--model", default="data/models/splade-tiny")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--switch-interval-ms", type=float, default=0.5, help="as lsr serve's (for run_batch_busy_ms)")
    ap.add_argument("--loop-s", type=float, default=4.0, help="seconds of load for the event-loop measurement (0: skip)")
    ap.add_argument("--loop-clients", type=int, default=64, help="closed-loop clients for the event-loop measurement")
    args = ap.parse_args()
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    dev = torch.device(args.device)
    spec = SynthSpec() if dev.type == "cuda" else SynthSpec(block_rows=4096)
    index = InvertedIndex.build(synth_docs(parse_size(args.n_docs), spec, device=dev), device=dev)
    engine = SearchEngine(index, args.model, device=str(dev), k=args.k)
    t0 = time.perf_counter()
    engine.warmup(max(int(b) for b in args.batches.split(",")))
    warmup_s = time.perf_counter() - t0
    runner = engine.encoder.query_runner()
    eager = QueryGraphs(engine.encoder, graphs=False) if runner is not None else None
    texts = [line.split("\t", 1)[1].strip() for line in TEXTS.read_text().splitlines()]
    out: dict = {"env": environment(dev), "args": vars(args) | {"out": str(args.out)}, "rows": [],
                 "warmup_s": warmup_s, "query_graphs": len(runner._cache) if runner is not None else 0,
                 "capture_failures": runner.failures if runner is not None else []}
    for b in (int(x) for x in args.batches.split(",")):
        engine.run_batch([SearchRequest(texts[:b], None, args.k)])  # first call of this shape: compile, capture
        row = stage_times(engine, eager, texts[b:2 * b], args.repeats, args.k)
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    largest = texts[:max(r["batch"] for r in out["rows"])]
    out["profile"] = profile_encode(engine.encoder.encode_query, largest)
    out["profile_eager"] = profile_encode(lambda t: engine.encoder.encode_prepared(engine.encoder.prepare(t, "query")),
                                          largest)
    if args.loop_s > 0:
        from lsr.serve.app import create_app

        app = create_app(index, args.model, device=str(dev), k=args.k, max_batch=max(int(b) for b in args.batches.split(",")))
        out["event_loop"] = event_loop_cost(app, texts[:2000], args.loop_clients, args.loop_s, args.k)
        print(json.dumps(out["event_loop"], indent=1), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_serve.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({key: out[key] for key in ("profile", "profile_eager", "warmup_s", "query_graphs",
                                                "capture_failures")}, indent=1))
    cols = ["batch", "prepare_ms", "encode_prepared_ms", "pack_ms", "encode_graph_ms", "encode_bucketed_eager_ms",
            "encode_query_ms", "search_ms", "search_device_ms", "run_batch_ms", "stage_tokenize_ms",
            "stage_encode_ms", "stage_search_ms", "stage_answers_ms", "json_ms", "run_batch_busy_ms",
            "run_batch_busy_eager_ms"]
    print(" | ".join(cols))
    for r in out["rows"]:
        print(" | ".join(f"{r[c]:.2f}" if isinstance(r.get(c), float) else str(r.get(c)) for c in cols))


if __name__ == "__main__":
    main()
