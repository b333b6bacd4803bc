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

from lsr.utils.kernels import check_tensor, tl, triton

__all__ = ["FIXED_BITS", "check_query_csr", "check_scales", "from_fixed", "query_scales", "to_fixed", "torch_from_fixed",
           "torch_to_fixed", "triton_query_scales"]

FIXED_BITS = 61  # partial sums stay below 2**61: 4x headroom under int64's 2**63
_MAX_EXP = 1000  # keep 2**e finite in float64 for degenerate bounds (empty or tiny queries)
_UNIT = float(2**40)  # resolution of the integer bound sum (up to 2**23 terms per query fit in int64)
_TINY = 1e-300


def query_scales(q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                 max_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-query fixed-point scale ``2**e`` and its inverse, both float64 [B].

    Args:
        q_indptr: int64 [B+1] query CSR row pointers.
        q_terms: int32/int64 [T] term ids (< len(max_scores)); entries past ``q_indptr[-1]`` are ignored
            (a fixed-size buffer, as the CUDA-graph path uses, may be longer than the queries).
        q_weights: float32 [T] query weights (>= 0).
        max_scores: float32 [V] largest document weight of every term (0 for empty lists).

    No host sync, and a query's scale depends on that query alone (not on its batch, its term order
    or the buffer length): the bound ``U_q`` is taken as ``m_q * ceil-sum(bound_t / m_q)`` in integer
    units of 2**-40 with ``m_q = max_t bound_t``, so the only float operations are exact products,
    one division per term and one final product -- no order-dependent float sum.
    """
    n = q_indptr.numel() - 1
    dev = q_weights.device
    f64 = torch.float64
    bound = q_weights.to(f64) * max_scores.to(f64)[q_terms.long()]  # exact: 24 x 24-bit mantissas
    pos = torch.arange(bound.numel(), device=dev)
    rows = torch.searchsorted(q_indptr[1:], pos, right=True)  # n for the unused tail of a buffer
    m = torch.zeros(n + 1, dtype=f64, device=dev).scatter_reduce_(0, rows, bound, "amax")
    units = torch.ceil(bound / m[rows].clamp_min(_TINY) * _UNIT).to(torch.int64)  # <= 2**40 each
    csum = torch.zeros(bound.numel() + 1, dtype=torch.int64, device=dev)
    torch.cumsum(units, 0, out=csum[1:])  # integer prefix sums: exact in any order
    total = csum[q_indptr[1:]] - csum[q_indptr[:-1]]
    upper = m[:n] * total.to(f64) / _UNIT  # >= sum_t bound_t, up to one rounding of the product
    # upper = f * 2**E with f in [0.5, 1): every partial sum < 2**E
    _, exp = torch.frexp(upper)
    e = (FIXED_BITS - exp.to(f64)).clamp(-_MAX_EXP, _MAX_EXP)
    return torch.exp2(e), torch.exp2(-e)


if triton is not None:

    @triton.jit
    def _term_bounds(terms_ptr, weights_ptr, max_ptr, t0, end, BLOCK: tl.constexpr):
        """float64 [BLOCK] bounds w_qt * max_scores[t] of the terms t0.. (0.0 past ``end``)."""
        offs = t0 + tl.arange(0, BLOCK)
        mask = offs < end
        term = tl.load(terms_ptr + offs, mask=mask, other=0)
        return tl.load(weights_ptr + offs, mask=mask, other=0.0).to(tl.float64) * \
            tl.load(max_ptr + term, mask=mask, other=0.0).to(tl.float64)


    @triton.jit
    def _query_scales_kernel(indptr_ptr, terms_ptr, weights_ptr, max_ptr, scale_ptr, inv_ptr, BLOCK: tl.constexpr):
        """One query per program: ``query_scales``'s float64 steps in the same order (so the same bits; float64
        division is IEEE round-to-nearest in Triton)."""
        q = tl.program_id(0)
        start = tl.load(indptr_ptr + q)
        end = tl.load(indptr_ptr + q + 1)
        m = tl.zeros((), dtype=tl.float64)
        for t0 in range(start, end, BLOCK):
            m = tl.maximum(m, tl.max(_term_bounds(terms_ptr, weights_ptr, max_ptr, t0, end, BLOCK), 0))
        denom = tl.maximum(m, 1e-300)
        total = tl.zeros((), dtype=tl.int64)
        for t0 in range(start, end, BLOCK):
            bound = _term_bounds(terms_ptr, weights_ptr, max_ptr, t0, end, BLOCK)
            total += tl.sum(tl.math.ceil(bound / denom * 1099511627776.0).to(tl.int64), 0)   # * 2**40; 0 past end
        upper = m * total.to(tl.float64) / 1099511627776.0
        # frexp's exponent from the bits (0 for 0.0; subnormals clamp to the same e below as frexp's)
        biased = (upper.to(tl.int64, bitcast=True) >> 52) & 2047
        exp = tl.where(upper > 0, biased - 1022, 0)
        e = tl.minimum(tl.maximum(61 - exp, -1000), 1000)
        tl.store(scale_ptr + q, ((e + 1023) << 52).to(tl.float64, bitcast=True))
        tl.store(inv_ptr + q, ((1023 - e) << 52).to(tl.float64, bitcast=True))


def triton_query_scales(q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                        max_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``query_scales`` in one kernel launch (its ~25 small torch kernels dominate a one-query search's
    CUDA graph); same arguments, same bits (tests/search/test_kernels_search.py)."""
    n = check_query_csr(q_indptr, q_terms, q_weights, q_weights.device)
    check_tensor("max_scores", max_scores, dtype=torch.float32, ndim=1, device=q_weights.device, contiguous=True)
    scale = torch.empty(n, dtype=torch.float64, device=q_weights.device)
    inv = torch.empty_like(scale)
    if n:
        _query_scales_kernel[(n,)](q_indptr, q_terms, q_weights, max_scores, scale, inv, BLOCK=128, num_warps=4)
    return scale, inv


def torch_to_fixed(w_query: torch.Tensor, w_doc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``to_fixed``: int64 contributions (broadcasting)."""
    return (w_query.to(torch.float64) * w_doc.to(torch.float64) * scale).to(torch.int64)


def torch_from_fixed(acc: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``from_fixed``: float32 scores from int64 sums (broadcasting)."""
    return (acc.to(torch.float64) * inv_scale).to(torch.float32)


if triton is not None:

    @triton.jit
    def to_fixed(w_query, w_doc, scale):
        """int64 contribution of one posting: exact float64 product, scaled, truncated toward zero."""
        return (w_query.to(tl.float64) * w_doc.to(tl.float64) * scale).to(tl.int64)


    @triton.jit
    def from_fixed(acc, inv_scale):
        """float32 score of an int64 sum (``inv_scale`` = 2**-e, float64)."""
        return (acc.to(tl.float64) * inv_scale).to(tl.float32)
else:  # pragma: no cover - no triton: the tl helpers other kernel modules import exist, unusable
    to_fixed = from_fixed = None


def check_query_csr(q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                    device: torch.device) -> int:
    """Launcher check of a query CSR (int64 / int32 / float32, 1-D, contiguous, on ``device``); returns B."""
    for name, t, dt in (("q_indptr", q_indptr, torch.int64), ("q_terms", q_terms, torch.int32),
                        ("q_weights", q_weights, torch.float32)):
        check_tensor(name, t, dtype=dt, ndim=1, device=device, contiguous=True)
    return q_indptr.numel() - 1


def check_scales(scale: torch.Tensor, inv_scale: torch.Tensor, n_queries: int, device: torch.device) -> None:
    """Launcher check of the fixed-point scales from ``query_scales``: float64 [B] each, on ``device``."""
    for name, t in (("scale", scale), ("inv_scale", inv_scale)):
        check_tensor(name, t, dtype=torch.float64, shape=(n_queries,), device=device, contiguous=True)
