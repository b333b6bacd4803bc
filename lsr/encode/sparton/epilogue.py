"""The padded forwards' shared epilogue: a batch row's outputs from its running max over positions.

Both the tl kernel (``fwd_padded``) and the Gluon kernel (``fwd_resident``) call ``store_head_row``, so the two
write the same bits; it lives here so that neither forward module imports the other.
"""

from __future__ import annotations

from lsr.utils.kernels import tl, triton

__all__ = ["store_head_row"]

if triton is not None:

    @triton.jit
    def store_head_row(run_max, run_arg, offs_v, v_ok, b, bias_ptr, y_ptr, y32_ptr, arg_ptr, stride_y,
                       HAS_BIAS: tl.constexpr, STORE_FP32: tl.constexpr, STORE_ARGMAX: tl.constexpr):
        """Batch row b's outputs from its running max over s: y = log1p(relu(max + bias)), y32 and argmax. Also
        called from the Gluon kernel (fwd_resident.py), so both forwards write the same bits."""
        if HAS_BIAS:  # bias is constant over s: add after the max, argmax unchanged
            run_max += tl.load(bias_ptr + offs_v, mask=v_ok, other=0.0).to(tl.float32)
        r = tl.maximum(run_max, 0.0)  # relu; -inf (fully masked row) -> 0
        u = 1.0 + r  # log1p(r) = log(u) * r / (u - 1) (Kahan): exact for tiny r
        y = tl.where(u == 1.0, r, tl.log(u) * (r / tl.where(u == 1.0, 1.0, u - 1.0)))
        out = b.to(tl.int64) * stride_y + offs_v
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=v_ok)
        if STORE_ARGMAX:
            tl.store(arg_ptr + out, run_arg, mask=v_ok)
        if STORE_FP32:
            tl.store(y32_ptr + out, y, mask=v_ok)
