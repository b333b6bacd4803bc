"""The coarse sums of the block path's batches: their unit, bounds and twin outputs.

A coarse sum adds floor(c / 2**COARSE_SHIFT) of each int64 fixed-point contribution c
(lsr.search.kernels.fixed), < 2**16 per doc. The CUDA kernel (cuda/block_scores.cu, COARSE) computes it
exactly in float32 and keeps two docs' sums in one uint32 word; ``coarse_floor`` and ``coarse_theta`` turn
exact bounds into coarse ones and back, and ``coarse_outputs`` / ``coarse_unusual`` are the torch twin's side
of the kernel's coarse modes (``lsr.search.kernels.block.torch_block_candidates``). docs/performance/search.md has
the exactness arguments.
"""

from __future__ import annotations

import math

import torch

from lsr.search.kernels.topk import DOC_MASK, torch_emit, torch_row_max
from lsr.utils.ragged import segment_ids

__all__ = ["COARSE_KEY_SHIFT", "COARSE_SHIFT", "coarse_floor", "coarse_outputs", "coarse_theta",
           "coarse_unusual", "sampled_rank"]

# < 2**(61 - 45) per doc: the CUDA kernel keeps two docs' sums in one uint32 word of shared memory (half the
# tile bytes of a uint32 cell per doc: twice the docs per work item), and computes a contribution's coarse part
# exactly in float32 (block_scores.cu)
COARSE_SHIFT = 45
# coarse keys are sum << COARSE_KEY_SHIFT | (2**31 - 1 - doc): the 16-bit sums lie in the key bits the bucket
# selection reads (lsr.search.kernels.bucket_select: 61..38) where 22-bit sums at bit 31 lay, so its buckets keep
# their relative width
COARSE_KEY_SHIFT = 31 + COARSE_SHIFT - 39


def coarse_floor(theta: torch.Tensor, scale: torch.Tensor, q_indptr: torch.Tensor) -> torch.Tensor:
    """int64 [B]: a doc whose float32 score reaches theta[q] (> 0) has a coarse sum >= this.

    The bound ``alo`` on the int64 sum is the CUDA read-out's (acc < alo implies score < theta); a coarse
    sum adds floor(c / 2**COARSE_SHIFT) of every contribution c, so it is > alo / 2**COARSE_SHIFT - n_q
    (n_q = the query's term count, the most adds a doc takes). Values < 1 mean the coarse sums cannot
    filter for theta.
    """
    lim = torch.nextafter(theta, torch.zeros_like(theta)).to(torch.float64) * scale * (1.0 - 2.0 ** -50)
    alo = lim.clamp(max=2.0 ** 62).to(torch.int64).clamp_min(1)
    alo = torch.where(theta > 0, alo, torch.ones_like(alo))
    return (alo >> COARSE_SHIFT) - q_indptr.diff() + 1


def coarse_outputs(sums: torch.Tensor, cols: torch.Tensor, unusual: torch.Tensor, coarse_lo: torch.Tensor | None,
                   item_q: torch.Tensor, starts: torch.Tensor, cap: int, out_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The twin's coarse outputs per item (sums int64 [I, span] of the item's docs ``cols``): every 32-doc
    row's best coarse key (``coarse_lo`` None; -1 rows for an ``unusual`` query), else the keys reaching
    coarse_lo[q] in cap slots and their counts (cap + 1 for an unusual query)."""
    keys = torch.where(sums > 0, (sums << COARSE_KEY_SHIFT) | (DOC_MASK - cols), -1)
    if coarse_lo is None:
        return torch_row_max(keys).masked_fill(unusual.unsqueeze(1), -1), None
    rows, cnt = torch_emit(keys, sums >= coarse_lo.clamp_min(1)[item_q.long()].unsqueeze(1), cap)
    counts = torch.zeros(out_size // cap, dtype=torch.int32, device=sums.device)
    counts[starts // cap] = torch.where(unusual, cap + 1, cnt)
    return rows, counts


def coarse_theta(lo: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """float32 [B]: a lower bound of the k-th score from pass 1 on coarse sums (``coarse_rows``): ``lo``
    (int64 [B], ``lsr.search.kernels.bucket_select.bucket_edge``) is at or below the k-th best row key, so k docs
    have coarse sums >= lo >> COARSE_KEY_SHIFT, hence int64 sums >= that << COARSE_SHIFT, whose score rounded
    down is the bound (0.0 where lo is 0: fewer than k keys)."""
    t = ((lo >> COARSE_KEY_SHIFT) << COARSE_SHIFT).to(torch.float64) * inv_scale
    t32 = t.to(torch.float32)
    return torch.where(t32.to(torch.float64) > t, torch.nextafter(t32, torch.zeros_like(t32)), t32)


def coarse_unusual(q_indptr: torch.Tensor, q_weights: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """bool [B]: queries with a coarse factor w_query * scale / 2**COARSE_SHIFT outside float32's normal
    range (the CUDA kernel's float32 coarse sums would not be exact: their items report an overflow)."""
    row = segment_ids(q_indptr.diff())
    a = q_weights.to(torch.float64) * scale[row] * 2.0 ** -COARSE_SHIFT
    bad = (a != 0) & ((a < 2.0 ** -126) | (a >= 2.0 ** 128))
    return torch.zeros(q_indptr.numel() - 1, dtype=torch.int64, device=a.device).index_add_(0, row, bad.long()) > 0


def sampled_rank(k: int, share: float, min_k: int) -> int:
    """Rank of the pass-1 key (among row maxima of a sample holding a share ``share`` of the docs) that sets the
    coarse pass 2's floor. The k-th key is a proven lower bound of the k-th score but lets ~k / share docs
    through; a random sample holds ~m = k * share of the top k docs, so the key of rank m + 4 sqrt(m) + 1 lies
    above the k-th score only when the sample holds 4 standard deviations more of them, and lets
    ~(m + 4 sqrt(m)) / share docs through. It is not proven: the block path checks, from the k-th coarse key,
    that no doc of the top k was left below the floor, and sends a query that fails to the exact pass 2.

    Below ``min_k`` (``SearchConfig.coarse.sampled_rank_min_k``) the k-th key sets the floor: such a query lets few docs
    through either way, and its ties at the k-th would fail the check more often."""
    if k < min_k:
        return k
    m = k * share
    return min(k, max(1, math.ceil(m + 4 * math.sqrt(m) + 1)))
