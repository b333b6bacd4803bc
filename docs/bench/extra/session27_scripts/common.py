"""Helpers the session-27 experiment scripts share: timing, the 250K head case, dH buckets for any row-group size."""
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), ".old/exp"))
from lsr.benchmarks.harness import time_calls  # noqa: E402
from lsr.encode.sparton import bwd as SB  # noqa: E402
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
CASES = ((64, 512, 250002, 1.0), (64, 512, 250002, 0.01), (128, 512, 30522, 1.0))


def median_ms(fn, rep: int = 20, warm: int = 3) -> float:
    """Median CUDA-event milliseconds of fn() over ``rep`` calls after ``warm`` untimed ones."""
    return statistics.median(time_calls(lambda i: fn(), rep, warmup=warm))


def head_case(B: int, S: int, V: int, active: float = 1.0, D: int = 768, seed: int = 0) -> dict:
    """Random bf16 hidden states and head (bias -100 outside an ``active`` share of the vocabulary), full masks, the
    forward's y32 / argmax, an upstream gradient dy and g = dy·exp(-y)·[y > 0]."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(B, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(V, D, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    bias = torch.randn(V, device="cuda", generator=gen) * 0.1
    if active < 1:
        bias[torch.rand(V, device="cuda", generator=gen) > active] = -100.0
    m = torch.ones(B, S, dtype=torch.bool, device="cuda")
    _, y32, arg = triton_sparton_fwd(h, w, bias, m, need_fp32=True)
    dy = torch.randn(B, V, device="cuda", generator=gen)
    return {"h": h, "w": w, "bias": bias, "m": m, "y32": y32, "arg": arg, "dy": dy,
            "g": torch.where(y32 > 0, dy * torch.exp(-y32), 0.0), "key": f"{B}x{S}x{V}_a{active}"}


def buckets(g: torch.Tensor, arg: torch.Tensor, S: int, rows: int):
    """(offsets, tagged v, g) of the fast-mode dH buckets with ``rows`` rows a group, through the shipped kernels."""
    B, V = g.shape
    counts = torch.zeros(triton.cdiv(B * S, rows) + 1, dtype=torch.int32, device=g.device)
    live = torch.zeros(V // 32 + 1, dtype=torch.int32, device=g.device)
    SB._bwd_prep_kernel[(B, triton.cdiv(V, 1024))](torch.ones_like(g), torch.where(g != 0, 1.0, 0.0), arg,
                                                    torch.empty_like(g), counts[1:], live, S, V, V, COUNT=True,
                                                    LIVE=False, ROWS=rows, TILE=32, BLOCK=1024)
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    saved, SB._DH_ROWS = SB._DH_ROWS, rows
    try:
        return (offsets, *SB._bucket_entries(g, arg, offsets, S, False))
    finally:
        SB._DH_ROWS = saved


def shipped_dh(case: tuple) -> tuple[dict, tuple, torch.Tensor, list[float]]:
    """A head case, its 16-row buckets, the shipped dH kernel's output on them and two timings of that kernel."""
    c = head_case(*case)
    bk = buckets(c["g"], c["arg"], c["h"].shape[1], 16)
    run = lambda: SB._hidden_grads(c["h"], c["w"], bk[1], bk[2], bk[0])  # noqa: E731
    return c, bk, run(), [median_ms(run) for _ in range(2)]
