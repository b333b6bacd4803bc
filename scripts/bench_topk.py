"""Benchmark the top-k selections a small-batch block search makes, and exact alternatives to them.

    PYTHONPATH=. python scripts/bench_topk.py --out OUT [--size 8.8m] [--cases real:1:10,synth:1:1000,...]
        [--chunks 2048,4096,8192,16384]

A profile once put a large share of a B=1 search's GPU time at 8.8M docs in torch.topk / kthvalue
(docs/performance/search.md); the block route now selects with lsr.search.select. This script runs one
eager search per case (``query set:B:k``) on a synthetic collection (lsr.benchmarks.synth, as bench_search.py builds
it), records the input of every selection the search makes (``bucket_topk`` / ``bucket_theta``, and any
``torch.topk`` / ``torch.kthvalue`` call), and times on those very inputs (inside a CUDA graph, as the
block path runs them):

* top k: ``topk`` (torch, the reference), ``sort`` (a full sort, then the first k), ``bucket_topk_rank`` /
  ``bucket_topk_sort`` (the bucket selection's two last steps, the plan's ``Selection``), ``row_topk``
  (lsr.search.kernels.row_topk_cuda: one CTA a row sorts it in shared memory; rows up to 4,096 keys),
  ``unsorted+sort`` (an unsorted topk, then a sort of its k keys), ``chunk{C}`` (top k of every C-key slice
  of the row, then top k of those: exact, keys are unique);
* the k-th score (pass 1's threshold): ``kthvalue`` (the reference), ``topk_amin``, ``chunk{C}_amin`` and
  ``bucket_theta`` (a lower bound: it agrees when within 2**-15 below the k-th score).

Every variant's output is compared with the reference (the ``equal`` column). Writes OUT/bench_topk.json
and .csv; prints a table last: per call, the reference and the fastest agreeing variant.
``--device cpu`` is a dry run (small collection, interpreter mode, host timings).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bench_search import parse_size, read_real_queries

from lsr.benchmarks.harness import Results, environment, format_table, quantiles, synchronize, time_calls
from lsr.benchmarks.synth import SynthSpec, synth_docs, synth_queries
from lsr.index.inverted import InvertedIndex
from lsr.search import block_path, fallbacks
from lsr.search.config import SearchConfig
from lsr.search.gpu_search import gpu_search
from lsr.search.kernels import row_topk_cuda
from lsr.search.kernels.topk import key_scores
from lsr.search.select import bucket_theta, bucket_topk, row_topk, select_slots

TOPK, KTHVALUE = torch.topk, torch.kthvalue
THETA_SLACK = 2.0 ** -15   # bucket_theta's largest relative distance below the k-th score


def record_calls(search: Callable[[], object]) -> list[tuple[str, torch.Tensor, int, bool]]:
    """(op, input copy, k, sorted) of every selection ``search`` makes: the block path's ``bucket_topk`` /
    ``bucket_theta`` / ``row_topk`` (as "topk" / "kth" / "topk") and any other 2-D torch.topk / torch.kthvalue
    call."""
    calls = []
    inside = [0]   # a torch.topk inside a recorded selection is not recorded again

    def topk(x, k, dim=-1, largest=True, sorted=True, **kw):  # noqa: A002 - torch's own argument name
        if x.dim() == 2 and dim in (1, -1) and largest and not inside[0]:
            calls.append(("topk", x.detach().clone(), int(k), bool(sorted)))
        return TOPK(x, k, dim=dim, largest=largest, sorted=sorted, **kw)

    def recorded(op: str, fn: Callable, sorted_: bool) -> Callable:
        def call(x, k, **kw):
            calls.append((op, x.detach().clone(), int(k), sorted_))
            inside[0] += 1
            try:
                return fn(x, k, **kw)
            finally:
                inside[0] -= 1
        return call

    def kthvalue(x, k, dim=-1, **kw):
        if x.dim() == 2 and dim in (1, -1):
            calls.append(("kth", x.detach().clone(), int(x.shape[1]) - int(k) + 1, False))
        return KTHVALUE(x, k, dim=dim, **kw)

    torch.topk, torch.kthvalue = topk, kthvalue
    block_path.bucket_theta = recorded("kth", bucket_theta, False)
    block_path.bucket_topk = recorded("topk", bucket_topk, True)
    block_path.row_topk = fallbacks.row_topk = recorded("topk", row_topk, True)
    try:
        search()
    finally:
        torch.topk, torch.kthvalue = TOPK, KTHVALUE
        block_path.bucket_theta, block_path.bucket_topk = bucket_theta, bucket_topk
        block_path.row_topk = fallbacks.row_topk = row_topk
    return calls


def chunked_topk(x: torch.Tensor, k: int, chunk: int, sorted_: bool) -> torch.Tensor:
    """Top k of every ``chunk`` keys (padded with -1), then top k of those."""
    B, C = x.shape
    n = -(-C // chunk)
    if n * chunk != C:
        x = torch.cat([x, x.new_full((B, n * chunk - C), -1)], 1)
    part = TOPK(x.view(B * n, chunk), min(k, chunk), dim=1, sorted=False).values.view(B, -1)
    return TOPK(part, k, dim=1, sorted=sorted_).values


def variants(op: str, x: torch.Tensor, k: int, sorted_: bool,
             chunks: list[int]) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a call whose output must equal the first one's (for "topk": up to order when unsorted; for
    "kth": the k-th largest key's score, except ``bucket_theta``, a lower bound within THETA_SLACK)."""
    C = x.shape[1]
    if op == "kth":   # the k-th largest key's score
        out = {"kthvalue": lambda: key_scores(KTHVALUE(x, C - k + 1, dim=1).values),
               "topk_amin": lambda: key_scores(TOPK(x, k, dim=1, sorted=False).values.amin(1)),
               "bucket_theta": lambda: bucket_theta(x, k)}
        for c in chunks:
            if k <= c < C:
                out[f"chunk{c}_amin"] = lambda c=c: key_scores(chunked_topk(x, k, c, False).amin(1))
        return out
    out = {"topk": lambda: TOPK(x, k, dim=1, sorted=sorted_).values,
           "sort": lambda: torch.sort(x, dim=1, descending=True).values[:, :k],
           "bucket_topk_rank": lambda: bucket_topk(x, k, slots=select_slots(k), by_rank=True)[0],
           "bucket_topk_sort": lambda: bucket_topk(x, k, slots=select_slots(k), by_rank=False)[0]}
    if row_topk_cuda.usable(x):
        out["row_topk"] = lambda: row_topk_cuda.cuda_row_topk(x, k)
    if sorted_:
        out["unsorted+sort"] = lambda: torch.sort(TOPK(x, k, dim=1, sorted=False).values, dim=1, descending=True).values
    for c in chunks:
        if 2 * k <= c < C:
            out[f"chunk{c}"] = lambda c=c: chunked_topk(x, k, c, sorted_)
    return out


def agrees(name: str, got: torch.Tensor, ref: torch.Tensor, ordered: bool) -> bool:
    """A variant's output against the reference (``bucket_theta``: a lower bound within THETA_SLACK)."""
    if name == "bucket_theta":
        return bool(((got <= ref) & (got >= ref * (1 - THETA_SLACK))).all())
    return same(got, ref, ordered)


def same(a: torch.Tensor, b: torch.Tensor, ordered: bool) -> bool:
    if ordered:
        return torch.equal(a, b)
    return torch.equal(torch.sort(a, dim=-1).values, torch.sort(b, dim=-1).values)


def time_us(fn: Callable[[], object], cuda: bool, reps: int = 20) -> float:
    """Median µs per call (``lsr.benchmarks.harness.time_calls``, 5 repeats): of a CUDA graph of ``reps`` calls (the block
    path replays graphs), or of one call on the CPU."""
    fn()
    synchronize()
    if not cuda:
        return quantiles(time_calls(lambda i: fn(), 5))["ms"] * 1000
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    return quantiles(time_calls(lambda i: graph.replay(), 5))["ms"] * 1000 / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="8.8m")
    ap.add_argument("--cases",
                    default="real:1:10,synth:1:10,synth:1:1000,real:16:10,synth:64:1000,real:64:1000,synth:500:1000")
    ap.add_argument("--chunks", default="2048,4096,8192,16384")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run (small collection, interpreter mode)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    chunks = [int(c) for c in args.chunks.split(",")]
    results = Results(args.out, "bench_topk", environment(dev), {"args": vars(args)})
    spec = SynthSpec() if cuda else SynthSpec(block_rows=4096)
    n_docs = parse_size(args.size) if cuda else 20_000
    index = InvertedIndex.build(synth_docs(n_docs, spec, device=dev), device=dev, block_size=65536 if cuda else 4096)
    qsets = {"synth": synth_queries(2000, spec, device=dev), "real": read_real_queries().to(dev)}
    best = []
    for case in args.cases.split(","):
        name, B, k = case.split(":")
        B, k = int(B), int(k)
        # eager: every call runs (and is recorded) each time
        cfg = SearchConfig(route="block", graphs={"enabled": False})
        calls = record_calls(lambda: gpu_search(index, qsets[name][:B], k, cfg))
        for i, (op, x, kk, sorted_) in enumerate(calls):
            fns = variants(op, x, kk, sorted_, chunks)
            ref = next(iter(fns.values()))()
            rows = []
            for vname, fn in fns.items():
                row = {"case": case, "call": i, "op": op, "B": x.shape[0], "C": x.shape[1], "k": kk,
                       "sorted": sorted_, "valid_keys": int((x >= 0).sum()), "variant": vname,
                       "equal": agrees(vname, fn(), ref, ordered=op == "kth" or sorted_), "us": time_us(fn, cuda)}
                rows.append(results.add(row, echo=False))
            base = rows[0]
            fastest = min((r for r in rows if r["equal"]), key=lambda r: r["us"])
            best.append({**base, "base_us": base["us"], "best": fastest["variant"], "best_us": fastest["us"],
                         "all_equal": all(r["equal"] for r in rows)})
    results.save()
    print(format_table(best, ["case", "call", "op", "B", "C", "k", "sorted", "valid_keys", ("base_us", ".1f"),
                              "best", ("best_us", ".1f"), "all_equal"]))


if __name__ == "__main__":
    main()
