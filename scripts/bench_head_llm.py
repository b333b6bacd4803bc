"""bench_head's LLM cases (modes ``llm`` and ``decoder``): the Sparton head at decoder-LLM vocabularies and a
Qwen3-0.6B-shaped decoder trained through lsr, each implementation measured in the same run.

* ``llm`` (B×S×V×D, bf16, forward + backward w.r.t. H and E, no bias as LLM heads have none): ``sparton``, the torch
  head that materialises [B, S, V] logits (``torch_eager``; an OOM is a result), and the GEMM floor: the logits GEMM
  and the two backward GEMMs (dH = G·E, dE = Gᵀ·H) with ``torch.mm`` at the same shapes (``gemm_floor``; its
  forward alone is ``gemm_floor_fwd``). ``× floor`` in the tables = ms / gemm_floor's ms.
* ``decoder``: random weights in a Qwen3-0.6B-shaped config (28 layers, hidden 1024, V = 151,936, tied head) saved
  with the tiny BPE tokenizer and loaded with ``SpladeEncoder.from_pretrained`` like a user's folder; one training
  step (``TrainableEncoder.encode_ids`` of B texts × S tokens, FLOPS loss, backward, fused AdamW; fp32 master
  weights, bf16 autocast) with the Sparton head and with the torch head: step time and peak memory at B, then the
  largest batch that fits (B doubled until OOM or ``--decoder-max-batch``) and the step time there.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

LLM_SHAPES = "32x512x151936x1024,32x512x151936x4096,32x512x128256x4096"
QWEN3_0_6B = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True,
              "max_position_embeddings": 40960, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6}


def parse_shapes(spec: str) -> list[tuple[int, int, int, int]]:
    """"BxSxVxD,..." -> [(B, S, V, D), ...]."""
    shapes = []
    for item in filter(None, spec.split(",")):
        parts = item.lower().split("x")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--llm-shapes: {item!r} is not BxSxVxD (positive integers, e.g. 32x512x151936x1024)")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def llm_head_case(shape: tuple[int, int, int, int], args, rows: list, deadline: float,
                  run_impls: Callable[..., None], eager_head: Callable[..., torch.Tensor]) -> None:
    """Sparton vs the materialising torch head vs the three GEMMs, fwd + bwd at one LLM shape (bench_head's
    ``run_impls`` times them and writes the rows)."""
    from lsr.encode.sparton import sparton_head

    B, S, V, D = shape
    torch.manual_seed(0)
    dev, bf16 = "cuda", torch.bfloat16
    h = torch.randn(B, S, D, device=dev, dtype=bf16, requires_grad=True)
    w = (torch.randn(V, D, device=dev) * D ** -0.5).to(bf16).requires_grad_()
    m = torch.ones(B, S, dtype=torch.bool, device=dev)
    dy = torch.randn(B, V, device=dev, dtype=bf16)
    h2 = h.detach().view(B * S, D)
    g = torch.randn(V, B * S, device=dev, dtype=bf16)  # the logits' gradient, in the logits' [V, B·S] layout

    def fwd_bwd(head):
        return lambda: torch.autograd.grad(head(h, w, None, m), (h, w), dy)

    def floor():  # logits E·Hᵀ, then dH = Gᵀ·E and dE = G·H: the GEMMs an fwd + bwd cannot avoid
        return torch.mm(w.detach(), h2.t()), torch.mm(g.t(), w.detach()), torch.mm(g, h2)

    impls = {"sparton": fwd_bwd(lambda *a: sparton_head(*a, backend="triton")),
             "gemm_floor": floor,
             "torch_eager": fwd_bwd(eager_head)}
    keep = lambda impls: {k: f for k, f in impls.items() if not any(s in k for s in args.skip)}  # noqa: E731
    run_impls("llm", (B, S, V), keep(impls), args, rows, 6.0 * B * S * V * D, deadline, width=D)
    forward = {"gemm_floor_fwd": lambda: torch.mm(w.detach(), h2.t())}  # a third of the work: its own TFLOP/s
    run_impls("llm", (B, S, V), keep(forward), args, rows, 2.0 * B * S * V * D, deadline, width=D)


def decoder_case(args, rows: list, deadline: float, eager_head: Callable[..., torch.Tensor]) -> None:
    """The Qwen3-0.6B-shaped training step with each head: at ``--decoder-batch``, then the largest batch."""
    import transformers

    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.testing_llm import save_random_decoder
    from lsr.train.model import TrainableEncoder, adamw_kernel

    config = transformers.Qwen3Config(**(QWEN3_0_6B | {"num_hidden_layers": args.decoder_layers}))
    data = Path(__file__).resolve().parents[1] / "data"
    B, S, V = args.decoder_batch, args.decoder_seq, config.vocab_size
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_random_decoder(config, Path(tmp) / "qwen3-0.6b-random", data, device="cuda",
                                     dtype=torch.bfloat16)
        encoder = SpladeEncoder.from_pretrained(folder, device="cuda", dtype=torch.float32, backend="triton",
                                                varlen=False)
    print(f"  decoder plan (train): {encoder.explain('doc', B, S, train=True)}", flush=True)
    torch_head = lambda h, w, b, m, impl, det: eager_head(h, w, b, m)  # noqa: E731 - TrainableEncoder's head call
    for name, head in (("sparton", "triton"), ("torch", torch_head)):
        model = TrainableEncoder(encoder, head=head)
        params = [p for _, p in model.named_parameters()]
        opt = torch.optim.AdamW(params, lr=1e-5, **adamw_kernel("cuda"))

        def step(batch: int, model=model, opt=opt) -> Callable[[], None]:
            ids = torch.randint(0, V, (batch, S), device="cuda")
            mask = torch.ones(batch, S, dtype=torch.long, device="cuda")

            def run() -> None:
                y = model.encode_ids("doc", ids, mask)
                loss = (y.sum(0) ** 2).sum() / batch ** 2  # the FLOPS regulariser: touches every output
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            return run

        base = {"mode": "decoder", "S": S, "V": V, "D": config.hidden_size, "active": args.active, "tflops": None}
        first = base | {"B": B, "impl": f"{name}_step", "method": f"{name}_step"} | _measure(step(B), deadline,
                                                                                          rep_ms=args.rep)
        rows.append(first)
        print(f"  decoder {name} B={B}: {first['status']} {first['ms']} ms", flush=True)
        best, batch = (first | {"impl": f"{name}_largest_batch", "method": f"{name}_largest_batch"}, 2 * B) \
            if first["status"] == "ok" else (None, args.decoder_max_batch + 1)
        while batch <= args.decoder_max_batch:
            row = _measure(step(batch), deadline)
            if row["status"] != "ok":
                break
            best, batch = base | {"B": batch, "impl": f"{name}_largest_batch", "method": f"{name}_largest_batch"} \
                | row, batch * 2
        if best is not None:
            capped = batch > args.decoder_max_batch
            best["status"] = f"ok (--decoder-max-batch {args.decoder_max_batch} reached)" if capped else "ok"
            rows.append(best)
            print(f"  decoder {name}: largest batch {best['B']} ({best['status']}), {best['ms']} ms", flush=True)
        for p in params:  # a step cut by an OOM leaves gradients behind
            p.grad = None
        del model, opt, params
        _free()


def _measure(fn: Callable[[], None], deadline: float, rep_ms: float | None = None) -> dict:
    """Peak extra MB and time of ``fn``: quantiles over ~``rep_ms`` of repeats, or (None) the median of two calls
    after the measured first one; an OOM or a passed deadline as the status."""
    from lsr.benchmarks.harness import PeakMemory, quantiles, time_calls, time_for

    if time.time() > deadline:
        return {"status": "skipped (time budget)", "ms": None, "peak_extra_mb": None}
    try:
        if rep_ms is not None:
            fn()  # first touch, autotuning, optimizer state
            _free()
        with PeakMemory() as peak:
            fn()
        times = time_for(fn, rep_ms, min_reps=3) if rep_ms is not None else time_calls(lambda i: fn(), 2, warmup=0)
        return quantiles(times) | {"peak_extra_mb": peak.extra_mb, "status": "ok"}
    except torch.OutOfMemoryError:
        return {"status": "OOM", "ms": None, "peak_extra_mb": None}
    finally:
        _free()


def _free() -> None:
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def llm_table(rows: list) -> str:
    """The short tables: the head at LLM shapes (× the GEMM floor), then the decoder's steps and largest batches."""
    out = ["| B×S×V, D | sparton ms | torch head ms | GEMM floor ms | sparton × floor | sparton MB | torch head MB |",
           "|---|---|---|---|---|---|---|"]
    cases = dict.fromkeys((r["B"], r["S"], r["V"], r["D"]) for r in rows if r["mode"] == "llm")
    for key in cases:
        got = {r["impl"]: r for r in rows if r["mode"] == "llm" and (r["B"], r["S"], r["V"], r["D"]) == key}
        ms = {k: (got[k]["ms"] if k in got and got[k]["ms"] else None) for k in ("sparton", "torch_eager", "gemm_floor")}
        cell = lambda k: f"{ms[k]:.2f}" if ms[k] else (got[k]["status"] if k in got else "")  # noqa: E731
        mb = lambda k: f"{got[k]['peak_extra_mb']:.0f}" if k in got and got[k]["peak_extra_mb"] else ""  # noqa: E731
        ratio = f"{ms['sparton'] / ms['gemm_floor']:.2f}" if ms["sparton"] and ms["gemm_floor"] else ""
        out.append(f"| {key[0]}×{key[1]}×{key[2]}, {key[3]} | {cell('sparton')} | {cell('torch_eager')} | "
                   f"{cell('gemm_floor')} | {ratio} | {mb('sparton')} | {mb('torch_eager')} |")
    out += ["", "| decoder (Qwen3-0.6B shape) | B | step ms | peak extra MB | status |", "|---|---|---|---|---|"]
    for r in (r for r in rows if r["mode"] == "decoder"):
        ms = f"{r['ms']:.1f}" if r["ms"] else ""
        mb = f"{r['peak_extra_mb']:.0f}" if r["peak_extra_mb"] else ""
        out.append(f"| {r['impl']} | {r['B']}×{r['S']} | {ms} | {mb} | {r['status']} |")
    return "\n".join(out)
