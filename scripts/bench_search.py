"""Benchmark exact top-k search on the GPU: lsr's gpu backend routes against the seed and torch baselines.

    PYTHONPATH=. python scripts/bench_search.py --out OUT [--sizes 100k,1m,8.8m] [--batches 1,64,500]
        [--ks 10,1000] [--queries synth,real] [--terms random,real] [--npz VECTORS.npz] [--sweep "triton.span=2048,triton.rows=32;triton.rows=8,triton.per_sm=4"]
        [--postings float32,compact]

Documents: lsr.benchmarks.synth (seeded, generated on the GPU) or --npz CSR vectors (keys doc_indptr, doc_terms,
doc_weights, q_indptr, q_terms, q_weights). Queries: synthetic ones and/or the 6,980 real SPLADE++ ED
dev-small query vectors (Anserini format, weight = count / 1000). Per case: ms per batch (CUDA events,
median of --repeats after a warm-up, a different query window each repeat), QPS, peak extra GPU memory,
bit-identical repeat, exactness against a float64 brute force on a query subset; B=1 also gives p50
single-query wall-clock latency. Baselines in the same run: the seed's term-parallel float32 atomic
scatter + torch.topk, torch index_add_ per query term (SPARe-style), torch.sparse.mm + topk.
``--postings float32,compact`` indexes the same collection in both posting layouts (its weights rounded
to bf16 first, so the compact layout holds them exactly; lsr.index.compact) and runs the lsr methods on
each: rows carry ``postings``, ``bytes_per_posting`` (term-major arrays per real posting) and the
collection entries the build time and byte counts per layout.
Writes OUT/bench_search.json (meta + rows) and OUT/bench_search.csv; prints a short table last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lsr.benchmarks.harness import PeakMemory, Results, environment, format_table, quantiles, synchronize, time_calls, timed
from lsr.benchmarks.synth import (
    SynthSpec,
    describe,
    load_npz,
    ranking_from_queries,
    synth_docs,
    synth_queries,
    synth_stats,
)
from lsr.config import search_config_from_overrides
from lsr.index.compact import decode_postings
from lsr.index.inverted import InvertedIndex
from lsr.search.config import SearchConfig
from lsr.search.gpu_search import gpu_search
from lsr.search.kernels.scatter import triton_scatter_scores
from lsr.sparse import SparseVectors
from lsr.testing import rounded_weights, topk_violations

REPO = Path(__file__).resolve().parents[1]
REAL_QUERIES = REPO / "data/msmarco-passage/splade-encoded-queries/topics.msmarco-passage.dev-subset.splade-pp-ed.tsv.gz"
VOCAB = REPO / "data/bert-base-uncased/vocab.txt"
GIB = 1 << 30


def parse_size(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "km" else s) * mult)


def read_real_queries() -> SparseVectors:
    from lsr.interop.anserini import read_anserini_queries

    return read_anserini_queries(REAL_QUERIES, VOCAB)


def window(queries: SparseVectors, B: int, i: int) -> SparseVectors:
    start = (i * B) % max(1, len(queries) - B + 1)
    return queries[start:start + B]


class Compact:
    """Unpadded term-major postings (what a SPARe-style torch scorer would keep)."""

    def __init__(self, index: InvertedIndex):
        doc, w = index.doc_ids, index.scores
        if index.postings == "compact":
            doc, w = decode_postings(doc, w, index.block_offsets, index.block_size)
        keep = doc >= 0
        self.doc = doc[keep]
        self.w = w[keep]
        self.len = index.lengths.long()
        self.start = torch.cumsum(self.len, 0) - self.len
        self.n = index.n_docs

    def scores(self, q: SparseVectors, i: int, dtype: torch.dtype) -> torch.Tensor:
        """[N] scores of query i, one index_add_ per query term (float32 or float64)."""
        acc = torch.zeros(self.n, dtype=dtype, device=self.doc.device)
        a, b = int(q.indptr[i]), int(q.indptr[i + 1])
        for t, wq in zip(q.indices[a:b].tolist(), q.values[a:b].tolist()):
            s0, n = int(self.start[t]), int(self.len[t])
            acc.index_add_(0, self.doc[s0:s0 + n].long(), self.w[s0:s0 + n].to(dtype), alpha=wq)
        return acc


def float64_scores(compact: Compact, q: SparseVectors) -> torch.Tensor:
    """float64 [b, N] brute-force scores of a few queries (for exactness checks)."""
    return torch.stack([compact.scores(q, i, torch.float64) for i in range(len(q))])


def check_exact(scores: torch.Tensor, docs: torch.Tensor, ref: torch.Tensor, k: int) -> int:
    """Number of queries whose top-k breaks the exactness contract (lsr.testing.topk_violations)."""
    return sum(bool(topk_violations(s, d, r, k)) for s, d, r in zip(scores, docs, ref))


# the block route's tuning for small batches, whatever the batch size (the lsr-block-small rows and the sweeps)
AUTO = SearchConfig()
SMALL_BATCH = SearchConfig(route="block", triton={"rows": 8, "num_warps": 4, "per_sm": 8}, coarse={"sample_every": 32})


def lsr_method(cfg: SearchConfig):
    """The gpu backend with ``cfg`` (made once: a search reads it, building one per call would be timed)."""
    def run(index, q, k):
        return gpu_search(index, q, k, cfg)
    return run


# lsr-auto without CUDA graphs: every kernel launched from Python (the previous small-batch path)
lsr_eager = lsr_method(SearchConfig(graphs={"enabled": False}))
# the block route on the Triton kernel (L2 atomics) with its default tuning: the previous default
triton_block = lsr_method(SearchConfig(route="block", scorer="triton"))


def seed_scatter(index, q, k, chunk=128):
    """The seed design: float32 atomic scatter into [b, N] per query chunk, then torch.topk."""
    outs = []
    for b0 in range(0, len(q), chunk):
        qq = q[b0:b0 + chunk]
        dense = triton_scatter_scores(index.doc_ids, index.scores, index.offsets, index.padded_lengths,
                                      qq.indptr, qq.indices, qq.values, index.n_docs)
        outs.append(torch.topk(dense, k, dim=1))
    return torch.cat([o.values for o in outs]), torch.cat([o.indices for o in outs])


class Spare:
    """SPARe-style torch baseline: per query, index_add_ of every term's postings, then topk."""

    def __init__(self, compact: Compact):
        self.compact = compact

    def __call__(self, index, q, k):
        tops = [torch.topk(self.compact.scores(q, i, torch.float32), k) for i in range(len(q))]
        return torch.stack([t.values for t in tops]), torch.stack([t.indices for t in tops])


class Spmm:
    """torch.sparse.mm(docs [N, V] CSR, queries^T dense) -> [N, b] per chunk of queries, then topk."""

    def __init__(self, index: InvertedIndex, chunk: int = 64):
        self.dt = index.docs.to_torch_sparse()
        self.chunk = chunk

    def __call__(self, index, q, k):
        outs_s, outs_d = [], []
        for b0 in range(0, len(q), self.chunk):
            qd = q[b0:b0 + self.chunk].to_dense()
            top = torch.topk(torch.sparse.mm(self.dt, qd.T.contiguous()).T, k, dim=1)
            outs_s.append(top.values)
            outs_d.append(top.indices)
        return torch.cat(outs_s), torch.cat(outs_d)


def label(cfg: SearchConfig) -> str:
    """Short name of a block config: the CUDA kernel's span, warps/CTA, chunks/step; the Triton kernel's
    span, group, rows x chunk, programs/SM, warps."""
    if cfg.scorer == "cuda":
        pass2 = f"coarse s{cfg.coarse.span} b>={cfg.coarse.min_batch}" if cfg.coarse.enabled else "exact"
        return f"blk-cuda s{cfg.cuda.span} w{cfg.cuda.warps} {pass2}"
    t = cfg.triton
    return f"blk-{cfg.scorer} s{t.span} g{t.group} r{t.rows}x{t.chunk} p{t.per_sm} w{t.num_warps}"


def parse_sweep(s: str) -> list[SearchConfig]:
    """Block-route configs of ``--sweep`` ("key=value,...;...", the keys of ``lsr search --set search.<key>``): the
    keys given, the small-batch tuning for the batch-dependent ones not given, and the defaults for the rest."""
    return [search_config_from_overrides([f"search.{kv.strip()}" for kv in item.split(",")], SMALL_BATCH)
            for item in filter(None, (x.strip() for x in s.split(";")))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="100k,1m,8.8m")
    ap.add_argument("--batches", default="1,64,500")
    ap.add_argument("--ks", default="10,1000")
    ap.add_argument("--queries", default="synth,real")
    ap.add_argument("--npz", default=None)
    ap.add_argument("--terms", default="random", help="synthetic term-id ranking(s): random (seeded permutation) "
                    "and/or real (ranked by the real queries' term use: real queries touch ~2.2 N postings)")
    ap.add_argument("--block-sizes", default="65536", help="index block sizes: the methods run on the first, "
                    "the sweep on all")
    ap.add_argument("--methods", default="auto,block,scatter,seed,spare,spmm")
    ap.add_argument("--postings", default="float32", help="posting layouts to index the collection in: float32 "
                    "and/or compact (then the weights are rounded to bf16 first, for every layout)")
    ap.add_argument("--sweep", default="", help="block configs for extra lsr-block rows, ';'-separated")
    ap.add_argument("--sweep-cases", default="500:1000", help="B:k cases of the sweep")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exact-queries", type=int, default=8)
    ap.add_argument("--latency-queries", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=330, help="stop starting cases after this many seconds")
    ap.add_argument("--baseline-max-n", type=float, default=9e6)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script under TRITON_INTERPRET=1")
    ap.add_argument("--profile", nargs="?", const="1", default="", metavar="BATCHES",
                    help="cProfile + torch.profiler of 20 lsr-auto calls per batch size (default 1; e.g. 1,64,500) "
                    "at the largest N, first k of --ks, first query set (OUT/profile_b{B}.txt): where the host "
                    "and GPU time of a search go")
    args = ap.parse_args()
    t_start = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    results = Results(out_dir, "bench_search", environment(dev),
                      {"args": vars(args), "synth": describe(SynthSpec()), "collections": {}})
    save, meta = results.save, results.config

    def over_budget() -> bool:
        return time.time() - t_start > args.budget_s

    real = read_real_queries() if "real" in args.queries or "real" in args.terms else None
    sizes = [parse_size(s) for s in args.sizes.split(",")] if not args.npz else [0]
    collections = [(N, terms) for N in sizes for terms in (args.terms.split(",") if not args.npz else ["npz"])]
    for N, terms in collections:
        if over_budget():
            break
        t0 = time.time()
        # the term ids of a "real"-ranked collection are ranked by the real queries' use of them, so real
        # queries touch ~2.2 N postings as on MS MARCO (a seeded permutation: ~0.18 N); rows say which
        suffix = "+ranked" if terms == "real" else ""
        if args.npz:
            docs, nq = load_npz(args.npz, dev)
            N = len(docs)
            qsets = {"npz": nq}
        else:
            spec = SynthSpec() if dev.type == "cuda" else SynthSpec(block_rows=4096)
            ranking = ranking_from_queries(real) if terms == "real" else None
            docs = synth_docs(N, spec, device=dev, term_ranking=ranking)
            qsets = ({"synth" + suffix: synth_queries(7000, spec, device=dev, term_ranking=ranking)}
                     if "synth" in args.queries else {})
        postings = args.postings.split(",")
        if "compact" in postings:   # one collection for every layout: weights exact in bf16
            docs = rounded_weights(docs)
        synchronize()
        gen_s = time.time() - t0
        if real is not None and "real" in args.queries:
            qsets["real" + suffix] = real.to(dev)
        compact = None
        for i_case, (bs, layout) in enumerate((int(x), lay) for x in args.block_sizes.split(",") for lay in postings):
            index, coll = build_index(docs, dev, bs, layout, gen_s)
            if i_case == 0:
                for name, q in qsets.items():
                    coll[f"stats_{name}"] = synth_stats(docs, q)
                compact = Compact(index)  # the same postings whatever the block size and layout
            meta["collections"][f"{N}/{bs}{suffix}" + ("" if layout == "float32" else f"/{layout}")] = coll
            save()
            ctx = {"N": N, "block_size": bs, "args": args, "over_budget": over_budget, "compact": compact,
                   "postings": layout, "bytes_per_posting": coll["bytes_per_posting"], "build_s": coll["build_s"]}
            for cfg in parse_sweep(args.sweep) if N == max(sizes) else []:  # the sweep at the largest N
                for case in args.sweep_cases.split(","):
                    B, k = (int(x) for x in case.split(":"))
                    qn = next(iter(qsets))
                    run_case(results, label(cfg), lsr_method(cfg), index, qsets[qn], qn, B, k, ctx)
            if bs == int(args.block_sizes.split(",")[0]):
                if args.profile and N == max(sizes) and i_case == 0:
                    for B in (int(b) for b in args.profile.split(",")):
                        profile_batch(index, next(iter(qsets.values())), B, int(args.ks.split(",")[0]),
                                      out_dir / f"profile_b{B}.txt")
                run_methods(results, index, qsets, ctx)
            del index
        del docs, compact
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    results.summary["elapsed_s"] = time.time() - t_start
    save()
    print_table(results.rows)


def build_index(docs: SparseVectors, dev: torch.device, bs: int, layout: str,
                gen_s: float) -> tuple[InvertedIndex, dict]:
    """The index in one posting layout and its collection entry (build time, bytes per posting)."""
    InvertedIndex.build(docs[:4096], device=dev, block_size=bs, postings=layout)   # first-call kernel loads
    synchronize()
    t0 = time.time()
    index = InvertedIndex.build(docs, device=dev, block_size=bs, postings=layout)
    synchronize()
    build_s = time.time() - t0
    term_major = index.doc_ids.numel() * (index.doc_ids.element_size() + index.scores.element_size())
    n = max(1, index.n_postings)
    coll = {"gen_s": gen_s, "build_s": build_s, "postings": layout, "index_gib": index.memory_bytes() / GIB,
            "padded_over_real": index.n_padded_postings / n, "term_major_gib": term_major / GIB,
            "bytes_per_posting": term_major / n,
            "bytes_per_padded_posting": term_major / max(1, index.n_padded_postings),
            "index_bytes_per_posting": index.memory_bytes() / n}
    print(f"[N={docs.indptr.numel() - 1} block {bs} {layout}] gen {gen_s:.1f}s build {build_s:.2f}s index "
          f"{coll['index_gib']:.2f} GiB ({coll['bytes_per_posting']:.2f} B per posting in the term-major arrays, "
          f"{coll['index_bytes_per_posting']:.2f} in all) padding x{coll['padded_over_real']:.2f}", flush=True)
    return index, coll


def profile_batch(index, queries, B: int, k: int, path: Path, n: int = 20) -> None:
    """cProfile of n top-k searches of B queries (after a warm-up), sorted by own and cumulative time, then
    the torch.profiler's view of the same calls."""
    import cProfile
    import io
    import pstats

    def call(i: int) -> None:
        gpu_search(index, window(queries, B, i), k, AUTO)

    for i in range(3):
        call(i)
    synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        call(i)
        synchronize()
    prof.disable()
    buf = io.StringIO()
    for key in ("tottime", "cumulative"):
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(30)
    buf.write(device_profile(call, n))
    path.write_text(buf.getvalue())


def device_profile(call, n: int) -> str:
    """torch.profiler over n synchronised calls: wall and GPU kernel time per call, and the kernels and host
    ops that take it (is a single-query search bound by the GPU or by the host?)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for i in range(n):
            call(i)
            synchronize()
        wall_us = (time.perf_counter() - t) / n * 1e6
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events) / n
    head = f"\n== torch.profiler, {n} calls: wall {wall_us:.0f} us per call (profiler on), GPU {gpu_us:.0f} us\n"
    return head + events.table(sort_by="self_device_time_total", row_limit=25) + \
        events.table(sort_by="self_cpu_time_total", row_limit=25)


def run_methods(results: Results, index, qsets, ctx) -> None:
    """The lsr paths and the baselines over every (query set, B, k) case."""
    args, N = ctx["args"], ctx["N"]
    methods = {"lsr-auto": lsr_method(AUTO), "lsr-block": lsr_method(SearchConfig(route="block")),
               "lsr-block-triton": triton_block, "lsr-eager": lsr_eager,
               "lsr-block-small": lsr_method(SMALL_BATCH),
               "lsr-scatter": lsr_method(SearchConfig(route="dense-scatter")),
               "seed-scatter": seed_scatter, "spare": Spare(ctx["compact"])}
    wanted = {"auto": "lsr-auto", "block": "lsr-block", "triton": "lsr-block-triton", "eager": "lsr-eager", "small": "lsr-block-small", "scatter": "lsr-scatter",
              "seed": "seed-scatter", "spare": "spare", "spmm": "torch-spmm"}
    chosen = [wanted[m] for m in args.methods.split(",") if m in wanted]
    if ctx["postings"] != "float32":   # the baselines do not depend on the layout; the scatter kernels read float32
        chosen = [m for m in chosen if m not in ("lsr-scatter", "seed-scatter", "spare", "torch-spmm")]
    if "torch-spmm" in chosen and N <= args.baseline_max_n:
        methods["torch-spmm"] = Spmm(index)
    batches = [int(b) for b in args.batches.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    for qn in qsets:
        for B in batches:
            for k in ks:
                for m in chosen:
                    if m not in methods or (m == "lsr-scatter" and N > 2_000_000):
                        continue
                    if m in ("spare", "torch-spmm", "seed-scatter") and (B == 1 or N > args.baseline_max_n):
                        continue
                    # the slow torch baselines time a few queries: one case per query set is enough
                    if m in ("spare", "torch-spmm") and (B != max(batches) or k != max(ks)):
                        continue
                    run_case(results, m, methods[m], index, qsets[qn], qn, B, k, ctx, exact=m.startswith("lsr"))


def run_case(results: Results, name, fn, index, queries, qname, B, k, ctx, exact=True) -> None:
    args, N, compact = ctx["args"], ctx["N"], ctx["compact"]
    base_row = {"method": name, "n_docs": N, "block_size": ctx["block_size"], "postings": ctx.get("postings", "float32"),
                "bytes_per_posting": ctx.get("bytes_per_posting"), "build_s": ctx.get("build_s"), "queries": qname,
                "B": B, "k": k}
    if ctx["over_budget"]():
        results.add({**base_row, "status": "skipped: budget"})
        return
    slow = name in ("spare", "torch-spmm")
    repeats = 1 if slow else args.repeats
    nb = min(B, 8) if name == "spare" else min(B, 64) if name == "torch-spmm" else B
    row = {**base_row, "timed_batch": nb}
    try:
        with PeakMemory() as peak:
            ms = time_calls(lambda i: fn(index, window(queries, nb, i), k), repeats)
        row |= quantiles(ms) | {"peak_extra_mb": peak.extra_mb}
        row["qps"] = nb / row["ms"] * 1000
        if name.startswith(("lsr", "blk")):
            q = window(queries, nb, 0)
            a, b = fn(index, q, k), fn(index, q, k)
            row["bit_identical"] = bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
            if exact and args.exact_queries:
                sub = q[:args.exact_queries]
                ref = float64_scores(compact, sub)
                row["exact_fail"] = check_exact(a[0][:len(sub)], a[1][:len(sub)], ref, k)
                row["exact"] = row["exact_fail"] == 0
                del ref
            if B == 1:
                lat = []
                for i in range(args.latency_queries):
                    qi = window(queries, 1, i + 1)
                    lat.append(timed(lambda qi=qi: fn(index, qi, k))[1] * 1000)
                row["p50_latency_ms"] = quantiles(lat)["ms"]
    except torch.cuda.OutOfMemoryError as e:
        row["error"] = f"OOM: {str(e)[:120]}"
        torch.cuda.empty_cache()  # only raised on CUDA
    except Exception as e:  # noqa: BLE001 - keep benchmarking the other cases; the row records what broke
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    results.add(row)


def print_table(rows: list[dict]) -> None:
    print()
    print(format_table(rows, ["method", "postings", ("bytes_per_posting", ".2f"), ("build_s", ".2f"), "block_size",
                              "n_docs", "queries",
                              "B", "k", ("ms", ".2f"), ("qps", ".0f"),
                              ("p50_latency_ms", ".2f"), ("peak_extra_mb", ".0f"), "exact", "bit_identical"]))


if __name__ == "__main__":
    main()
