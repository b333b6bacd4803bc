"""Exact, order-independent score accumulation shared by every scoring kernel (scatter, csr, block).

Why fixed point: the default search path must give bit-identical results on every run, and the fast
kernels accumulate through atomics or in an order that depends on the work split. Float additions in a
varying order change the last bits; integer additions do not. So every contribution
``w_query * w_doc`` is formed exactly in float64 (24-bit x 24-bit mantissas fit in 53 bits), scaled by a
per-query power of two ``2**e`` and truncated to int64; the int64 sums are exact and associative, and the
final score is ``float32(float64(acc) * 2**-e)``.

The scale comes from an upper bound of every document score of query q,
``U_q = sum_t w_qt * max_scores[t]``: ``e_q = 61 - ceil(log2 U_q)`` keeps every partial sum below 2**61
(int64 holds 2**63). The absolute truncation error per contribution is < 2**-e_q ~ U_q * 2**-61, so a
score is the float64 inner product rounded to float32 (up to a double rounding, < 1 ulp), i.e. at
least as accurate as sequential float32 accumulation, and identical across kernels and their twins.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["FIXED_BITS", "from_fixed", "query_scales", "to_fixed", "torch_from_fixed", "torch_to_fixed"]

FIXED_BITS = 61  # partial sums stay below 2**61: 4x headroom under int64's 2**63
_MAX_EXP = 1000  # keep 2**e finite in float64 for degenerate bounds (empty or tiny queries)


def query_scales(q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                 max_scores: torch.Tensor, max_terms: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-query fixed-point scale ``2**e`` and its inverse, both float64 [B].

    Args:
        q_indptr: int64 [B+1] query CSR row pointers.
        q_terms: int32/int64 [nnz] term ids (< len(max_scores)).
        q_weights: float32 [nnz] query weights (> 0).
        max_scores: float32 [V] largest document weight of every term (0 for empty lists).
        max_terms: the longest query, if the caller knows it (saves a device sync).
    """
    bound = q_weights.to(torch.float64) * max_scores.to(torch.float64)[q_terms.long()]
    n = q_indptr.numel() - 1
    lengths = q_indptr[1:] - q_indptr[:-1]
    if max_terms is None:
        max_terms = int(lengths.max()) if n and bound.numel() else 0
    # a padded row sum is deterministic on every device (index_add_ of floats is not on CUDA) and,
    # unlike prefix-sum differences, exact to a few ulps for small rows next to large ones
    rows = torch.repeat_interleave(torch.arange(n, device=bound.device), lengths)
    cols = torch.arange(bound.numel(), device=bound.device) - q_indptr[:-1][rows]
    dense = torch.zeros(n, max(max_terms, 1), dtype=torch.float64, device=bound.device)
    dense[rows, cols] = bound
    upper = dense.sum(1)
    # upper = m * 2**E with m in [0.5, 1): every partial sum < 2**E (plus a few ulps of summation error)
    _, exp = torch.frexp(upper)
    e = (FIXED_BITS - exp.to(torch.float64)).clamp(-_MAX_EXP, _MAX_EXP)
    return torch.exp2(e), torch.exp2(-e)


def torch_to_fixed(w_query: torch.Tensor, w_doc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``to_fixed``: int64 contributions (broadcasting)."""
    return (w_query.to(torch.float64) * w_doc.to(torch.float64) * scale).to(torch.int64)


def torch_from_fixed(acc: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``from_fixed``: float32 scores from int64 sums (broadcasting)."""
    return (acc.to(torch.float64) * inv_scale).to(torch.float32)


@triton.jit
def to_fixed(w_query, w_doc, scale):
    """int64 contribution of one posting: exact float64 product, scaled, truncated toward zero."""
    return (w_query.to(tl.float64) * w_doc.to(tl.float64) * scale).to(tl.int64)


@triton.jit
def from_fixed(acc, inv_scale):
    """float32 score of an int64 sum (``inv_scale`` = 2**-e, float64)."""
    return (acc.to(tl.float64) * inv_scale).to(tl.float32)
