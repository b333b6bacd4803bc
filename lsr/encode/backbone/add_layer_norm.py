"""Residual add + LayerNorm in one pass: y = LayerNorm(x + residual) over the last dimension (inference).

Why: a post-LN transformer layer ends twice in ``LayerNorm(h + x)``. In torch that is two kernels (the
add writes the sum, the LayerNorm reads it back), and torch's bf16 LayerNorm kernel streams well below the
GPU's memory bandwidth on [T, 768] rows: in the padding-free BERT body these two steps were a sizeable share of
the GPU time (measurements in the performance docs). One kernel reads x and the residual once and writes y.

Numerics follow torch's: the sum is rounded to the input dtype first (as the separate add stores it),
then the mean and (biased) variance are computed in fp32 over the whole row held in registers (two
passes over registers rather than Welford: the same value up to fp32 rounding), y = (s - mean) · rstd ·
weight + bias in fp32, rounded once to the input dtype.

Public API: ``add_layer_norm`` (backend choice), ``triton_add_layer_norm`` (launcher),
``torch_add_layer_norm`` (twin: ``F.layer_norm(x + residual)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lsr.utils.kernels import INTERPRET, tl, triton, use_triton

__all__ = ["add_layer_norm", "torch_add_layer_norm", "triton_add_layer_norm"]


def torch_add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                         bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Torch twin: ``F.layer_norm(x + residual, (D,), weight, bias, eps)``."""
    return F.layer_norm(x + residual, (x.shape[-1],), weight, bias, eps)


if triton is not None:

    @triton.jit
    def _add_layer_norm_kernel(
        x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, R, D, eps,
        stride_x_r, stride_r_r, stride_y_r,
        HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROUND_SUM: tl.constexpr,  # 0: fp32, 1: to bf16, 2: to fp16
        BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_D)
        r_ok = rows < R
        c_ok = cols < D
        ok = r_ok[:, None] & c_ok[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load(x_ptr + rows64[:, None] * stride_x_r + cols[None, :], mask=ok, other=0.0)
        r = tl.load(r_ptr + rows64[:, None] * stride_r_r + cols[None, :], mask=ok, other=0.0)
        s = x.to(tl.float32) + r.to(tl.float32)
        # torch's add stores the sum in the input dtype before the LayerNorm reads it
        if ROUND_SUM == 1:  # bf16 round-to-nearest-even on the bits (the interpreter's cast truncates)
            bits = s.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            s = tl.where(s != s, s, bits.to(tl.float32, bitcast=True))  # NaN stays NaN
        elif ROUND_SUM == 2:
            s = s.to(tl.float16).to(tl.float32)
        mean = tl.sum(s, axis=1) / D
        d = tl.where(ok, s - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / D + eps)
        y = d * rstd[:, None]
        if HAS_W:
            y = y * tl.load(w_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_B:
            y = y + tl.load(b_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows64[:, None] * stride_y_r + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=ok)


def triton_add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                          bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Launcher. x, residual [..., D] of one float dtype and shape (rows may be strided, the last
    dimension contiguous), weight / bias [D] | None -> y [..., D] in x's dtype, contiguous."""
    if triton is None:
        raise RuntimeError("the Triton backend needs the `triton` package")
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(f"x and residual must share shape and dtype, got {tuple(x.shape)} {x.dtype} / "
                         f"{tuple(residual.shape)} {residual.dtype}")
    D = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (D,):
            raise ValueError(f"{name} must be [{D}], got {tuple(t.shape)}")
    x2, r2 = x.reshape(-1, D), residual.reshape(-1, D)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if r2.stride(1) != 1:
        r2 = r2.contiguous()
    R = x2.shape[0]
    # the interpreter truncates fp32 -> bf16/fp16 stores (GPU rounds to nearest): store fp32, cast here
    y = torch.empty(R, D, dtype=torch.float32 if INTERPRET else x.dtype, device=x.device)
    if R and D:
        block_d = triton.next_power_of_2(D)
        block_r = max(1, min(16, 4096 // block_d))  # ~4K elements per program: 8 warps, no spills at D=768
        _add_layer_norm_kernel[(triton.cdiv(R, block_r),)](
            x2, r2, weight if weight is not None else x2, bias if bias is not None else x2, y, R, D, float(eps),
            x2.stride(0), r2.stride(0), y.stride(0),
            HAS_W=weight is not None, HAS_B=bias is not None,
            ROUND_SUM={torch.bfloat16: 1, torch.float16: 2}.get(x.dtype, 0),
            BLOCK_R=block_r, BLOCK_D=block_d, **({} if INTERPRET else {"num_warps": 8}))
    return y.to(x.dtype).reshape(x.shape)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float, backend: str = "auto") -> torch.Tensor:
    """LayerNorm(x + residual) over the last dim. ``backend``: "auto" (Triton on CUDA without autograd,
    the torch twin elsewhere), "triton", "torch"."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight, bias))
    if needs_grad or not use_triton(backend, x.device):
        return torch_add_layer_norm(x, residual, weight, bias, eps)
    return triton_add_layer_norm(x, residual, weight, bias, eps)
