"""Benchmark the fused MaxSim kernel (lsr.rerank.kernels.maxsim) against its baselines, all in one run.

Cases (bf16 inputs, unit-norm token embeddings, d=128):

* ``colbert``: rerank — Nq queries (Lq=32) each with C candidates drawn from a pool of Nd documents whose
  lengths vary uniformly in 180..300 (padded to 300). The baselines must gather each query's candidates
  ([q, C, Ld, d]) and are run over query chunks so they fit in memory.
* ``colbert-pairs``: the same token shapes, all pairs of Nq queries x Nd shared documents (no gather: the
  kernels alone, as flash-maxsim's shared_docs path).
* ``colpali``: all pairs — Nq queries x Nd pages, Lq = Ld = 1024.

Methods: ``lsr-triton`` (the fused kernel; candidates by index, no gather; ``lsr-triton-det``: its
deterministic, atomic-free backward), ``einsum`` (PyLate-style:
einsum -> masked max -> sum, in bf16 like an eager model), ``einsum-compile`` (torch.compile of it),
``flash-maxsim`` (0.3.0, when importable: flash_maxsim_batched / flash_maxsim_batched_train), and
``einsum-fp32`` (the reference the exactness columns compare against). Modes: ``fwd`` (no grad) and
``fwd+bwd`` (scores · g summed, backward to Q and the document pool; the baselines backward per chunk).
Time: CUDA-event median, L2 flushed per repeat. Memory: peak allocated above what was allocated before
the call (inputs), so outputs, gradients and gathers count.

    PYTHONPATH=. python scripts/bench_maxsim.py --out results/ [--quick] [--only colbert,colbert-pairs,colpali]
    PYTHONPATH=. python scripts/bench_maxsim.py --quick --device cpu --out /tmp/b   # interpreter check
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels run in the interpreter (set before import)

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lsr.benchmarks.harness import PeakMemory, Results, environment, format_table, quantiles, time_calls, time_for
from lsr.rerank.kernels.maxsim import maxsim

SIZES = {  # name -> (Nq, C or None = all pairs, Nd, Lq, (Ld_min, Ld_max), d, query chunk of the baselines)
    "full": {"colbert": (500, 1000, 50_000, 32, (180, 300), 128, 16),
             "colbert-pairs": (500, None, 1000, 32, (180, 300), 128, 16),
             "colpali": (32, None, 1000, 1024, (1024, 1024), 128, 1)},
    "quick": {"colbert": (32, 200, 4000, 32, (180, 300), 128, 16),
              "colbert-pairs": (32, None, 200, 32, (180, 300), 128, 16),
              "colpali": (4, None, 128, 1024, (1024, 1024), 128, 1)},
    "cpu": {"colbert": (2, 4, 6, 8, (5, 12), 32, 1),
            "colbert-pairs": (2, None, 3, 8, (5, 12), 32, 1),
            "colpali": (1, None, 2, 24, (24, 24), 32, 1)},
}
BWD_SHRINK = {"colbert": 1, "colbert-pairs": 1, "colpali": 4}  # fwd+bwd of ColPali all pairs: a quarter of the pages


def make_case(nq, n_cand, nd, lq, ld_range, dim, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(nq, lq, dim, generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(nd, ld_range[1], dim, generator=g), dim=-1)
    d_len = torch.randint(ld_range[0], ld_range[1] + 1, (nd,), generator=g)
    d[torch.arange(ld_range[1])[None, :] >= d_len[:, None]] = 0
    cand = torch.randint(0, nd, (nq, n_cand), generator=g) if n_cand else None
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return (q.to(torch.bfloat16).to(device), d.to(torch.bfloat16).to(device), to(d_len), to(cand),
            to(torch.randn(nq, n_cand or nd, generator=g)))


def einsum_scores(q, d_g, d_len_g):
    """PyLate-style: q [n, Lq, d], gathered docs [n, C, Ld, d] (or shared [C, Ld, d]) -> [n, C]."""
    shared = d_g.dim() == 3
    sim = torch.einsum("qid,cjd->qcij" if shared else "qid,qcjd->qcij", q, d_g)
    pad = torch.arange(d_g.shape[-2], device=q.device) >= d_len_g[..., None]
    sim = sim.masked_fill((pad[None] if shared else pad)[:, :, None, :], float("-inf"))
    return sim.amax(dim=-1).float().sum(dim=-1)


def chunked(score_fn: Callable, q, d, d_len, cand, chunk: int, grad=None):
    """Run a baseline over query chunks (gathering candidates); with ``grad``, backward per chunk."""
    outs = []
    for q0 in range(0, q.shape[0], chunk):
        qc = q[q0:q0 + chunk]
        if cand is None:
            dg, lg = d, d_len
        else:
            dg, lg = d[cand[q0:q0 + chunk]], d_len[cand[q0:q0 + chunk]]
        s = score_fn(qc, dg, lg)
        if grad is not None:
            (s * grad[q0:q0 + chunk]).sum().backward()
            s = s.detach()
        outs.append(s)
    return torch.cat(outs)


def flash_fn(train: bool):
    import flash_maxsim as fm

    def run(qc, dg, lg):
        shared = dg.dim() == 3
        lens = lg.reshape(-1).to(torch.int32)
        if train:
            return fm.flash_maxsim_batched_train(qc, dg, shared_docs=shared, doc_lengths=lens)
        return fm.flash_maxsim_batched(qc, dg, doc_lengths=lens, shared_docs=shared)
    return run


def methods(case: str, mode: str, chunk: int, has_flash: bool, compile_ok: bool) -> dict[str, Callable]:
    train = mode == "fwd+bwd"

    def lsr(q, d, d_len, cand, grad, deterministic=False):
        s = maxsim(q, d, None, d_len, cand, backend="triton", deterministic=deterministic)
        if train:
            (s * grad).sum().backward()
        return s.detach()

    def base(fn):
        return lambda q, d, d_len, cand, grad: chunked(fn, q, d, d_len, cand, chunk, grad if train else None)

    out = {"lsr-triton": lsr, "einsum": base(einsum_scores)}
    if train:  # the atomic-free backward
        out["lsr-triton-det"] = lambda *a: lsr(*a, deterministic=True)
    if compile_ok:
        out["einsum-compile"] = base(torch.compile(einsum_scores, dynamic=False))
    if has_flash:
        out["flash-maxsim"] = base(flash_fn(train))
    return out


def reference(q, d, d_len, cand, chunk):
    with torch.no_grad():
        return chunked(lambda a, b, c: einsum_scores(a.float(), b.float(), c), q, d, d_len, cand, chunk)


def measure(fn: Callable[[], object], gpu: bool, budget_ms: float) -> dict:
    out = fn()  # compile / autotune outside the measurements
    del out
    gc.collect()
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    with PeakMemory() as peak:
        out = fn()
    del out
    times = time_for(fn, budget_ms) if gpu else time_calls(lambda _: fn(), repeats=2)
    return quantiles(times) | {"peak_extra_mb": peak.extra_mb}


def run_case(res: Results, case: str, mode: str, sizes: tuple, device: str, args, has_flash: bool) -> None:
    nq, n_cand, nd, lq, ld_range, dim, chunk = sizes
    if mode == "fwd+bwd" and n_cand is None:
        nd = max(2, nd // BWD_SHRINK[case])
    q, d, d_len, cand, grad = make_case(nq, n_cand, nd, lq, ld_range, dim, device)
    ref = reference(q, d, d_len, cand, chunk)
    ref_grads = None
    if mode == "fwd+bwd":  # fp32 gradients of the same bf16 inputs
        qf, df = (t.detach().float().requires_grad_() for t in (q, d))
        chunked(einsum_scores, qf, df, d_len, cand, chunk, grad)
        ref_grads = (qf.grad, df.grad)
    info = {"case": case, "mode": mode, "Nq": nq, "C": n_cand or nd, "Nd": nd, "Lq": lq, "Ld": f"{ld_range[0]}-{ld_range[1]}",
            "d": dim, "dtype": "bf16"}
    gpu = device.startswith("cuda")
    impls = methods(case, mode, chunk, has_flash, compile_ok=gpu and "compile" not in args.skip)
    if mode == "fwd":
        impls["einsum-fp32"] = lambda q, d, d_len, cand, grad: reference(q, d, d_len, cand, chunk)
    for name, impl in impls.items():
        if name in args.skip:
            continue
        leaves = [t.detach().requires_grad_(mode == "fwd+bwd") for t in (q, d)]

        def call(impl=impl, leaves=leaves):
            for t in leaves:
                t.grad = None
            ctx = torch.enable_grad() if mode == "fwd+bwd" else torch.no_grad()
            with ctx:
                return impl(leaves[0], leaves[1], d_len, cand, grad)
        row = dict(info, method=name)
        try:
            scores = call()
            err = (scores.double() - ref.double()).abs().max().item()
            row |= {"max_abs_err": err, "exact": err <= 1e-5 * max(1.0, ref.abs().max().item())}
            if ref_grads is not None:  # worst of dQ and dD, relative to each gradient's largest entry
                row["grad_rel_err"] = max(((t.grad.double() - r.double()).abs().max() / r.abs().max()).item()
                                          for t, r in zip(leaves, ref_grads))
            row |= measure(call, gpu, args.budget_ms)
        except Exception as e:  # noqa: BLE001 - OOM or a baseline that cannot run: recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        res.add(row)
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results", help="folder for bench_maxsim.json / .csv")
    ap.add_argument("--quick", action="store_true", help="small sizes (a check, not a measurement)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--only", default="colbert,colbert-pairs,colpali", help="cases to run")
    ap.add_argument("--modes", default="fwd,fwd+bwd")
    ap.add_argument("--skip", default="", help="methods to leave out, e.g. einsum-compile,flash-maxsim")
    ap.add_argument("--budget-ms", type=float, default=2000, help="timing budget per method")
    args = ap.parse_args()
    args.skip = set(filter(None, args.skip.split(",")))
    try:
        import flash_maxsim  # noqa: F401
        has_flash = args.device.startswith("cuda")
    except ImportError:
        has_flash = False
    scale = "cpu" if args.device == "cpu" else ("quick" if args.quick else "full")
    res = Results(args.out, "bench_maxsim", environment(args.device, flash_maxsim=has_flash),
                  {"scale": scale, "sizes": SIZES[scale], "flash_maxsim": has_flash})
    for case in args.only.split(","):
        for mode in args.modes.split(","):
            run_case(res, case, mode, SIZES[scale][case], args.device, args, has_flash)
    print(format_table(res.rows, ["case", "mode", "method", ("ms", ".2f"), ("peak_extra_mb", ".0f"), "exact",
                                  ("max_abs_err", ".2e"), ("grad_rel_err", ".1e"), "C", "Nd"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
