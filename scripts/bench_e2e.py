"""End-to-end dev-small benchmark: search + run writing + evaluation for the 6,980 real SPLADE++ ED
dev-small query vectors against a synthetic MS MARCO-sized index (vectors given, no encoding).

    PYTHONPATH=. python scripts/bench_e2e.py --out OUT [--n-docs 8841823] [--k 1000]

Documents come from lsr.benchmarks.synth (seeded, on the GPU) with docnos "0".."N-1" (the MS MARCO passage id
space), so the run is a well-formed dev-small run and evaluation does its real work against the
real qrels (the metric values themselves are meaningless on synthetic documents).
Timed, wall clock, after one warm-up pass: Searcher.search (default path) -> TREC + MS MARCO run files
(runs.write_topk) -> RR@10 / nDCG@10 / R@1000 (lsr.evaluation.topk.evaluate_topk). Baseline in the same run:
the same search output through the generic path (runs.from_topk dict -> runs.write_trec ->
ir_measures.calc_aggregate). Writes OUT/bench_e2e_BACKEND.json + .csv (lsr.benchmarks.harness schema) and prints a short
table last.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lsr.benchmarks.harness import PeakMemory, Results, environment, timed  # noqa: E402
from lsr.benchmarks.synth import SynthSpec, synth_docs  # noqa: E402
from lsr.data import runs  # noqa: E402
from lsr.data.sources import load_dataset  # noqa: E402
from lsr.evaluation.topk import evaluate_topk  # noqa: E402
from lsr.index.inverted import InvertedIndex  # noqa: E402
from lsr.interop.anserini import read_anserini_queries  # noqa: E402
from lsr.search.searcher import Searcher  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QUERIES = REPO / "data/msmarco-passage/splade-encoded-queries/topics.msmarco-passage.dev-subset.splade-pp-ed.tsv.gz"
VOCAB = REPO / "data/bert-base-uncased/vocab.txt"
METRICS = ("RR@10", "nDCG@10", "R@1000")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-docs", type=int, default=8_841_823)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--query-batch", type=int, default=None, help="Searcher query_batch (default: its own)")
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "gpu"))
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
    with PeakMemory() as peak:
        (scores, doc_idx), t["search"] = timed(lambda: searcher.search(qdev, k=args.k, query_batch=args.query_batch))
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

    results = Results(out, f"bench_e2e_{args.backend}", environment(dev), {
        "n_docs": args.n_docs, "n_queries": len(queries), "k": args.k, "backend": searcher.backend})
    results.summary = {
        "setup_s": {"synth": t_gen, "index_build": t_build, "read_queries": t_read},
        "timed_s": t, "total_s": total, "search_qps": len(queries) / t["search"],
        "peak_extra_mb": peak.extra_mb, "bit_identical_rerun": identical,
        "metrics": metrics, "baseline_s": {k: v for k, v in base.items() if k != "metrics"},
        "baseline_metrics": base.get("metrics"),
    }
    for name, seconds in t.items():
        results.add({"method": "lsr", "step": name, "ms": seconds * 1000, "repeats": 1,
                     "bit_identical": identical if name == "search" else None}, echo=False)
    for name, seconds in results.summary["baseline_s"].items():
        results.add({"method": "baseline", "step": name, "ms": seconds * 1000, "repeats": 1}, echo=False)
    print(f"\n{'step':<22}{'seconds':>10}")
    for k, v in {**{"index build (setup)": t_build}, **t}.items():
        print(f"{k:<22}{v:>10.3f}")
    print(f"{'TOTAL search+runs+eval':<22}{total:>10.3f}   target <= 3 s")
    if base:
        b = sum(v for k, v in base.items() if k != "metrics")
        print(f"{'baseline runs+eval':<22}{b:>10.3f}   (dict run + write_trec + ir_measures)")
        same = all(abs(metrics[m] - base["metrics"][m]) < 1e-9 for m in METRICS)
        print(f"metrics equal to ir_measures: {same}")
    print(f"search QPS {results.summary['search_qps']:.0f}, peak extra GPU {peak.extra_mb or 0:.0f} MB, "
          f"bit-identical rerun: {identical}")


if __name__ == "__main__":
    main()
