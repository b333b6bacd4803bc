"""Benchmark the Sparton head against its baselines, all measured in the same run.

Cases (bf16, D=768, full masks): forward (inference, no grad) and forward+backward; baselines per case:
torch eager head (the twin, bf16 logits like an HF head), torch.compile of it, a plain-torch
vocab-tiled head (chunks of V; checkpointed per chunk for training), and the bare GEMM H·Eᵀ (the
floor). Plus BERT-base (BertForMaskedLM from a config, random weights, sdpa) forward with the HF head
vs the Sparton head. Time: median of CUDA-event timings after warm-up, L2 flushed per repeat. Memory:
peak torch.cuda.max_memory_allocated during one call minus what was allocated before it (inputs), so
outputs and gradients count. Results go to --out as bench_head.json + bench_head.csv (lsr.benchmarks.harness schema), rewritten after
every case so a killed run keeps what it measured.

    PYTHONPATH=. python scripts/bench_head.py --out results/ [--only fwd,train,bert] [--skip compile]

Decoder-LLM cases (``--only llm,decoder``, scripts/bench_head_llm.py): the head at LLM vocabularies against the
torch head and the GEMM floor (``--llm-shapes``), and a Qwen3-0.6B-shaped decoder's training step and largest batch
with each head (``--decoder-*``); ``--name`` keeps their result file apart:

    PYTHONPATH=. python scripts/bench_head.py --out results/ --only llm,decoder --name bench_head_llm
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_head_llm import LLM_SHAPES, decoder_case, llm_head_case, llm_table, parse_shapes

from lsr.benchmarks.harness import PeakMemory, Results, environment, quantiles, time_for
from lsr.encode.sparton import sparton_head, torch_sparton_head
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd

D = 768
FWD_CASES = [(320, 512, 30522), (128, 2048, 30522), (32, 512, 250002)]
TRAIN_CASES = [(128, 512, 30522), (128, 8192, 30522), (64, 512, 250002)]
TARGETS = {  # (mode, B, S, V) -> (ms, extra MB), from the issues (the head's first issue; 250K time: issue 18)
    ("fwd", 320, 512, 30522): (13.0, 200),
    ("train", 128, 8192, 30522): (80.0, 2048),
    ("train", 64, 512, 250002): (26.0, 1024),
    ("bert", 320, 512, 30522): (83.0, None),
}


def eager_head(h, w, b, m):
    return torch_sparton_head(h, w, b, m, upcast=False)


def vocab_tiled_head(h, w, b, m, chunk: int = 8192, checkpoint: bool = False):
    """Plain torch, V in chunks: only [B, S, chunk] logits live at once (checkpointed when training)."""
    def part(h, w_c, b_c):
        logits = h @ w_c.t() + b_c
        return logits.masked_fill(~m[:, :, None], float("-inf")).amax(1)

    outs = []
    for v0 in range(0, w.shape[0], chunk):
        args = (h, w[v0:v0 + chunk], b[v0:v0 + chunk])
        outs.append(torch.utils.checkpoint.checkpoint(part, *args, use_reentrant=False) if checkpoint else part(*args))
    return torch.log1p(torch.relu(torch.cat(outs, 1)))


def cleanup() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def measure(fn: Callable[[], object], rep_ms: float) -> dict:
    """Time quantiles (L2 flushed per repeat) and peak extra MB of one call of fn; raises on OOM."""
    out = fn()  # compile / autotune / first-touch outside the measurements
    del out
    cleanup()
    with PeakMemory() as peak:
        out = fn()
    del out
    cleanup()
    return quantiles(time_for(fn, rep_ms)) | {"peak_extra_mb": peak.extra_mb}


def run_impls(mode: str, shape: tuple[int, int, int], impls: dict[str, Callable[[], object]], args, rows: list,
              flops: float, deadline: float, width: int = D) -> None:
    B, S, V = shape
    for name, fn in impls.items():
        row = {"mode": mode, "B": B, "S": S, "V": V, "D": width, "impl": name, "method": name, "ms": None,
               "peak_extra_mb": None, "tflops": None, "status": "ok", "active": args.active}
        if time.time() > deadline:
            row["status"] = "skipped (time budget)"
        else:
            try:
                row.update(measure(fn, args.rep))
                row["tflops"] = flops / row["ms"] / 1e9 if flops else None
            except torch.OutOfMemoryError:
                row["status"] = "OOM"
            except Exception as e:  # noqa: BLE001 - a baseline failing must not stop the run
                oom = "out of memory" in str(e).lower()
                row["status"] = "OOM" if oom else f"error: {type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(f"  {mode:5s} {B}x{S}x{V}x{width} {name:24s} {fmt(row)}", flush=True)
        try:
            cleanup()
        finally:  # a sticky CUDA error ends the process: keep what was measured
            if getattr(args, "case_out", None):
                Path(args.case_out).write_text(json.dumps({"rows": rows, "configs": tuned_configs()}))


def fmt(row: dict) -> str:
    if row["status"] != "ok":
        return row["status"]
    tf = f" {row['tflops']:6.0f} TFLOP/s" if row.get("tflops") else ""
    return f"{row['ms']:9.2f} ms  {row['peak_extra_mb']:9.0f} MB{tf}"


def head_cases(mode: str, shape, args, rows, deadline) -> None:
    B, S, V = shape
    torch.manual_seed(0)
    dev, dt16 = "cuda", torch.bfloat16
    train = mode == "train"
    h = torch.randn(B, S, D, device=dev, dtype=dt16, requires_grad=train)
    w = (torch.randn(V, D, device=dev) * 0.05).to(dt16).requires_grad_(train)
    b = torch.randn(V, device=dev) * 0.1
    if args.active < 1:  # a trained SPLADE head: most vocabulary entries never reach a positive logit
        b[torch.rand(V, device=dev) >= args.active] = -100.0
    b = b.to(dt16).requires_grad_(train)
    m = torch.ones(B, S, dtype=torch.bool, device=dev)
    dy = torch.randn(B, V, device=dev, dtype=dt16)
    flops = 2.0 * B * S * V * D
    compiled = torch.compile(eager_head, dynamic=False)

    def fwd(f):
        def go():
            with torch.no_grad():
                return f(h, w, b, m)
        return go

    def fwd_bwd(f):
        return lambda: torch.autograd.grad(f(h, w, b, m), (h, w, b), dy)

    wrap = fwd_bwd if train else fwd
    impls = {
        "sparton": wrap(lambda *a: sparton_head(*a, backend="triton")),
        # the same call with the tl forward kernel for every row: the in-run baseline of the resident-tile forward
        # (the same as "sparton" where the dispatch does not pick the resident kernel, e.g. off sm_90)
        "sparton_tl_forward": wrap(lambda *a: sparton_head(*a, backend="triton", variant="padded")),
        # E·Hᵀ ([V, B·S]): the same flops as H·Eᵀ, but its rows stay 16-byte aligned; with V = 30522 the
        # [B·S, V] layout sends cuBLAS to a slow kernel (~250 TFLOP/s on H200), which is no floor
        "gemm_floor": fwd(lambda h, w, b, m: w @ h.view(-1, D).t()),
    }
    if train:
        from lsr.encode.sparton.bwd import triton_sparton_bwd

        with torch.no_grad():
            _, y32, arg = triton_sparton_fwd(h, w, b, m, need_fp32=True)
        impls["sparton_deterministic"] = wrap(lambda *a: sparton_head(*a, backend="triton", deterministic=True))
        impls["sparton_fwd_only"] = fwd(lambda *a: sparton_head(*a, backend="triton"))
        impls["sparton_fwd_only_tl"] = fwd(lambda *a: sparton_head(*a, backend="triton", variant="padded"))
        impls["sparton_bwd_only"] = lambda: triton_sparton_bwd(dy, h, w, y32, arg)
        impls["sparton_bwd_only_det"] = lambda: triton_sparton_bwd(dy, h, w, y32, arg, deterministic=True)
        impls["sparton_bwd_dh_part"] = lambda: triton_sparton_bwd(dy, h, w, y32, arg, need_dw=False, need_db=False)
        impls["sparton_bwd_de_part"] = lambda: triton_sparton_bwd(dy, h, w, y32, arg, need_dh=False)
    impls["torch_eager"] = wrap(eager_head)
    impls["torch_vocab_tiled"] = wrap(lambda *a: vocab_tiled_head(*a, checkpoint=train))
    impls["torch_compile"] = wrap(compiled)
    impls = {k: f for k, f in impls.items() if not any(s in k for s in args.skip)}
    run_impls(mode, shape, impls, args, rows, flops, deadline)


def bert_case(args, rows, deadline, B: int = 320, S: int = 512) -> None:
    try:
        from transformers import BertConfig, BertForMaskedLM
    except ImportError:
        rows.append({"mode": "bert", "B": B, "S": S, "V": 30522, "D": D, "impl": "all", "ms": None,
                     "peak_extra_mb": None, "tflops": None, "status": "skipped (transformers not installed)"})
        print("  bert: transformers not installed, skipped")
        return
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(attn_implementation="sdpa")).cuda().to(torch.bfloat16).eval()
    ids = torch.randint(1000, 30000, (B, S), device="cuda")
    mask = torch.ones(B, S, dtype=torch.long, device="cuda")
    pred = model.cls.predictions

    @torch.no_grad()
    def backbone():
        return model.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    @torch.no_grad()
    def hf_head():  # the usual SPLADE pooling over full MLM logits
        logits = model(input_ids=ids, attention_mask=mask).logits
        return torch.amax(torch.log1p(torch.relu(logits)) * mask[:, :, None], dim=1)

    @torch.no_grad()
    def sparton():
        h = pred.transform(backbone())
        return sparton_head(h, pred.decoder.weight, pred.bias, mask, backend="triton")

    print(f"  bert attention: {getattr(model.config, '_attn_implementation', '?')}")
    impls = {"backbone_only": backbone, "hf_mlm_head": hf_head, "sparton_head": sparton}
    run_impls("bert", (B, S, 30522), {k: f for k, f in impls.items() if not any(s in k for s in args.skip)},
              args, rows, 0.0, deadline)


def tuned_configs() -> dict:
    from lsr.encode.sparton import fwd_padded
    from lsr.utils.runtime import failures

    out = {"failures": failures()}   # every route disabled in this process (the head's, the backbone's, graphs)
    for i, tuner in enumerate(fwd_padded.autotuners()):
        for k, v in getattr(tuner, "cache", {}).items():
            out[f"tuner{i} {k}"] = str(v)
        timings = getattr(tuner, "configs_timings", None) or {}
        out[f"tuner{i} last timings"] = {str(c): str(t) for c, t in timings.items()}
    return out


def save(results: Results, rows: list, configs: dict) -> None:
    for r in rows:
        t = TARGETS.get((r["mode"], r["B"], r["S"], r["V"]))
        r["target_ms"], r["target_mb"] = t if t else (None, None)
    results.config["fwd_configs"] = configs
    results.rows = []
    for r in rows:
        results.add(r, echo=False)


def table(rows: list) -> str:
    lines = ["| mode | B×S×V | impl | ms | peak extra MB | × floor | target |", "|---|---|---|---|---|---|---|"]
    floors = {(r["mode"], r["B"], r["S"], r["V"], r["D"]): r["ms"] for r in rows if r["impl"] == "gemm_floor" and r["ms"]}
    for r in rows:
        key = (r["mode"], r["B"], r["S"], r["V"], r["D"])
        ms = f"{r['ms']:.2f}" if r["ms"] else r["status"]
        mb = f"{r['peak_extra_mb']:.0f}" if r["peak_extra_mb"] is not None else ""
        ratio = f"{r['ms'] / floors[key]:.2f}" if r["ms"] and key in floors else ""
        tgt = ""
        if r["impl"] in ("sparton", "sparton_head") and TARGETS.get(key[:4]):
            t_ms, t_mb = TARGETS[key[:4]]
            ok = r["ms"] is not None and r["ms"] <= t_ms and (t_mb is None or r["peak_extra_mb"] <= t_mb)
            tgt = f"≤{t_ms} ms" + (f", ≤{t_mb} MB" if t_mb else "") + (" ✓" if ok else " ✗")
        lines.append(f"| {r['mode']} | {r['B']}×{r['S']}×{r['V']} | {r['impl']} | {ms} | {mb} | {ratio} | {tgt} |")
    return "\n".join(lines)


def run_case(mode: str, idx: int, args) -> None:
    """Child process: one case, its rows (and tuned configs) to --case-out as JSON."""
    torch._dynamo.config.cache_size_limit = 64
    rows: list = []
    deadline = float(args.deadline)
    if mode == "bert":
        bert_case(args, rows, deadline)
    elif mode == "llm":
        llm_head_case(parse_shapes(args.llm_shapes)[idx], args, rows, deadline, run_impls, eager_head)
    elif mode == "decoder":
        decoder_case(args, rows, deadline, eager_head)
    else:
        head_cases(mode, {"fwd": FWD_CASES, "train": TRAIN_CASES}[mode][idx], args, rows, deadline)
    Path(args.case_out).write_text(json.dumps({"rows": rows, "configs": tuned_configs()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench_results"))
    ap.add_argument("--only", default="fwd,train,bert", help="comma list of fwd, train, bert, llm, decoder")
    ap.add_argument("--name", default="bench_head", help="result files OUT/NAME.json and OUT/NAME.csv")
    ap.add_argument("--llm-shapes", default=LLM_SHAPES, help="llm cases, comma list of BxSxVxD")
    ap.add_argument("--decoder-batch", type=int, default=16, help="decoder: texts per step (the step-time rows)")
    ap.add_argument("--decoder-seq", type=int, default=512, help="decoder: tokens per text")
    ap.add_argument("--decoder-max-batch", type=int, default=512, help="decoder: stop doubling the batch here")
    ap.add_argument("--decoder-layers", type=int, default=28, help="decoder: layers (28 = Qwen3-0.6B)")
    ap.add_argument("--skip", default="", help="comma list of impl-name substrings to skip (e.g. compile,eager)")
    ap.add_argument("--rep", type=float, default=150,
                    help="timed repeats per impl: about this many ms (5..100 repeats)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new measurement after this many seconds")
    ap.add_argument("--shapes", default="", help="comma list of BxSxV to keep (default: all cases)")
    ap.add_argument("--active", type=float, default=1.0,
                    help="fraction of vocabulary entries whose logits can be positive (the rest get bias -100): "
                         "1.0 = random weights, every output non-zero; ~0.01 = a trained SPLADE model's sparsity")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: MODE:INDEX, run in a child process
    ap.add_argument("--case-out", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", help=argparse.SUPPRESS)
    args = ap.parse_args()
    skip_arg = args.skip
    args.skip = [s for s in args.skip.split(",") if s]
    if not torch.cuda.is_available():
        sys.exit("bench_head.py needs a CUDA GPU")
    if args.case:
        mode, idx = args.case.split(":")
        return run_case(mode, int(idx), args)
    # each case runs in its own process: a crash (e.g. a sticky CUDA error) costs one case, not the run
    deadline = time.time() + args.budget_s
    env, rows, configs, only = environment(dtype="bfloat16", D=D), [], {}, set(args.only.split(","))
    results = Results(args.out, args.name, env, {"args": vars(args)})
    parse_shapes(args.llm_shapes)  # a malformed list fails here, not in a child
    print(json.dumps(env), flush=True)
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cases = {"fwd": FWD_CASES, "train": TRAIN_CASES, "bert": [(320, 512, 30522)], "llm": parse_shapes(args.llm_shapes),
             "decoder": [(args.decoder_batch, args.decoder_seq, 151936)]}
    for mode in ("fwd", "bert", "train", "llm", "decoder"):
        if mode not in only:
            continue
        for idx, shape in enumerate(cases[mode]):
            if args.shapes and "x".join(map(str, shape)) not in args.shapes.split(","):
                continue
            case_out = logs / f"{mode}{idx}.json"
            cmd = [sys.executable, __file__, "--case", f"{mode}:{idx}", "--case-out", str(case_out),
                   "--deadline", str(deadline), "--skip", skip_arg, "--rep", str(args.rep), "--out", str(args.out),
                   "--active", str(args.active), "--llm-shapes", args.llm_shapes, "--decoder-batch",
                   str(args.decoder_batch), "--decoder-seq", str(args.decoder_seq), "--decoder-max-batch",
                   str(args.decoder_max_batch), "--decoder-layers", str(args.decoder_layers)]
            with open(logs / f"{mode}{idx}.log", "w") as log:
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
            print((logs / f"{mode}{idx}.log").read_text()[-3000:] if proc.returncode else "", end="", flush=True)
            if case_out.exists():
                data = json.loads(case_out.read_text())
                rows += data["rows"]
                configs.update(data["configs"])
            if proc.returncode:
                tail = (logs / f"{mode}{idx}.log").read_text().strip().splitlines()[-1:] or ["?"]
                rows.append({"mode": mode, "B": shape[0], "S": shape[1], "V": shape[2],
                             "D": shape[3] if len(shape) > 3 else D, "impl": "case",
                             "method": "case",
                             "ms": None, "peak_extra_mb": None, "tflops": None,
                             "status": f"crashed (rc {proc.returncode}): {tail[0][:300]}"})
                # diagnosis only (synchronous launches point at the failing kernel); not recorded as timings
                diag = list(cmd)
                diag[diag.index("--skip") + 1] = skip_arg + ",eager,tiled,compile,gemm"
                diag[diag.index("--case-out") + 1] = str(logs / f"{mode}{idx}_diag.json")
                with open(logs / f"{mode}{idx}_diag.log", "w") as log:
                    subprocess.run(diag, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"})
                print("DIAG:", (logs / f"{mode}{idx}_diag.log").read_text()[-2500:], flush=True)
            for r in rows:
                if r["mode"] == mode and (r["B"], r["S"], r["V"], r["D"])[:len(shape)] == shape[:4] or \
                        mode == "decoder" == r["mode"]:
                    print(f"  {mode:5s} {r['B']}x{r['S']}x{r['V']} {r['impl']:30s} {fmt(r)}", flush=True)
            save(results, rows, configs)
    print(json.dumps(configs, indent=1))
    print(table(rows))
    if only & {"llm", "decoder"}:
        print(llm_table(rows))


if __name__ == "__main__":
    main()
