"""End-to-end dev-small benchmark: search + run writing + evaluation for the 6,980 real SPLADE++ ED
dev-small query vectors against a synthetic MS MARCO-sized index (vectors given, no encoding).

    PYTHONPATH=. python scripts/bench_e2e.py --out OUT [--n-docs 8841823] [--k 1000]

Documents come from lsr.synth (seeded, on the GPU) with docnos "0".."N-1" (the MS MARCO passage id
space), so the run is a well-formed dev-small run and evaluation does its real work against the
real qrels (the metric values themselves are meaningless on synthetic documents).
Timed, wall clock, after one warm-up pass: Searcher.search (default path) -> TREC + MS MARCO run files
(runs.write_topk) -> RR@10 / nDCG@10 / R@1000 (topk_metrics.evaluate_topk). Baseline in the same run:
the same search output through the generic path (runs.from_topk dict -> runs.write_trec ->
ir_measures.calc_aggregate). Writes OUT/bench_e2e.json and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lsr import runs  # noqa: E402
from lsr.data import load_dataset  # noqa: E402
from lsr.evaluation.topk import evaluate_topk  # noqa: E402
from lsr.index.inverted import InvertedIndex  # noqa: E402
from lsr.interop.anserini import read_anserini_queries  # noqa: E402
from lsr.search.searcher import Searcher  # noqa: E402
from lsr.synth import SynthSpec, synth_docs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QUERIES = REPO / "data/msmarco-passage/splade-encoded-queries/topics.msmarco-passage.dev-subset.splade-pp-ed.tsv.gz"
VOCAB = REPO / "data/bert-base-uncased/vocab.txt"
METRICS = ("RR@10", "nDCG@10", "R@1000")


def commit() -> str:
    if os.environ.get("LSR_COMMIT"):
        return os.environ["LSR_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def timed(fn, sync: bool = True):
    if sync and torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if sync and torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-docs", type=int, default=8_841_823)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--query-batch", type=int, default=None, help="Searcher query_batch (default: its own)")
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = args.device

    docs, t_gen = timed(lambda: synth_docs(args.n_docs, SynthSpec(), device=dev))
    index, t_build = timed(lambda: InvertedIndex.build(docs, device=dev))
    queries, t_read = timed(lambda: read_anserini_queries(QUERIES, VOCAB), sync=False)
    qrels = load_dataset("msmarco-passage/dev/small").qrels
    import pyarrow as pa

    docnos = pa.array(index.docnos, pa.string())  # as loaded from docnos.arrow: one Arrow column
    searcher = Searcher(index, device=dev, backend=args.backend)
    qdev = queries.to(dev)
    # warm-up on the whole query set: every batch shape compiles / autotunes outside the timing
    searcher.search(qdev, k=args.k, query_batch=args.query_batch)

    tmp = Path(tempfile.mkdtemp())
    t = {}
    torch.cuda.reset_peak_memory_stats() if dev.startswith("cuda") else None
    base_mem = torch.cuda.memory_allocated() if dev.startswith("cuda") else 0
    (scores, doc_idx), t["search"] = timed(lambda: searcher.search(qdev, k=args.k, query_batch=args.query_batch))
    peak = (torch.cuda.max_memory_allocated() - base_mem) if dev.startswith("cuda") else 0
    (s_cpu, i_cpu), t["to_host"] = timed(lambda: (scores.cpu(), doc_idx.cpu()))
    _, t["write_runs"] = timed(lambda: runs.write_topk({"trec": tmp / "run.trec", "msmarco": tmp / "run.msmarco.tsv"},
                                                       queries.ids, docnos, s_cpu, i_cpu), sync=False)
    metrics, t["evaluate"] = timed(lambda: evaluate_topk(queries.ids, i_cpu, docnos, qrels, METRICS), sync=False)
    total = sum(t.values())
    (scores2, doc_idx2), _ = timed(lambda: searcher.search(qdev, k=args.k, query_batch=args.query_batch))
    identical = bool(torch.equal(scores, scores2) and torch.equal(doc_idx, doc_idx2))

    base = {}
    if args.baseline:
        import ir_measures

        names = index.docnos
        run, base["from_topk"] = timed(lambda: runs.from_topk(queries.ids, names, s_cpu, i_cpu), sync=False)
        _, base["write_trec"] = timed(lambda: runs.write_trec(run, tmp / "base.trec"), sync=False)
        parsed = [ir_measures.parse_measure(m) for m in METRICS]
        agg, base["ir_measures"] = timed(lambda: ir_measures.calc_aggregate(parsed, qrels, run), sync=False)
        base["metrics"] = {str(m): float(v) for m, v in agg.items()}

    result = {
        "meta": {"gpu": torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu",
                 "torch": torch.__version__, "triton": _triton_version(), "commit": commit(),
                 "n_docs": args.n_docs, "n_queries": len(queries), "k": args.k, "backend": searcher.backend},
        "setup_s": {"synth": t_gen, "index_build": t_build, "read_queries": t_read},
        "timed_s": t, "total_s": total, "search_qps": len(queries) / t["search"],
        "peak_extra_gpu_bytes": peak, "bit_identical_rerun": identical,
        "metrics": metrics, "baseline_s": {k: v for k, v in base.items() if k != "metrics"},
        "baseline_metrics": base.get("metrics"),
    }
    (out / f"bench_e2e_{args.backend}.json").write_text(json.dumps(result, indent=1))
    print(f"\n{'step':<22}{'seconds':>10}")
    for k, v in {**{"index build (setup)": t_build}, **t}.items():
        print(f"{k:<22}{v:>10.3f}")
    print(f"{'TOTAL search+runs+eval':<22}{total:>10.3f}   target <= 3 s")
    if base:
        b = sum(v for k, v in base.items() if k != "metrics")
        print(f"{'baseline runs+eval':<22}{b:>10.3f}   (dict run + write_trec + ir_measures)")
        same = all(abs(metrics[m] - base["metrics"][m]) < 1e-9 for m in METRICS)
        print(f"metrics equal to ir_measures: {same}")
    print(f"search QPS {result['search_qps']:.0f}, peak extra GPU {peak / 2**30:.2f} GiB, bit-identical rerun: {identical}")


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "n/a"


if __name__ == "__main__":
    main()
