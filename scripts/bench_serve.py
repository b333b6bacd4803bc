"""Load-test the search server (lsr.serve) on loopback: dynamic batching against batching off (max_batch=1).

    PYTHONPATH=. python scripts/bench_serve.py --out OUT [--n-docs 8.8m] [--queries synth,text]
        [--model data/models/splade-tiny] [--concurrency 1,4,16,32,64,128,256] [--max-batch 1,64]
        [--max-wait-ms 2] [--k 10] [--duration-s 6] [--slo-ms 20] [--device cuda] [--replicas 1,4]
        [--modes threads,processes] [--client-procs 4] [--quick]

The index: lsr.benchmarks.synth documents (seeded, generated on the device, as scripts/bench_search.py does), searched
in process: uvicorn serves ``create_app`` in a thread of this process, and a closed-loop client
(lsr.benchmarks.loadgen) runs in a separate process with C keep-alive connections, each sending one query per
request and the next as soon as the answer arrives. Query sets: ``synth`` (pre-encoded synthetic query
vectors, term-id keys), ``real`` (the 6,980 SPLADE++ ED dev-small query vectors), ``text`` (MS MARCO dev-small
query texts encoded by the server with --model, whose vocabulary must be BERT's 30522 word pieces).

Per (query set, max_batch, concurrency): QPS, client latency p50/p90/p99 (ms), the server's mean batch size
and time per batch in its worker thread (encode + search + answers) with its stages (``tokenize_ms``,
``encode_ms``, ``search_ms``, ``answers_ms``, ``json_ms``: mean ms per batch, from /stats), peak extra GPU memory; over the answers to the first --check requests: ``exact`` (vector queries: each
answer keeps lsr's exact top-k contract against a float64 brute force, lsr.testing.topk_violations) and
``same_as_alone``, the fraction identical byte for byte to the request searched alone (batch invariance; a
text query's encoding also depends on its batch's padding). Summary: per query set and max_batch the
highest QPS whose p99 <= --slo-ms.

Where the server's CPU goes, per level: ``loop_cores`` / ``loop_us_per_req`` (uvicorn's event loop: HTTP, JSON,
dispatch; it holds the interpreter lock while busy, so 1e6 / loop_us_per_req bounds one process's QPS),
``device_us_per_req`` (the replicas' device threads), ``process_us_per_req`` (the whole server process).

Several GPUs (``--replicas 1,4``): per W, one server over the first W devices (``create_app(devices=...)``: one
index replica and query encoder per GPU behind one endpoint), loaded with W times each --concurrency level (the
levels are per replica); each row has ``replicas`` and the requests each replica answered. The client runs in
--client-procs processes side by side (one Python process cannot send what four GPUs answer). The last table:
per W the best QPS within the p99 bound and its ratio to W = 1. ``--modes threads,processes`` also serves W
``lsr serve --device cuda:i`` processes side by side, one port each (the clients take the ports in turn): what
one process per GPU would give, against the replicas as threads of one process.
Writes OUT/bench_serve.json and .csv (lsr.benchmarks.harness schema), OUT/bench_serve.png with --plot; prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lsr.benchmarks.harness import PeakMemory, Results, environment, format_table, quantiles, synchronize
from lsr.benchmarks.loadgen import merge_loads, run_load
from lsr.benchmarks.servers import HOST, ProcessServers, ThreadServer
from lsr.benchmarks.synth import SynthSpec, describe, synth_docs, synth_queries
from lsr.benchmarks.threadcpu import thread_cpu_seconds
from lsr.index.inverted import InvertedIndex
from lsr.serve.engine import SearchRequest
from lsr.sparse import SparseVectors
from lsr.testing import topk_violations

REPO = Path(__file__).resolve().parents[1]
REAL_QUERIES = REPO / "data/msmarco-passage/splade-encoded-queries/topics.msmarco-passage.dev-subset.splade-pp-ed.tsv.gz"
VOCAB = REPO / "data/bert-base-uncased/vocab.txt"
TEXTS = REPO / "data/msmarco-passage/topics.msmarco-passage.dev-subset.txt"


def parse_size(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "km" else s) * mult)


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def query_set(name: str, n: int, spec: SynthSpec, ks: list[int]) -> tuple[list[bytes], list[SearchRequest]]:
    """Request bodies (one query each; request i asks for ks[i % len(ks)] hits) and the same requests
    parsed, for the reference answers."""
    if name == "text":
        texts = [line.split("\t", 1)[1].strip() for line in TEXTS.read_text().splitlines()[:n]]
        return [json.dumps({"query": t, "k": ks[i % len(ks)]}).encode() for i, t in enumerate(texts)], \
            [SearchRequest([t], None, ks[i % len(ks)]) for i, t in enumerate(texts)]
    if name == "real":
        from lsr.interop.anserini import read_anserini_queries

        vectors = read_anserini_queries(REAL_QUERIES, VOCAB)[:n]
    else:
        vectors = synth_queries(n, spec, device="cpu")
    rows = vectors.to_dicts()
    bodies = [json.dumps({"vectors": [{str(t): w for t, w in row.items()}], "k": ks[i % len(ks)]}).encode()
              for i, row in enumerate(rows)]
    return bodies, [SearchRequest(None, vectors[i:i + 1], ks[i % len(ks)]) for i in range(len(rows))]


def reference_answers(engine, requests: list[SearchRequest], keep: int) -> list[str]:
    """The answer to each of the first ``keep`` requests searched alone (the unbatched path)."""
    return [json.dumps(engine.run_batch([r])[0], separators=(",", ":")) for r in requests[:keep]]


def doc_index(docnos: list[str], docno: str) -> int:
    """The doc index of a synthetic docno ("d<index>")."""
    i = int(docno.lstrip("d"))
    if docnos[i] != docno:
        raise ValueError(f"docno {docno!r} is not lsr.benchmarks.synth's d<index>")
    return i


def exact_failures(engine, requests: list[SearchRequest], answers: dict[int, str]) -> int:
    """Checked answers that break the exact top-k contract against float64 brute force (vector queries)."""
    bad = 0
    for i, text in answers.items():
        k = requests[i].k
        hits = json.loads(text)["results"][0]
        idx = torch.full((k,), -1, dtype=torch.int64)
        scores = torch.zeros(k, dtype=torch.float32)
        idx[:len(hits["docnos"])] = torch.tensor([doc_index(engine.index.docnos, d) for d in hits["docnos"]])
        scores[:len(hits["scores"])] = torch.tensor(hits["scores"], dtype=torch.float32)
        bad += bool(topk_violations(scores, idx, float64_scores(engine.index, requests[i].vectors), k))
    return bad


def float64_scores(index: InvertedIndex, query: SparseVectors) -> torch.Tensor:
    """float64 [N] scores of one query, term at a time over the postings (no [N, V] copy of the documents)."""
    acc = torch.zeros(index.n_docs, dtype=torch.float64, device=index.device)
    for t, w in zip(query.indices.tolist(), query.values.tolist()):
        doc, score = index.term_postings(t)
        acc.index_add_(0, doc.long(), score.double(), alpha=w)
    return acc


def client_load(pool, ports: list[int], bodies, concurrency: int, args, keep: int) -> dict:
    """The closed-loop load from --client-procs processes side by side (``concurrency`` clients in all; with
    several server ports, the processes take them in turn)."""
    procs = max(len(ports), min(args.client_procs, concurrency))
    shares = [concurrency // procs + (p < concurrency % procs) for p in range(procs)]
    offsets = [sum(shares[:p]) for p in range(procs)]
    jobs = [(HOST, ports[p % len(ports)], bodies, c, args.duration_s, args.warmup_s, keep, "/search", o)
            for p, (c, o) in enumerate(zip(shares, offsets))]
    return merge_loads(pool.starmap(run_load, jobs, chunksize=1))


# the server's threads: uvicorn's event loop (ThreadServer) and the replicas' device threads (lsr.serve.batcher)
THREADS = {"loop": "uvicorn", "device": "lsr-serve_"}


def server_cpu(server) -> dict:
    """CPU seconds so far: of the event loop, device threads and whole process where the server is a thread of
    this one; of the server processes (as "process") where each replica has its own."""
    if isinstance(server, ProcessServers):
        return {"process": server.cpu_seconds()}
    return thread_cpu_seconds(THREADS)


def cpu_columns(before: dict, after: dict, wall_s: float, answered: int) -> dict:
    """Cores busy (CPU s / wall s) and CPU µs per answered request of the event loop, the device threads and the
    whole server process (or processes) during a level (the client runs in other processes)."""
    out = {}
    for name in after:
        cpu = after[name] - before[name]
        out[f"{name}_cores"] = round(cpu / wall_s, 3)
        out[f"{name}_us_per_req"] = round(cpu * 1e6 / answered, 1) if answered else None
    return out


def run_level(results: Results, server, pool, bodies, requests, refs, base_row: dict, args, engine) -> dict:
    before = server.stats()
    cpu0, t0 = server_cpu(server), time.perf_counter()
    with PeakMemory() as peak:
        load = client_load(pool, server.ports, bodies, base_row["concurrency"], args, len(refs))
    cpu = cpu_columns(cpu0, server_cpu(server), time.perf_counter() - t0, load["sent"])
    after = server.stats()
    lat = sorted(load["latencies_ms"])
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None  # noqa: E731
    batches = after["batches"] - before["batches"]
    same = [load["answers"][i] == refs[i] for i in map(int, load["answers"])]
    row = {**base_row, **quantiles(lat), "qps": load["qps"], "p50_ms": pick(0.5), "p99_ms": pick(0.99),
           "max_ms": lat[-1] if lat else None, "peak_extra_mb": peak.extra_mb, "errors": load["errors"],
           "mean_batch": (after["queries"] - before["queries"]) / batches if batches else None,
           "batch_ms": (after["device_busy_s"] - before["device_busy_s"]) * 1000 / batches if batches else None,
           "max_batch_seen": after["max_batch_queries"], "checked": len(same),
           "same_as_alone": sum(same) / len(same) if same else None,
           "error": load["first_error"] if load["errors"] else None, **stage_means(before, after),
           "query_graphs_held": (after.get("query_graphs") or {}).get("held"), **gc_columns(before, after),
           "client_gc_full": load.get("client_gc_full"),
           "replica_requests": [a["requests"] - b["requests"] for a, b in zip(after["replicas"], before["replicas"])],
           **cpu}
    if base_row["queries"] != "text" and same:
        row["exact_fail"] = exact_failures(engine, requests, load["answers"])
        row["exact"] = row["exact_fail"] == 0
    return results.add(row)


def gc_columns(before: dict, after: dict) -> dict:
    """Full (generation 2) garbage collections in the server process during the level, their summed pause
    (ms), the longest pause of any collection since the server started, and the search graphs captured and
    CUDA kernel variants compiled during the level (``new_*``: each stalls a batch)."""
    b, a = before.get("gc") or {}, after.get("gc") or {}
    if not a:
        return {}
    cb, ca = before.get("compiled") or {}, after.get("compiled") or {}
    return {"gc_full": a["collections"][2] - b["collections"][2],
            "gc_full_ms": round(a["pause_ms"][2] - b["pause_ms"][2], 2), "gc_max_pause_ms": max(a["max_pause_ms"]),
            **{f"new_{key}": ca[key] - cb.get(key, 0) for key in ca}}


def stage_means(before: dict, after: dict) -> dict:
    """Mean ms per batch of each worker-thread stage over the level (``/stats`` totals before and after)."""
    n = after.get("stage_batches", 0) - before.get("stage_batches", 0)
    if n <= 0:
        return {}
    old = before.get("stage_ms_total", {})
    return {f"{k}_ms": (v - old.get(k, 0.0)) / n for k, v in after.get("stage_ms_total", {}).items()}


def run_levels(results: Results, server, engine, pool, bodies, requests, base: dict, args, t_start: float) -> None:
    """Load ``server`` at every --concurrency level (within the time budget), then stop it; ``engine``: an
    engine on the same index, for the answers of requests searched alone and the exactness check."""
    try:
        refs = reference_answers(engine, requests, args.check)
        for c in (c * base.get("replicas", 1) for c in ints(args.concurrency)):   # levels are per replica
            if time.time() - t_start > args.budget_s:
                results.add({**base, "concurrency": c, "status": "skipped: budget"})
                continue
            run_level(results, server, pool, bodies, requests, refs, {**base, "concurrency": c}, args, engine)
    finally:
        server.stop()


def summarize(rows: list[dict], slo_ms: float) -> dict:
    """Per query set and max_batch: the best QPS with p99 <= slo_ms (and its concurrency)."""
    out: dict = {}
    for r in rows:
        if r.get("qps") is None or r.get("p99_ms") is None or r["p99_ms"] > slo_ms or r.get("errors"):
            continue
        key = f"{r['queries']}/{r.get('mode', 'threads')}/max_batch={r['max_batch']}" + \
            ("/pipeline" if r.get("pipeline", 0) else "") + \
            ("/gc-not-frozen" if r.get("freeze_gc") == 0 else "") + f"/replicas={r.get('replicas', 1)}"
        if r["qps"] > out.get(key, {}).get("qps", -1):
            out[key] = {"qps": round(r["qps"], 1), "p99_ms": round(r["p99_ms"], 3), "concurrency": r["concurrency"],
                        "mean_batch": r["mean_batch"], "replicas": r.get("replicas", 1)}
    return out


def scaling(best: dict) -> list[dict]:
    """Per setting and replica count W, the best QPS within the bound and its ratio to W = 1 of that setting."""
    rows = []
    for key, r in sorted(best.items()):
        setting = key.rsplit("/replicas=", 1)[0]
        one = best.get(f"{setting}/replicas=1", {}).get("qps")
        rows.append({"setting": setting, "replicas": r["replicas"], "qps_within_slo": r["qps"], "p99_ms": r["p99_ms"],
                     "concurrency": r["concurrency"], "vs_1": round(r["qps"] / one, 2) if one else None})
    return rows


def plot(rows: list[dict], slo_ms: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))

    def series(r: dict) -> tuple:
        return r["queries"], r["max_batch"], r.get("pipeline", 0)

    for key in sorted({series(r) for r in rows if r.get("qps")}):
        pts = [(r["qps"], r["p99_ms"]) for r in rows if series(r) == key and r.get("p99_ms")]
        ax.plot(*zip(*pts), marker="o", label=f"{key[0]}, max_batch={key[1]}" + (", pipeline" if key[2] else ""))
    ax.axhline(slo_ms, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("QPS (closed loop, one query per request)")
    ax.set_ylabel("client p99 latency (ms)")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-docs", default="8.8m")
    ap.add_argument("--queries", default="synth,text", help="query sets: synth, real, text")
    ap.add_argument("--model", default=str(REPO / "data/models/splade-tiny"), help="query encoder for 'text'")
    ap.add_argument("--n-queries", type=int, default=2000, help="distinct requests per query set")
    ap.add_argument("--concurrency", default="1,4,16,32,64,128,256")
    ap.add_argument("--max-batch", default="1,64", help="server settings to compare (1 = batching off)")
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--k", default="10", help="hits per request; a list (e.g. 10,100) cycles over the requests "
                    "(the server's default k, the one its warm-up uses, is the first)")
    ap.add_argument("--duration-s", type=float, default=6.0, help="measured seconds per level")
    ap.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured seconds before each level")
    ap.add_argument("--check", type=int, default=100, help="requests whose answers are checked")
    ap.add_argument("--slo-ms", type=float, default=20.0)
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting levels after this many seconds")
    ap.add_argument("--switch-interval-ms", type=float, default=0.5,
                    help="the interpreter's thread switch interval (lsr serve's setting; Python's default is 5)")
    ap.add_argument("--pipeline", default="0", help="server settings to compare: 1 = tokenizing and answers on a "
                    "second thread, overlapping the device work; 0 = all in the device thread (lsr serve's default)")
    ap.add_argument("--freeze-gc", default="1", help="server settings to compare: 1 = objects alive after warm-up "
                    "frozen for the garbage collector (lsr.serve.gcwatch, the default), 0 = not")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--replicas", default="1", help="servers to compare by replica count W: the first W GPUs "
                    "(cuda:0..W-1) behind one endpoint; on --device cpu, W CPU replicas. The --concurrency levels are "
                    "per replica")
    ap.add_argument("--modes", default="threads", help="how the replicas run, to compare: threads (lsr serve "
                    "--devices: one process) and/or processes (one lsr serve per device, each on its own port)")
    ap.add_argument("--client-procs", type=int, default=4, help="client processes side by side (the clients of a "
                    "level are shared out among them)")
    ap.add_argument("--plot", action="store_true", help="also write OUT/bench_serve.png")
    ap.add_argument("--quick", action="store_true", help="small CPU-sized run: 20k docs, 200 requests, 3 levels of 1.5 s")
    args = ap.parse_args()
    if args.quick:  # smaller defaults; options given on the command line win
        quick = {"n_docs": "20k", "n_queries": 200, "concurrency": "1,8,32", "duration_s": 1.5, "warmup_s": 0.3,
                 "check": 20, "client_procs": 1}
        for key, value in quick.items():
            if getattr(args, key) == ap.get_default(key):
                setattr(args, key, value)
    return args


def main() -> None:
    args = parse_args()
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    t_start = time.time()
    dev = torch.device(args.device)
    spec = SynthSpec() if dev.type == "cuda" else SynthSpec(block_rows=4096)
    env = environment(dev, uvloop=_has("uvloop"), httptools=_has("httptools"))
    results = Results(args.out, "bench_serve", env, {"args": vars(args), "synth": describe(spec)})
    t0 = time.time()
    index = InvertedIndex.build(synth_docs(parse_size(args.n_docs), spec, device=dev), device=dev)
    synchronize()
    results.config["index"] = {"n_docs": index.n_docs, "n_postings": index.n_postings,
                               "gib": index.memory_bytes() / 2**30, "build_s": time.time() - t0}
    print(f"index: {index.n_docs} docs, {index.n_postings} postings, built in {time.time() - t0:.1f}s", flush=True)
    args.saved_index = None
    try:
        with mp.get_context("spawn").Pool(max(1, args.client_procs, *ints(args.replicas))) as pool:
            for qname in args.queries.split(","):
                run_query_set(results, index, pool, qname, spec, dev, args, t_start)
    finally:
        if args.saved_index is not None:
            shutil.rmtree(args.saved_index.parent, ignore_errors=True)
    best = summarize(results.rows, args.slo_ms)
    results.summary = {"best_within_slo": best, "scaling": scaling(best), "slo_ms": args.slo_ms,
                       "elapsed_s": time.time() - t_start}
    results.save()
    if args.plot:
        plot(results.rows, args.slo_ms, Path(args.out) / "bench_serve.png")
    print()
    print(format_table(results.rows, ["method", "queries", "mode", "replicas", "max_batch", "pipeline", "freeze_gc", "concurrency",
                                      ("qps", ".0f"), ("p50_ms", ".2f"), ("p99_ms", ".2f"), ("max_ms", ".1f"), "gc_full",
                                      ("gc_full_ms", ".1f"), ("mean_batch", ".1f"), ("batch_ms", ".2f"), ("tokenize_ms", ".2f"),
                                      ("encode_ms", ".2f"), ("search_ms", ".2f"), ("answers_ms", ".2f"), ("json_ms", ".2f"),
                                      "replica_requests", ("loop_cores", ".2f"), ("loop_us_per_req", ".0f"),
                                      ("device_us_per_req", ".0f"), ("process_us_per_req", ".0f"), "errors", "exact", ("same_as_alone", ".2f")]))
    print(json.dumps(results.summary, indent=1))
    print(f"\nQPS within p99 <= {args.slo_ms:g} ms by replica count ({Path(args.out) / 'bench_serve.json'}):")
    print(format_table(results.summary["scaling"], ["setting", "replicas", ("qps_within_slo", ".0f"), ("p99_ms", ".2f"),
                                                    "concurrency", ("vs_1", ".2f")]))


def replica_devices(dev: torch.device, n: int) -> list[str]:
    """The first ``n`` GPUs (cuda:0..n-1), or ``n`` CPU replicas."""
    if dev.type != "cuda":
        return ["cpu"] * n
    if n > torch.cuda.device_count():
        raise SystemExit(f"--replicas {n}: this machine shows {torch.cuda.device_count()} GPUs")
    return [f"cuda:{i}" for i in range(n)]


def run_query_set(results: Results, index: InvertedIndex, pool, qname: str, spec: SynthSpec, dev: torch.device,
                  args, t_start: float) -> None:
    """Every server setting (mode x replicas x max_batch x pipeline x freeze_gc) loaded with one query set."""
    bodies, requests = query_set(qname, args.n_queries, spec, ints(args.k))
    k_column = int(args.k) if len(ints(args.k)) == 1 else args.k   # a list of k's stays its string
    settings = [(m, w, b, p, f) for m in args.modes.split(",") for w in ints(args.replicas) for b in ints(args.max_batch)
                for p in ints(args.pipeline) for f in ints(args.freeze_gc)]
    for mode, replicas, max_batch, pipeline, freeze in settings:
        if time.time() - t_start > args.budget_s:
            results.add({"method": f"max_batch={max_batch}", "queries": qname, "mode": mode, "replicas": replicas,
                         "status": "skipped: budget"})
            continue
        base = {"method": "batched" if max_batch > 1 else "unbatched", "queries": qname, "n_docs": index.n_docs,
                "k": k_column, "max_batch": max_batch, "pipeline": pipeline, "freeze_gc": freeze,
                "max_wait_ms": args.max_wait_ms, "mode": mode, "replicas": replicas}
        model = args.model if qname == "text" else None
        t0 = time.time()
        server, engine = start_server(mode, index, model, replica_devices(dev, replicas), (max_batch, pipeline, freeze),
                                      args)
        base["startup_s"] = round(time.time() - t0, 2)
        run_levels(results, server, engine, pool, bodies, requests, base, args, t_start)
        del server, engine
        gc.collect()   # the replicas' index copies and graphs go before the next server's are made
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def start_server(mode: str, index: InvertedIndex, model: str | None, devices: list[str], setting: tuple, args):
    """The server of one setting, and an engine on the same index for the reference answers: ``threads``, every
    replica in this process (``create_app(devices=...)``); ``processes``, one ``lsr serve`` process per device
    over the index saved once to a temporary folder (removed at the end of the run)."""
    from lsr.serve.app import create_app
    from lsr.serve.engine import SearchEngine

    max_batch, pipeline, freeze = setting
    k0 = ints(args.k)[0]
    if mode == "threads":
        where = {"device": devices[0]} if len(devices) == 1 else {"devices": devices}
        app = create_app(index, model, max_batch=max_batch, max_wait_ms=args.max_wait_ms, k=k0,
                         pipeline=bool(pipeline), freeze_gc=bool(freeze), **where)
        return ThreadServer(app), app.state.engine
    if mode != "processes":
        raise SystemExit(f"--modes: unknown mode {mode!r}; use threads, processes")
    if args.saved_index is None:
        args.saved_index = Path(tempfile.mkdtemp(prefix="lsr-bench-serve-")) / "index"
        index.save(args.saved_index)
    saved = args.saved_index
    flags = ["--max-batch", str(max_batch), "--max-wait-ms", str(args.max_wait_ms), "--k", str(k0),
             "--switch-interval-ms", str(args.switch_interval_ms), *(["--pipeline"] if pipeline else []),
             *([] if freeze else ["--no-freeze-gc"])]
    return ProcessServers(saved, model, devices, flags, Path(args.out)), SearchEngine(index, model, device=str(index.device),
                                                                                      k=k0)


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
