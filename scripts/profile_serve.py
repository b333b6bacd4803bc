"""Where does a served batch's time go? The server's work for one batch, stage by stage, without HTTP.

    PYTHONPATH=. python scripts/profile_serve.py --out OUT [--n-docs 8.8m] [--model data/models/splade-tiny]
        [--batches 1,8,32,64] [--repeats 30] [--k 10]

On the index bench_serve.py builds (lsr.synth documents, seeded, on the device) and MS MARCO dev-small query
texts, per batch size B (median of --repeats, CUDA synchronised after every stage):

* ``prepare_ms``: ``encoder.prepare(texts, "query")`` (tokenize, sort, pad; the host part of encoding);
* ``encode_prepared_ms``: ``encoder.encode_prepared`` on that (backbone + head + extraction, vectors on the host);
* ``encode_query_ms``: ``encoder.encode_query(texts)`` (both of the above, as the server calls it);
* ``search_ms``: ``engine._stack`` + ``Searcher.search`` + copy of the top-k to the host, on pre-encoded vectors;
* ``run_batch_ms``: ``SearchEngine.run_batch`` (encode + search + answers as dicts), what the worker thread runs;
* ``json_ms``: the answers serialised as the app does.

Then one ``torch.profiler`` trace of ``encode_query`` at the largest B: the ops with the most host time and the
GPU kernels' total time, so host-bound and GPU-bound parts can be told apart. Writes OUT/profile_serve.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from bench_serve import TEXTS, parse_size  # noqa: E402

from lsr.bench import environment, synchronize  # noqa: E402
from lsr.index.inverted import InvertedIndex  # noqa: E402
from lsr.serve.engine import SearchEngine, SearchRequest  # noqa: E402
from lsr.synth import SynthSpec, synth_docs  # noqa: E402


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


def stage_times(engine: SearchEngine, texts: list[str], repeats: int, k: int) -> dict:
    enc = engine.encoder
    row: dict = {"batch": len(texts)}
    row["prepare_ms"], prepared = timed(lambda: enc.prepare(texts, "query"), repeats)
    row["encode_prepared_ms"], _ = timed(lambda: enc.encode_prepared(prepared), repeats)
    row["encode_query_ms"], vectors = timed(lambda: enc.encode_query(texts), repeats)

    def search() -> object:
        q = engine._stack([vectors], len(texts))
        scores, idx = engine.searcher.search(q, k=k, show_progress_bar=False)
        return scores.cpu(), idx.cpu()

    row["search_ms"], _ = timed(search, repeats)
    requests = [SearchRequest([t], None, k) for t in texts]
    row["run_batch_ms"], answers = timed(lambda: engine.run_batch(requests), repeats)
    row["json_ms"], _ = timed(lambda: [json.dumps(a, separators=(",", ":")).encode() for a in answers], repeats)
    return row


def profile_encode(engine: SearchEngine, texts: list[str]) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(5):
            engine.encoder.encode_query(texts)
        synchronize()
    events = prof.key_averages()
    host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:20]
    gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in events) / 5
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")) / 5
    return {"gpu_us_per_call": gpu_us, "kernel_launches_per_call": launches,
            "top_host_ops": [{"op": e.key, "calls": e.count / 5, "self_cpu_us_per_call": e.self_cpu_time_total / 5}
                             for e in host]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench_results/profile_serve"))
    ap.add_argument("--n-docs", default="8.8m")
    ap.add_argument("--model", default="data/models/splade-tiny")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    spec = SynthSpec() if dev.type == "cuda" else SynthSpec(block_rows=4096)
    index = InvertedIndex.build(synth_docs(parse_size(args.n_docs), spec, device=dev), device=dev)
    engine = SearchEngine(index, args.model, device=str(dev), k=args.k)
    engine.warmup(max(int(b) for b in args.batches.split(",")))
    texts = [line.split("\t", 1)[1].strip() for line in TEXTS.read_text().splitlines()]
    out: dict = {"env": environment(dev), "args": vars(args) | {"out": str(args.out)}, "rows": []}
    for b in (int(x) for x in args.batches.split(",")):
        engine.run_batch([SearchRequest(texts[:b], None, args.k)])  # first call of this shape: compile, capture
        row = stage_times(engine, texts[b:2 * b], args.repeats, args.k)
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    out["profile"] = profile_encode(engine, texts[:max(r["batch"] for r in out["rows"])])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_serve.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out["profile"], indent=1))
    cols = ["batch", "prepare_ms", "encode_prepared_ms", "encode_query_ms", "search_ms", "run_batch_ms", "json_ms"]
    print(" | ".join(cols))
    for r in out["rows"]:
        print(" | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols))


if __name__ == "__main__":
    main()
