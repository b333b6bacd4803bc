"""The coarse route's per-query bounds and checks, each in one Triton kernel.

The block path's coarse route (``lsr.search.block_path._coarse_pass2``) turns a few numbers per query into
bounds and verdicts: the theta and floor of pass 2, then, from the selected coarse keys, whether the list is
complete and whether the query must take the exact pass. In torch these are ~60 element-wise kernels on [B]
vectors, each a node of the batch's CUDA graph with its GPU time and a share of the graph's launch
(docs/performance/search.md). Here they are three kernels:

* ``coarse_bounds``: theta and floor of the coarse pass 2 from pass 1's bucket edge (``coarse_theta`` then
  ``coarse_floor`` of ``lsr.search.kernels.coarse``, which are the torch twin).
* ``coarse_verdicts``: the queries for the exact pass 2 and those whose list must be rescored whole, and the
  flags ``lsr.search.fallbacks.settle`` reads (``torch_coarse_verdicts`` is the twin: the torch code this replaced).
* ``candidate_docs``: the docs the exact rescoring reads, the list's docs or, for a flagged query, all of
  its candidates (``torch_candidate_docs``).

The float64 arithmetic is the twin's, operation for operation (IEEE multiplies in the same order, round to
nearest on narrowing, truncation to int64), so the outputs are bit-identical; the tests compare them under
the interpreter, edge values included.
"""

from __future__ import annotations

import torch

from lsr.search.kernels.coarse import COARSE_KEY_SHIFT, COARSE_SHIFT, coarse_floor, coarse_theta
from lsr.search.kernels.topk import DOC_MASK, key_docs
from lsr.utils.kernels import tl, triton

__all__ = ["candidate_docs", "coarse_bounds", "coarse_verdicts", "torch_candidate_docs", "torch_coarse_bounds",
           "torch_coarse_verdicts"]

if triton is not None:

    _KEY_SHIFT = tl.constexpr(COARSE_KEY_SHIFT)
    _SHIFT = tl.constexpr(COARSE_SHIFT)
    _DOC_MASK = tl.constexpr(DOC_MASK)
    _ONE_MINUS_2_M50 = tl.constexpr(0x3FEFFFFFFFFFFFF8)   # the bits of float64 1 - 2**-50 (a float literal is float32)
_BLOCK = 128
_DOCS_BLOCK = 1024


if triton is not None:

    @triton.jit
    def _toward_zero(x):
        """nextafter(x, 0) of float32 x > 0 (the caller masks the rest)."""
        return (x.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)


    @triton.jit
    def _theta_of(lo, inv):
        """``coarse_theta``: the float32 score of int64 sum bits ``lo`` rounded down (lo >= 0, inv float64)."""
        t = ((lo >> _KEY_SHIFT) << _SHIFT).to(tl.float64) * inv
        t32 = t.to(tl.float32)
        return tl.where(t32.to(tl.float64) > t, _toward_zero(t32), t32)


    @triton.jit
    def _floor_of(theta, scale, n_terms):
        """``coarse_floor``: the least coarse sum of a doc whose float32 score reaches theta (> 0)."""
        below = tl.where(theta > 0, _toward_zero(theta), 0.0)
        factor = tl.full(theta.shape, _ONE_MINUS_2_M50, tl.int64).to(tl.float64, bitcast=True)
        lim = below.to(tl.float64) * scale * factor
        alo = tl.maximum(tl.minimum(lim, 4611686018427387904.0).to(tl.int64), 1)   # clamp(max=2**62), clamp_min(1)
        alo = tl.where(theta > 0, alo, 1)
        return (alo >> _SHIFT) - n_terms + 1


    @triton.jit
    def _bounds_kernel(edge_ptr, inv_ptr, scale_ptr, indptr_ptr, theta_ptr, floor_ptr, B, BLOCK: tl.constexpr):
        q = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = q < B
        theta = _theta_of(tl.load(edge_ptr + q, mask=m, other=0), tl.load(inv_ptr + q, mask=m, other=1.0))
        n_terms = tl.load(indptr_ptr + q + 1, mask=m, other=0) - tl.load(indptr_ptr + q, mask=m, other=0)
        tl.store(theta_ptr + q, theta, mask=m)
        tl.store(floor_ptr + q, _floor_of(theta, tl.load(scale_ptr + q, mask=m, other=1.0), n_terms), mask=m)


def coarse_bounds(edge: torch.Tensor, inv_scale: torch.Tensor, scale: torch.Tensor,
                  q_indptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta float32 [B], floor int64 [B]) = (``coarse_theta(edge, inv_scale)``, ``coarse_floor(theta, scale,
    q_indptr)``) in one launch (edge int64 [B] >= 0, scales finite float64 [B] as ``query_scales`` gives them, q_indptr
    int64 [B+1])."""
    B = edge.numel()
    theta = torch.empty(B, dtype=torch.float32, device=edge.device)
    floor = torch.empty(B, dtype=torch.int64, device=edge.device)
    if B:
        _bounds_kernel[(triton.cdiv(B, _BLOCK),)](edge.contiguous(), inv_scale.contiguous(), scale.contiguous(),
                                                  q_indptr.contiguous(), theta, floor, B, BLOCK=_BLOCK)
    return theta, floor


def torch_coarse_bounds(edge: torch.Tensor, inv_scale: torch.Tensor, scale: torch.Tensor,
                        q_indptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of ``coarse_bounds``."""
    theta = coarse_theta(edge, inv_scale)
    return theta, coarse_floor(theta, scale, q_indptr)


if triton is not None:

    @triton.jit
    def _verdicts_kernel(top_ptr, W, kcol, counts_ptr, n_spans, cap, floor_ptr, reselect_ptr, inv_ptr, scale_ptr,
                         indptr_ptr, redo_ptr, rescue_ptr, flags_ptr, full, short, SAMPLED: tl.constexpr,
                         RESCUE_FLAG: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        worst = tl.zeros([BLOCK], dtype=tl.int32)
        for s0 in range(0, n_spans, BLOCK):   # did any span's slots overflow?
            s = s0 + tl.arange(0, BLOCK)
            worst = tl.maximum(worst, tl.load(counts_ptr + b * n_spans + s, mask=s < n_spans, other=0))
        n_terms = tl.load(indptr_ptr + b + 1) - tl.load(indptr_ptr + b)
        # the k-th coarse key: k docs have coarse sums >= its sum, so every doc of the exact top k reaches lo_k
        s_lo = _theta_of(tl.maximum(tl.load(top_ptr + b * W + kcol), 0), tl.load(inv_ptr + b))
        lo_k = _floor_of(s_lo, tl.load(scale_ptr + b), n_terms)
        last = tl.load(top_ptr + b * W + W - 1)
        complete = (last < 0) | (full != 0) | ((last >> _KEY_SHIFT) < lo_k)
        floor = tl.load(floor_ptr + b)
        redo = (tl.max(worst, 0) > cap) | (floor < 1) | (tl.load(reselect_ptr + b).to(tl.int32) != 0)
        if SAMPLED:
            redo = redo | (floor > lo_k) | (short != 0)
        rescue = (complete.to(tl.int32) == 0) & (redo.to(tl.int32) == 0)
        tl.store(redo_ptr + b, redo)
        tl.store(rescue_ptr + b, rescue)
        tl.atomic_max(flags_ptr + 2, redo.to(tl.int32), sem="relaxed")
        if RESCUE_FLAG:
            tl.atomic_max(flags_ptr + 3, rescue.to(tl.int32), sem="relaxed")


def coarse_verdicts(top: torch.Tensor, k: int, n_cand: int, counts: torch.Tensor, cap: int, floor: torch.Tensor,
                    reselect: torch.Tensor, inv_scale: torch.Tensor, scale: torch.Tensor, q_indptr: torch.Tensor,
                    sampled: bool, rescue_flag: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The coarse pass 2's checks of every query (``lsr.search.block_path._coarse_pass2``).

    Args:
        top: int64 [B, W] the best W coarse keys (descending, -1 padding) of the n_cand candidates a query has.
        counts: int32 [B, n_spans] docs that reached the floor per span (> cap: its slots overflowed).
        floor: int64 [B] the pass's floor; reselect: bool [B] rows whose bucket selection overflowed.
        sampled: the floor came from a pass-1 key above the k-th (then it is checked against the list).
        rescue_flag: whether the flags report rescued queries (the rescue fallback rescores them).
    Returns:
        (redo bool [B]: the exact pass 2; rescue bool [B]: rescore all candidates; flags int32 [4]: the
        ``fallbacks.settle`` flags (0, 0, any redo, any rescue if rescue_flag)).
    """
    B, W = top.shape
    dev = top.device
    redo = torch.empty(B, dtype=torch.bool, device=dev)
    rescue = torch.empty(B, dtype=torch.bool, device=dev)
    flags = torch.zeros(4, dtype=torch.int32, device=dev)
    if B:
        _verdicts_kernel[(B,)](top.contiguous(), W, min(k, W) - 1, counts.contiguous(), counts.shape[1], cap,
                               floor.contiguous(), reselect.contiguous(), inv_scale.contiguous(), scale.contiguous(),
                               q_indptr.contiguous(), redo, rescue, flags, int(W == n_cand), int(W < k),
                               SAMPLED=sampled, RESCUE_FLAG=rescue_flag, BLOCK=_BLOCK, num_warps=1)
    return redo, rescue, flags


def torch_coarse_verdicts(top: torch.Tensor, k: int, n_cand: int, counts: torch.Tensor, cap: int,
                          floor: torch.Tensor, reselect: torch.Tensor, inv_scale: torch.Tensor, scale: torch.Tensor,
                          q_indptr: torch.Tensor, sampled: bool,
                          rescue_flag: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch twin of ``coarse_verdicts`` (same arguments and results)."""
    W = top.shape[1]
    s_lo = coarse_theta(top[:, min(k, W) - 1].clamp_min(0), inv_scale)
    lo_k = coarse_floor(s_lo, scale, q_indptr)
    last = top[:, -1]
    complete = (last < 0) | (W == n_cand) | ((last >> COARSE_KEY_SHIFT) < lo_k)
    redo = (counts > cap).any(1) | (floor < 1) | reselect
    if sampled:
        redo |= (floor > lo_k) | (W < k)
    rescue = ~complete & ~redo
    flags = torch.stack([torch.zeros((), dtype=torch.bool, device=top.device)] * 2
                        + [redo.any(), rescue.any() if rescue_flag else torch.zeros_like(redo.any())])
    return redo, rescue, flags.to(torch.int32)


if triton is not None:

    @triton.jit
    def _docs_kernel(top_ptr, W, cand_ptr, C, rescue_ptr, out_ptr, HAS_RESCUE: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        in_top = j < W
        key = tl.load(top_ptr + b * W + j, mask=in_top, other=-1)
        if HAS_RESCUE:   # a rescued query reads its candidates (columns W..), the others their list
            whole = (j * 0 + tl.load(rescue_ptr + b).to(tl.int32)) != 0   # as a block: masks must be blocks
            in_cand = (j >= W) & (j < W + C) & whole
            from_cand = tl.load(cand_ptr + b * C + (j - W), mask=in_cand, other=-1)
            key = tl.where(in_top, tl.where(whole, -1, key), from_cand)
        doc = tl.where(key >= 0, _DOC_MASK - (key & _DOC_MASK), -1)
        tl.store(out_ptr + b * (W + C) + j, doc, mask=j < W + C)


def candidate_docs(top: torch.Tensor, cand: torch.Tensor | None = None,
                   rescue: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [B, W (+ C)]: the docs of the keys ``top`` [B, W]; with ``cand`` [B, C] and ``rescue`` bool [B], a
    rescued query's row holds its candidates' docs instead (after W -1 entries), other rows -1 there (-1: no doc)."""
    B, W = top.shape
    C = 0 if cand is None else cand.shape[1]
    out = torch.empty((B, W + C), dtype=torch.int64, device=top.device)
    if B and W + C:
        has = cand is not None
        _docs_kernel[(B, triton.cdiv(W + C, _DOCS_BLOCK))](top.contiguous(), W, cand.contiguous() if has else top,
                                                          C, rescue.contiguous() if has else top, out,
                                                          HAS_RESCUE=has, BLOCK=_DOCS_BLOCK)
    return out


def torch_candidate_docs(top: torch.Tensor, cand: torch.Tensor | None = None,
                         rescue: torch.Tensor | None = None) -> torch.Tensor:
    """Torch twin of ``candidate_docs``."""
    docs = key_docs(top)
    if cand is None:
        return docs
    whole = rescue.unsqueeze(1)
    return torch.cat([docs.masked_fill(whole, -1), key_docs(cand, whole)], 1)
