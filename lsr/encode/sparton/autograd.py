"""The Sparton head's autograd function: the padded Triton forward, the backward from (y32, argmax) only.

The forward saves hidden, weight, y32 (float32 Y) and the argmax over positions; the backward (``bwd``) needs nothing
else: no [B, S, V] and no recomputed GEMM. ``dispatch.sparton_head`` applies it when a gradient is needed on the
Triton backend.
"""

from __future__ import annotations

import torch

from lsr.encode.sparton.fwd_padded import RowsForward, triton_sparton_fwd

__all__ = ["SpartonHeadFunction"]


class SpartonHeadFunction(torch.autograd.Function):
    """Triton forward; backward from the saved (y32, argmax) only (see ``bwd``).

    apply(hidden [B,S,D], weight [V,D], bias [V] | None, mask bool [B,S], deterministic, rows_without_holes) -> y
    [B,V]; ``rows_without_holes`` is handed to ``fwd_padded.triton_sparton_fwd`` (the resident kernel or None)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, mask, deterministic, rows_without_holes: RowsForward | None = None):  # type: ignore[override]
        hidden, weight = hidden.contiguous(), weight.contiguous()
        y, y32, arg = triton_sparton_fwd(hidden, weight, bias, mask, need_fp32=True,
                                         rows_without_holes=rows_without_holes)
        ctx.save_for_backward(hidden, weight, y32, arg)
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.deterministic = deterministic
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        from lsr.encode.sparton.bwd import triton_sparton_bwd  # (imports triton at load; the package must not)

        hidden, weight, y32, arg = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh, dw, db = triton_sparton_bwd(dy, hidden, weight, y32, arg, need_dh=need_h, need_dw=need_w,
                                        need_db=need_b and ctx.bias_dtype is not None,
                                        deterministic=ctx.deterministic)
        if db is not None:
            db = db.to(ctx.bias_dtype)
        return dh, dw, db, None, None, None
