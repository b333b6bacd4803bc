"""Benchmark one SPLADE training step (forward + backward + AdamW) with three heads, same model, data
and batch in one run:

* ``lsr``: lsr.train's TrainableEncoder, the Sparton head (Triton on CUDA; never builds [B, S, V]);
* ``torch_head``: the same encoder with a plain torch head (bf16 [B, S, V] logits under autocast, masked max);
* ``st``: sentence-transformers 6.x SparseEncoder (Transformer fill-mask + SpladePooling max) with
  SpladeLoss(SparseMultipleNegativesRankingLoss) in a manual loop (no Trainer: `datasets` /
  `accelerate` are not needed); skipped with a reason when sentence-transformers does not import.
* ``lsr_graph`` (``--impls ...,lsr_graph``; GPU only): the trainer's CUDA-graph step (``optim.cuda_graph``,
  ``lsr.train.graph_step.GraphStep``): the compiled lsr step plus gradient clipping, captured once per batch
  shape and replayed, the loss read back once a step.

Models: BERT-base (V=30522) and XLM-R-base (V=250002) built from transformers configs with random
weights (no downloads; the decoder bias is shifted so ~150 terms per text are active, like a trained
SPLADE), saved once to a temporary folder that every implementation loads. Batch: B queries of
--query-len tokens and B positive documents of --doc-len tokens (random ids, full masks), InfoNCE with
in-batch negatives + FLOPS, bf16 autocast on CUDA, AdamW (fused on CUDA) for all three. Per (model,
--checkpointing setting): all implementations are built side by side and, per --batches entry, timed in
interleaved rounds (one step of each per round, the order rotated: host or clock drift hits all alike):
median / p10 / p90 step time, peak extra memory, tokens/s (--profile N adds the top kernels). Then,
unless --no-max-batch, each implementation alone: the largest batch that fits, doubling from the first
--batches entry until out of memory, then bisecting, each trial two steps, bounded by --search-s seconds.
Results: OUT/bench_train_<models>.json + .csv (lsr.benchmarks.harness schema), ratios printed at the end.

``--scaling 1,4`` measures instead the data-parallel step over W GPUs of the host (``torchrun
--nproc-per-node W`` per entry, the first --batches entry per GPU; ``bench_train_scaling.py``): lsr under
DDP with and without global in-batch negatives, sentence-transformers in a manual DDP loop with and
without ``gather_across_devices``; samples/s and the ratio W / 1 (OUT/bench_train_scaling_<models>.json).

    PYTHONPATH=. python scripts/bench_train.py --out results/train [--models bert,xlmr] [--batches 32,48] \
        [--checkpointing off,on] [--profile 3]
    PYTHONPATH=. python scripts/bench_train.py --quick --device cpu --out /tmp/bt   # tiny check
    PYTHONPATH=. python scripts/bench_train.py --scaling 1,4 --models bert,xlmr --batches 32 --out results/train
    PYTHONPATH=. python scripts/bench_train.py --scaling 1,2 --quick --device cpu --out /tmp/bt   # CPU check (gloo)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_steps import batch_ids, cleanup, is_oom, spladeish_loss, st_loss_step

from lsr.benchmarks.harness import PeakMemory, Results, environment, format_table, quantiles, time_calls
from lsr.encode.sparton import torch_sparton_head
from lsr.testing import SAMPLE_TEXTS, calibrate_sparsity

REPO = Path(__file__).resolve().parents[1]
IMPLS = ("lsr", "torch_head", "st")  # also: lsr_compile, st_compile (torch.compile of the backbone), lsr_graph
# (the trainer's CUDA-graph step, optim.cuda_graph: lsr.train.graph_step)


def model_config(name: str, quick: bool):
    import transformers as tf

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128} if quick else {}
    if name == "bert":
        return tf.BertConfig(vocab_size=30522, **small)
    if name == "xlmr":
        return tf.XLMRobertaConfig(vocab_size=50000 if quick else 250002, max_position_embeddings=514, type_vocab_size=1,
                                   pad_token_id=1, bos_token_id=0, eos_token_id=2, **small)
    raise ValueError(f"unknown model {name!r} (bert, xlmr)")


def save_random_model(name: str, quick: bool, folder: Path) -> Path:
    """Random-weight masked LM of ``name`` + the bert-base-uncased tokenizer files (ids are random anyway)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(REPO / "data" / "bert-base-uncased")
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(model_config(name, quick))
    calibrate_sparsity(model, tok, SAMPLE_TEXTS)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def lsr_step(folder: Path, device: str, head_impl: str, checkpointing: bool, compile: bool = False
             ) -> Callable[[dict, dict], None]:
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.train.model import TrainableEncoder, adamw_kernel

    enc = SpladeEncoder.from_pretrained(folder, device=device, dtype=torch.float32, varlen=False, compile=compile)
    head: Any = "auto"
    if head_impl == "torch":  # what an HF head does under autocast: bf16 [B, S, V] logits, masked max
        def head(h, w, b, m, *_):
            return torch_sparton_head(h, w, b, m, upcast=False)
    model = TrainableEncoder(enc, head=head, bf16=True, gradient_checkpointing=checkpointing).train()
    opt = torch.optim.AdamW([p for _, p in model.named_parameters()], lr=1e-5, **adamw_kernel(device))

    def step(q: dict, d: dict) -> None:
        opt.zero_grad(set_to_none=True)
        with model.autocast():  # as lsr.train does: one region for both towers
            vq, vd = model.encode_ids("query", **q), model.encode_ids("doc", **d)
        spladeish_loss(vq, vd).backward()
        opt.step()
    return step


def lsr_graph_step(folder: Path, device: str, checkpointing: bool) -> Callable[[dict, dict], None]:
    """The trainer's CUDA-graph step (``lsr.train.graph_step.GraphStep``, what ``optim.cuda_graph`` runs): the
    compiled backbone's forward, backward, gradient clipping (the trainer's default bound) and the capturable
    fused AdamW captured once per batch shape and replayed, the loss and its log fields read back once a step
    as the trainer does. The loss is the trainer's InfoNCE + FLOPS with ``spladeish_loss``'s weights."""
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.train.batch_loss import LossInputs
    from lsr.train.config import LossConfig, OptimConfig
    from lsr.train.graph_step import GraphStep, StepInputs
    from lsr.train.model import TrainableEncoder, adamw_kernel

    if not device.startswith("cuda"):
        raise ImportError("a CUDA graph needs a GPU")
    enc = SpladeEncoder.from_pretrained(folder, device=device, dtype=torch.float32, varlen=False, compile=True)
    model = TrainableEncoder(enc, bf16=True, gradient_checkpointing=checkpointing).train()
    opt = torch.optim.AdamW([p for _, p in model.named_parameters()], lr=1e-5,
                            **adamw_kernel(device, capturable=True))
    loss_cfg = LossConfig(flops_query=5e-4, flops_doc=1e-3)  # spladeish_loss
    graph = GraphStep(model, opt, loss_cfg, OptimConfig().max_grad_norm)
    no_exclusions: dict[tuple[int, int], torch.Tensor] = {}

    def step(q: dict, d: dict) -> None:
        shape = (q["input_ids"].shape[0], d["input_ids"].shape[0])
        exclude = no_exclusions.setdefault(shape, torch.zeros(shape, dtype=torch.bool, device=device))
        inputs = StepInputs(q["input_ids"], q["attention_mask"], d["input_ids"], d["attention_mask"],
                            LossInputs(exclude, None, loss_cfg.flops_query, loss_cfg.flops_doc))
        graph.step_tensors(inputs, 1e-5).tolist()  # the trainer's one host read per step
    return step


def st_step(folder: Path, device: str, doc_len: int, checkpointing: bool, compile: bool = False
            ) -> Callable[[dict, dict], None]:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from lsr.train.model import checkpoint_activations

    model = SparseEncoder(modules=[Transformer(str(folder), transformer_task="fill-mask", max_seq_length=doc_len),
                                   SpladePooling("max")], device=device).train()
    if checkpointing:
        checkpoint_activations(model[0].auto_model)
    if compile:  # the fill-mask model, its [B, S, V] head included; ST calls its .forward directly
        model[0].model.forward = torch.compile(model[0].model.forward, dynamic=True)
    loss_fn = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model), document_regularizer_weight=1e-3,
                         query_regularizer_weight=5e-4)
    return st_loss_step(model, loss_fn, device)


def build(impl: str, folder: Path, args: argparse.Namespace, checkpointing: bool) -> Callable[[dict, dict], None]:
    if impl == "lsr_graph":
        return lsr_graph_step(folder, args.device, checkpointing)
    compile = impl.endswith("_compile")
    if impl.startswith("st"):
        return st_step(folder, args.device, args.doc_len, checkpointing, compile)
    return lsr_step(folder, args.device, "torch" if impl == "torch_head" else "auto", checkpointing, compile)


def fits(step: Callable, B: int, vocab: int, args: argparse.Namespace) -> bool:
    q, d = batch_ids(B, args.query_len, vocab, args.device), batch_ids(B, args.doc_len, vocab, args.device)
    try:
        for _ in range(2):
            step(q, d)
        return True
    except Exception as e:  # noqa: BLE001 - only out-of-memory means "does not fit"
        if not is_oom(e):
            raise
        return False
    finally:
        del q, d
        cleanup()


def largest_batch(step: Callable, vocab: int, args: argparse.Namespace) -> tuple[int | None, bool]:
    """(largest batch that ran two steps, whether the search finished within --search-s)."""
    deadline = time.time() + args.search_s
    lo, hi, B = 0, None, args.batches[0]
    while hi is None and B <= args.max_batch:
        if time.time() > deadline:
            return lo or None, False
        if fits(step, B, vocab, args):
            lo, B = B, B * 2
        else:
            hi = B
    if hi is None:
        return lo, True  # fits up to --max-batch
    while hi - lo > max(1, lo // 32):  # within ~3%
        if time.time() > deadline:
            return lo or None, False
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(step, mid, vocab, args) else (lo, mid)
    return lo or None, True


def oom_row(e: Exception) -> dict:
    if not is_oom(e):
        raise e
    cleanup()
    return {"status": "OOM"}


def measure_batch(steps: dict[str, Callable], B: int, vocab: int, args: argparse.Namespace) -> dict[str, dict]:
    """Every implementation at batch B, timed in interleaved rounds (each round one step of each, the
    order rotated) so that drift of the host or of the GPU's clocks hits all of them alike."""
    q, d = batch_ids(B, args.query_len, vocab, args.device), batch_ids(B, args.doc_len, vocab, args.device)
    rows: dict[str, dict] = {}
    live: dict[str, Callable] = {}
    for impl, step in steps.items():
        try:
            step(q, d)  # autotune / allocate optimizer state outside the timings
            cleanup()
            with PeakMemory() as peak:
                step(q, d)
            rows[impl], live[impl] = {"peak_extra_mb": peak.extra_mb}, step
        except Exception as e:  # noqa: BLE001 - out of memory at this batch is a result
            rows[impl] = oom_row(e)
    times: dict[str, list[float]] = {impl: [] for impl in live}
    names = list(live)
    for r in range(args.repeats if names else 0):
        for impl in names[r % len(names):] + names[:r % len(names)]:
            times[impl] += time_calls(lambda _, f=live[impl]: f(q, d), 1, warmup=0)
    for impl in live:
        rows[impl] |= quantiles(times[impl])
        rows[impl]["tokens_per_s"] = B * (args.query_len + args.doc_len) / (rows[impl]["ms"] / 1e3)
        if args.profile:
            rows[impl]["profile"] = profile_steps(lambda f=live[impl]: f(q, d), args.profile)
    return rows


def profile_steps(run: Callable[[], None], steps: int, top: int = 25) -> list[dict]:
    """torch.profiler over ``steps`` steps: the ``top`` operators / kernels by device time, ms per step."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            run()
        cleanup()
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    rows = []
    kernels_us = sum(e.self_device_time_total for e in prof.key_averages()
                     if str(getattr(e, "device_type", "")).endswith("CUDA"))
    rows.append({"name": "ALL GPU KERNELS (busy time; cpu column: wall time per profiled step)", "calls_per_step": 0,
                 "device_ms_per_step": kernels_us / 1e3 / steps, "cpu_ms_per_step": wall_ms})
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        dev_us = getattr(e, "self_cuda_time_total", 0) if dev_us is None else dev_us
        rows.append({"name": e.key[:90], "calls_per_step": e.count / steps, "device_ms_per_step": dev_us / 1e3 / steps,
                     "cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps})
    rows.sort(key=lambda r: (-r["device_ms_per_step"], -r["cpu_ms_per_step"]))
    return rows[:top]


def run_model(name: str, folder: Path, vocab: int, checkpointing: bool, args: argparse.Namespace,
              results: Results) -> None:
    """Timings of every implementation at every --batches entry, then each one's largest batch alone."""
    base = {"model": name, "vocab_size": vocab, "query_len": args.query_len, "doc_len": args.doc_len,
            "checkpointing": checkpointing}
    impls = args.impls.split(",")
    steps, skipped = {}, {}
    for impl in impls:
        try:
            steps[impl] = build(impl, folder, args, checkpointing)
        except ImportError as e:
            skipped[impl] = f"skipped: {e}"
    for B in args.batches:
        print(f"# {name} B={B} checkpointing={checkpointing}", flush=True)
        rows = measure_batch(steps, B, vocab, args)
        for impl in impls:
            results.add(base | {"impl": impl, "method": impl, "B": B, "status": skipped.get(impl, "ok")} | rows.get(impl, {}))
    del steps
    cleanup()
    if args.no_max_batch:
        return
    for impl in impls:
        if impl not in skipped and not impl.endswith("_compile") and impl != "lsr_graph":  # (recompiles per batch)
            step = build(impl, folder, args, checkpointing)
            best, done = largest_batch(step, vocab, args)
            del step
            cleanup()
            results.add(base | {"impl": impl, "method": "max_batch", "B": None, "status": "ok", "max_batch": best,
                                "max_batch_search_done": done})


def summarize(rows: list[dict]) -> dict:
    """Ratios against lsr: step time per (model, checkpointing, batch), largest batch per (model, checkpointing)."""
    out: dict = {}
    timed = [r for r in rows if r.get("ms") is not None]
    for r in timed:
        for base in ("lsr",) + (("lsr_compile",) if r["impl"] == "st_compile" else ()):
            ref = next((x for x in timed if x["impl"] == base and all(x[k] == r[k] for k in ("model", "checkpointing", "B"))), None)
            if ref and r["impl"] != base:
                out[f"{r['model']} ckpt={r['checkpointing']} B={r['B']}: step time {r['impl']} / {base}"] = r["ms"] / ref["ms"]
    best = {(r["model"], r["checkpointing"], r["impl"]): r["max_batch"] for r in rows if r.get("max_batch")}
    for (model, ckpt, impl), value in best.items():
        if impl != "lsr" and (model, ckpt, "lsr") in best:
            out[f"{model} ckpt={ckpt}: max batch lsr / {impl}"] = best[(model, ckpt, "lsr")] / value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="bert,xlmr")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--batches", default="32", help="queries (and positive documents) per step; comma list")
    ap.add_argument("--checkpointing", default="off", help="backbone activation checkpointing: off, on or off,on")
    ap.add_argument("--query-len", type=int, default=32)
    ap.add_argument("--doc-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-max-batch", action="store_true", help="skip the largest-batch search")
    ap.add_argument("--max-batch", type=int, default=16384, help="stop doubling here")
    ap.add_argument("--search-s", type=float, default=240, help="seconds per largest-batch search")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="also profile STEPS steps per implementation (top kernels by device time in the JSON)")
    ap.add_argument("--quick", action="store_true", help="tiny models and batches (a CPU check of the script)")
    ap.add_argument("--scaling", default=None, metavar="W,W",
                    help="only the data-parallel rows: torchrun --nproc-per-node W per entry (e.g. 1,4)")
    ap.add_argument("--scaling-impls", default="lsr,lsr_gather,st,st_gather")
    ap.add_argument("--scaling-steps", type=int, default=20, help="timed steps per scaling row")
    ap.add_argument("--scaling-warmup", type=int, default=3, help="untimed steps before them")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        args.batches, args.query_len, args.doc_len, args.repeats = [2], 8, 16, 2
        args.max_batch, args.search_s = min(args.max_batch, 8), min(args.search_s, 60)
    name = "bench_train_" + ("scaling_" if args.scaling else "") + args.models.replace(",", "_") + (
        "_quick" if args.quick else "")
    results = Results(args.out, name, environment(args.device), vars(args))
    with tempfile.TemporaryDirectory() as tmp:
        folders = {m: save_random_model(m, args.quick, Path(tmp) / m) for m in args.models.split(",")}
        vocabs = {m: model_config(m, args.quick).vocab_size for m in folders}
        if args.scaling:
            return run_scaling(folders, vocabs, args, results, Path(tmp))
        for name, folder in folders.items():
            for setting in args.checkpointing.split(","):
                run_model(name, folder, vocabs[name], setting == "on", args, results)
    results.summary = summarize(results.rows)
    results.save()
    print(format_table(results.rows, ["model", "checkpointing", "impl", "B", "status", ("ms", ".1f"), ("ms_p10", ".1f"),
                                      ("ms_p90", ".1f"), ("peak_extra_mb", ".0f"), ("tokens_per_s", ".0f"), "max_batch"]))
    for key, value in results.summary.items():
        print(f"{key}: {value:.2f}x")
    for r in results.rows:
        if r.get("profile"):
            print(f"# profile {r['model']} {r['impl']} (ms per step: device, cpu)")
            for p in r["profile"][:12]:
                print(f"  {p['device_ms_per_step']:8.2f} {p['cpu_ms_per_step']:8.2f}  x{p['calls_per_step']:<5g} {p['name']}")


def run_scaling(folders: dict[str, Path], vocabs: dict[str, int], args: argparse.Namespace, results: Results,
                tmp: Path) -> None:
    """The scaling rows: one torchrun job per --scaling entry, the table and the W / 1 ratios last."""
    from bench_train_scaling import launch, scaling_summary

    for world in (int(w) for w in args.scaling.split(",")):
        print(f"# torchrun --nproc-per-node {world}", flush=True)
        for row in launch(world, folders, vocabs, args, tmp / f"rows-{world}.json"):
            results.add(row | {"query_len": args.query_len, "doc_len": args.doc_len}, echo=False)
    results.summary = scaling_summary(results.rows)
    results.save()
    print(format_table(results.rows, ["model", "impl", "world", "B", "status", ("ms", ".1f"), ("ms_p10", ".1f"),
                                      ("ms_p90", ".1f"), ("samples_per_s", ".0f"), ("peak_extra_mb", ".0f")]))
    for key, value in results.summary.items():
        print(f"{key}: {value:.2f}x")


if __name__ == "__main__":
    main()
