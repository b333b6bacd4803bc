"""Where the host spends a small-batch training step: enqueue time, device busy time, and the host syncs.

For each implementation of scripts/bench_train.py (same random-weight models and batches) at one batch size:

* ``wall_ms``: one step, CUDA events around it, synchronised after (what bench_train reports);
* ``enqueue_ms``: the host's time to return from the step call, the queue empty at the start: when it is close
  to ``wall_ms`` the step is host-bound (the GPU waits on Python and launches);
* ``busy_ms``: the GPU kernels' busy time per step (torch.profiler);
* ``syncs``: host-device synchronisations per step (``torch.cuda.set_sync_debug_mode``), with the first frame of
  each inside lsr, transformers or sentence-transformers: a sync in the middle of a step stops the host from running
  ahead of the GPU.

    PYTHONPATH=. python scripts/profile_train_step.py --out results/train-host --models bert,xlmr --batch 32 \
        --impls lsr,lsr_compile,st
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_train import build, model_config, profile_steps, save_random_model  # noqa: E402
from train_steps import batch_ids  # noqa: E402

from lsr.benchmarks.harness import format_table, quantiles  # noqa: E402


def sync_sites(step, q, d) -> collections.Counter:
    """The innermost lsr / transformers / sentence_transformers / optimizer frame of every host sync in one step."""
    sites: collections.Counter = collections.Counter()
    keep = ("/lsr/", "transformers/", "sentence_transformers/", "torch/optim", "bench_train")

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if any(p in f.filename for p in keep)]
        sites[f"{Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].line}" if frames else "?"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(q, d)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    return sites


def measure(step, q, d, repeats: int) -> dict:
    walls, enqueues = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        step(q, d)
        enqueues.append((time.perf_counter() - t0) * 1e3)
        b.record()
        torch.cuda.synchronize()
        walls.append(a.elapsed_time(b))
    w, e = quantiles(walls), quantiles(enqueues)
    return {"wall_ms": w["ms"], "wall_p10": w["ms_p10"], "enqueue_ms": e["ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="bert,xlmr")
    ap.add_argument("--impls", default="lsr,st")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--query-len", type=int, default=32)
    ap.add_argument("--doc-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    args.device = "cuda"
    rows, sites_out = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            folder = save_random_model(name, False, Path(tmp) / name)
            vocab = model_config(name, False).vocab_size
            q = batch_ids(args.batch, args.query_len, vocab, "cuda")
            d = batch_ids(args.batch, args.doc_len, vocab, "cuda")
            for impl in args.impls.split(","):
                step = build(impl, folder, args, False)
                for _ in range(3):
                    step(q, d)
                row = {"model": name, "impl": impl, "B": args.batch, **measure(step, q, d, args.repeats)}
                row["busy_ms"] = profile_steps(lambda f=step: f(q, d), 3)[0]["device_ms_per_step"]
                sites = sync_sites(step, q, d)
                row["syncs"] = sum(sites.values())
                sites_out[f"{name}/{impl}"] = dict(sites.most_common())
                rows.append(row)
                del step
                torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "profile_train_step.json").write_text(json.dumps({"rows": rows, "sync_sites": sites_out}, indent=1))
    for key, sites in sites_out.items():
        print(f"# syncs {key}")
        for where, n in sites.items():
            print(f"  {n:4d}  {where[:150]}")
    print(format_table(rows, ["model", "impl", "B", ("wall_ms", ".1f"), ("wall_p10", ".1f"), ("enqueue_ms", ".1f"),
                              ("busy_ms", ".1f"), "syncs"]))


if __name__ == "__main__":
    main()
