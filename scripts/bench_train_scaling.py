"""Scaling rows of ``bench_train.py``: one SPLADE training step data-parallel over W GPUs of one host,
the same per-GPU batch for every W, samples/s against W = 1 in the same run.

Implementations (per model, all in one ``torchrun`` job per W):

* ``lsr``: lsr.train's TrainableEncoder under DDP (``TrainableEncoder.distribute``; no DDP at W = 1),
  in-batch negatives of the rank's own batch;
* ``lsr_gather``: the same with global in-batch negatives (``lsr.parallel.training.gather_rows`` of the
  query and document vectors, as ``loss.gather_across_ranks`` does);
* ``st`` / ``st_gather``: sentence-transformers' SparseEncoder in a manual DDP loop (torch DDP around the
  model the loss calls) with SpladeLoss(SparseMultipleNegativesRankingLoss(gather_across_devices=...));
  skipped with the reason when sentence-transformers does not import.

Each rank times its steps (CUDA events after warm-up); a row reports the slowest rank's median step,
samples/s = W x B / step, the peak extra memory of rank 0. ``bench_train.py --scaling 1,4`` launches
``torchrun --nproc-per-node W`` of this file per W (``--worker``) and records the rows and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_steps import batch_ids, cleanup, is_oom, spladeish_loss, st_loss_step  # noqa: E402

from lsr.benchmarks.harness import PeakMemory, quantiles, time_calls  # noqa: E402

SCALING_IMPLS = ("lsr", "lsr_gather", "st", "st_gather")


def lsr_ddp_step(folder: Path, device: torch.device, world: int, gather: bool) -> Callable[[dict, dict], None]:
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.parallel.training import gather_rows
    from lsr.train.model import TrainableEncoder, adamw_kernel

    enc = SpladeEncoder.from_pretrained(folder, device=device, dtype=torch.float32, varlen=False)
    model = TrainableEncoder(enc, bf16=True).train()
    if world > 1:
        model.distribute()
    opt = torch.optim.AdamW([p for _, p in model.named_parameters()], lr=1e-5, **adamw_kernel(device))

    def step(q: dict, d: dict) -> None:
        opt.zero_grad(set_to_none=True)
        with model.autocast():
            vq, vd = model.pair((q["input_ids"], q["attention_mask"]), (d["input_ids"], d["attention_mask"]))
        if gather and world > 1:
            vq, vd = gather_rows(vq), gather_rows(vd)
        spladeish_loss(vq, vd).backward()
        opt.step()
    return step


def st_ddp_step(folder: Path, device: torch.device, world: int, gather: bool, doc_len: int
                ) -> Callable[[dict, dict], None]:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from torch.nn.parallel import DistributedDataParallel

    model = SparseEncoder(modules=[Transformer(str(folder), transformer_task="fill-mask", max_seq_length=doc_len),
                                   SpladePooling("max")], device=str(device)).train()
    loss_fn = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model, gather_across_devices=gather and world > 1),
                         document_regularizer_weight=1e-3, query_regularizer_weight=5e-4)
    if world > 1:  # the loss calls its .model: the DDP wrapper, whose forward is the model's
        loss_fn.model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                                broadcast_buffers=False)  # (BERT's buffers are constants: a broadcast
        # per forward would bump the position ids' version between the query and document forwards)
    return st_loss_step(model, loss_fn, device)


def _slowest(value: float) -> float:
    import torch.distributed as dist

    from lsr.parallel.topology import comm_device

    t = torch.tensor([value], dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def measure(impl: str, folder: Path, device: torch.device, args: argparse.Namespace, vocab: int) -> dict:
    """One implementation on this rank: its step built, warmed up and timed; the row (rank 0's view)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    gather = impl.endswith("_gather")
    try:
        if impl.startswith("st"):
            step = st_ddp_step(folder, device, world, gather, args.doc_len)
        else:
            step = lsr_ddp_step(folder, device, world, gather)
    except ImportError as e:
        return {"status": f"skipped: {e}"}
    B = args.batch  # each rank its own random batch of the same shape
    q, d = (batch_ids(B, n, vocab, str(device), seed=rank) for n in (args.query_len, args.doc_len))
    try:
        step(q, d)  # allocations and autotuning outside the timings
        dist.barrier()
        with PeakMemory() as peak:
            times = time_calls(lambda _: step(q, d), args.steps, warmup=args.warmup)
        row = {"status": "ok", "peak_extra_mb": peak.extra_mb} | quantiles(times)
    except Exception as e:  # noqa: BLE001 - out of memory is a result; anything else is raised
        if not is_oom(e):
            raise
        row = {"status": "OOM"}
    step = None  # (freed before the next implementation is built)
    cleanup()
    if row["status"] == "ok":
        row["ms"] = _slowest(row["ms"])
        row["samples_per_s"] = world * B / (row["ms"] / 1e3)
    return row


def worker(args: argparse.Namespace) -> None:
    """One torchrun job: every model and implementation at W ranks; rank 0 writes the rows to --rows-out."""
    from lsr.parallel.jobs import rank_job

    rows = []
    with rank_job(args.device) as job:
        for name, folder, vocab in zip(args.models.split(","), args.model_dirs.split(","),
                                       [int(v) for v in args.vocabs.split(",")], strict=True):
            for impl in args.impls.split(","):
                row = measure(impl, Path(folder), job.device, args, vocab)
                rows.append({"model": name, "vocab_size": vocab, "impl": impl, "world": job.world,
                             "B": args.batch, "method": "scaling"} | row)
                if job.lead:
                    print(json.dumps(rows[-1]), flush=True)
        if job.lead:
            Path(args.rows_out).write_text(json.dumps(rows))


def launch(world: int, folders: dict[str, Path], vocabs: dict[str, int], args: argparse.Namespace,
           rows_out: Path) -> list[dict]:
    """``torchrun --nproc-per-node world`` of this file's worker; its rows ([] with a status row if it failed)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world), __file__,
           "--worker", "--device", args.device, "--models", ",".join(folders),
           "--model-dirs", ",".join(str(f) for f in folders.values()), "--vocabs", ",".join(str(vocabs[m]) for m in folders),
           "--impls", args.scaling_impls, "--batch", str(args.batches[0]), "--query-len", str(args.query_len),
           "--doc-len", str(args.doc_len), "--steps", str(args.scaling_steps), "--warmup", str(args.scaling_warmup),
           "--rows-out", str(rows_out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(cmd, env=env)
    if done.returncode != 0 or not rows_out.is_file():
        return [{"model": m, "impl": "-", "world": world, "method": "scaling", "status": f"failed: rc {done.returncode}"}
                for m in folders]
    return json.loads(rows_out.read_text())


def scaling_summary(rows: list[dict]) -> dict[str, float]:
    """samples/s at each W over W = 1, per (model, implementation, B)."""
    out = {}
    ok = [r for r in rows if r.get("method") == "scaling" and r.get("samples_per_s")]
    for r in ok:
        one = next((x for x in ok if x["world"] == 1 and all(x[k] == r[k] for k in ("model", "impl", "B"))), None)
        if one and r["world"] > 1:
            out[f"{r['model']} B={r['B']}/GPU {r['impl']}: samples/s W={r['world']} / W=1"] = \
                r["samples_per_s"] / one["samples_per_s"]
    return out


def worker_main() -> None:
    ap = argparse.ArgumentParser(description="bench_train's scaling worker (started by torchrun)")
    ap.add_argument("--worker", action="store_true", required=True)
    for flag in ("--device", "--models", "--model-dirs", "--vocabs", "--impls", "--rows-out"):
        ap.add_argument(flag, required=True)
    for flag in ("--batch", "--query-len", "--doc-len", "--steps", "--warmup"):
        ap.add_argument(flag, type=int, required=True)
    worker(ap.parse_args())


if __name__ == "__main__":
    worker_main()
