"""Bucket selection over key rows: the k largest keys, and a lower bound of the k-th one, in a handful of
small kernels (the public entry point is ``lsr.search.select``).

Why: the block path's small batches select from rows of 17K-69K keys (pass 1's row maxima, pass 2's
candidate slots, most of them -1). ``torch.topk`` runs a multi-block radix select there (~25 launches,
each a graph node) and ``torch.kthvalue`` a single-block one, which took a large share of a one-query search
(docs/performance/search.md). Here:

1. ``level 1``: a histogram of every valid key's bits 61..50 (the float score's exponent and top 4
   mantissa bits; keys are ``bits(score) << 31 | ~doc``, lsr.search.kernels.topk), then the bucket ``p1``
   that holds the k-th largest key (the largest bucket whose keys at or above it number >= k).
2. ``level 2``: the same over bits 49..38 of the keys in bucket ``p1``: bucket ``p2``, which holds the
   k-th largest key. ``lo = p1 << 50 | p2 << 38`` is that bucket's lower edge, so the k largest keys are
   all >= ``lo``, and ``lo`` read as a score is a lower bound of the k-th score (at most 2**-15 relative
   below it): what pass 1 needs (``bucket_theta``).
3. ``gather`` (``bucket_topk``): every key >= ``lo`` goes to a row of ``slots`` slots (in an order the
   atomics choose), then either ``rank``: each gathered key's rank is the number of gathered keys above it (keys
   are unique), and the keys of rank < k are written in place: the answer, sorted, whatever the slot order; or a
   sort of the gathered slots (``row_topk_cuda``: one CTA a row, or its twin, torch.topk). Which one runs is the
   search plan's choice (``SearchConfig.selection``). A row with more than ``slots`` keys >= ``lo`` (thousands of
   docs tied within 2**-16 of the k-th score) is flagged: the caller selects it again with ``torch.topk``.

The histograms run as ``select_cuda``'s kernel on a GPU (shared-memory counts), as ``_hist_kernel`` elsewhere.

Counts are integers (exact in any order), so every output is deterministic. The keys of a row must be unique
(the block path's are: one doc per key), else the rank kernel gives equal keys one rank and leaves a -1.
``torch_bucket_levels`` is the torch twin of the two levels; the tests compare them bit for bit under the
interpreter.
"""

from __future__ import annotations

import torch

from lsr.search.kernels import row_topk_cuda, select_cuda
from lsr.utils.kernels import check_tensor, tl, triton

__all__ = ["BINS", "bucket_edge", "bucket_theta", "bucket_topk", "select_slots", "torch_bucket_levels"]

BINS = 4096                   # buckets per level (12 key bits)
SHIFT1 = 50                   # level 1: key bits 61..50 (keys of positive float32 scores are < 2**62)
SHIFT2 = 38                   # level 2: key bits 49..38
_BLOCK = 2048                 # keys per program of the histogram and gather kernels
_TILE = 128                   # keys per program of the ranking kernel


if triton is not None:

    @triton.jit
    def _hist_kernel(keys_ptr, C, hist_ptr, pick_ptr, LEVEL2: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        key = tl.load(keys_ptr + b * C + offs, mask=offs < C, other=-1)
        ok = key >= 0
        if LEVEL2:
            ok = ok & ((key >> 50) == tl.load(pick_ptr + b))
            digit = (key >> 38) & 4095
        else:
            digit = key >> 50
        digit = tl.where(ok, digit, 0)
        tl.atomic_add(hist_ptr + b * 4096 + digit, tl.full(digit.shape, 1, tl.int32), mask=ok, sem="relaxed")


    @triton.jit
    def _find_kernel(hist_ptr, k, pick_ptr, above_ptr, lo_ptr, total_ptr, theta_ptr, LEVEL2: tl.constexpr):
        """Level 1: pick_ptr[b] = p1, above_ptr[b] = keys in buckets > p1. Level 2: lo, total, theta."""
        b = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, 4096)
        h = tl.load(hist_ptr + b * 4096 + d)
        ge = tl.sum(h, 0) - tl.cumsum(h, 0) + h          # keys in buckets >= d
        above = tl.load(above_ptr + b) if LEVEL2 else 0
        pick = tl.max(tl.where(ge >= k - above, d, -1), 0)  # -1: fewer than k keys
        if LEVEL2:
            p1 = tl.load(pick_ptr + b)
            lo = tl.where(p1 >= 0, (p1 << 50) | (pick.to(tl.int64) << 38), 0)
            total = above + tl.sum(tl.where(d >= pick, h, 0), 0)
            bits = (lo >> 31).to(tl.int32)
            theta = tl.where(p1 >= 0, bits.to(tl.float32, bitcast=True), 0.0)
            tl.store(lo_ptr + b, lo)
            tl.store(total_ptr + b, total)
            tl.store(theta_ptr + b, theta)
        else:
            tl.store(pick_ptr + b, pick.to(tl.int64))
            tl.store(above_ptr + b, tl.sum(tl.where(d > pick, h, 0), 0))


    @triton.jit
    def _gather_kernel(keys_ptr, C, lo_ptr, out_ptr, count_ptr, KMAX, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        key = tl.load(keys_ptr + b * C + offs, mask=offs < C, other=-1)
        sel = (key >= 0) & (key >= tl.load(lo_ptr + b))
        flag = sel.to(tl.int32)
        base = tl.atomic_add(count_ptr + b, tl.sum(flag, 0), sem="relaxed")
        pos = base + tl.cumsum(flag, 0) - 1
        tl.store(out_ptr + b * KMAX + pos, key, mask=sel & (pos < KMAX))


    @triton.jit
    def _rank_kernel(buf_ptr, count_ptr, out_ptr, KMAX, k, TILE: tl.constexpr, CH: tl.constexpr):
        """out[b, r] = the gathered key of rank r (0 = largest) for r < k: each key's rank is the number of
        gathered keys above it (keys are unique), so no sort is needed for the few thousand gathered keys."""
        b = tl.program_id(0).to(tl.int64)
        start = tl.program_id(1) * TILE
        n = tl.minimum(tl.load(count_ptr + b), KMAX)
        if start < n:
            offs = start + tl.arange(0, TILE)
            mine = tl.load(buf_ptr + b * KMAX + offs, mask=offs < n, other=-1)
            rank = tl.zeros((TILE,), dtype=tl.int32)
            for c0 in range(0, n, CH):
                o = c0 + tl.arange(0, CH)
                other = tl.load(buf_ptr + b * KMAX + o, mask=o < n, other=-1)
                rank += tl.sum((other[None, :] > mine[:, None]).to(tl.int32), axis=1)
            tl.store(out_ptr + b * k + rank, mine, mask=(offs < n) & (rank < k))


def _levels(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lo int64 [B], total int32 [B], theta float32 [B]) of the two levels (module docstring)."""
    check_tensor("keys", keys, dtype=torch.int64, ndim=2, contiguous=True)
    B, C = keys.shape
    dev = keys.device
    hist = torch.zeros((2, B, BINS), dtype=torch.int32, device=dev)
    pick = torch.empty(B, dtype=torch.int64, device=dev)
    above = torch.empty(B, dtype=torch.int32, device=dev)
    lo = torch.empty(B, dtype=torch.int64, device=dev)
    total = torch.empty(B, dtype=torch.int32, device=dev)
    theta = torch.empty(B, dtype=torch.float32, device=dev)
    grid = (B, triton.cdiv(C, _BLOCK))
    cuda_hist = select_cuda.usable(keys)
    for level in (0, 1):
        if cuda_hist:
            select_cuda.cuda_bucket_hist(keys, hist[level], pick, level == 1)
        else:
            _hist_kernel[grid](keys, C, hist[level], pick, LEVEL2=level == 1, BLOCK=_BLOCK)
        _find_kernel[(B,)](hist[level], k, pick, above, lo, total, theta, LEVEL2=level == 1, num_warps=4)
    return lo, total, theta


def bucket_theta(keys: torch.Tensor, k: int) -> torch.Tensor:
    """float32 [B]: a lower bound of the score of every row's k-th largest key, at most 2**-15 relative below
    it for normal floats (0.0 when a row holds fewer than k valid keys, or its k-th score is a subnormal
    below 128 ulps). Keys: int64 [B, C], unique per row, -1 = none."""
    if keys.shape[1] < k:
        return torch.zeros(keys.shape[0], dtype=torch.float32, device=keys.device)
    return _levels(keys.contiguous(), k)[2]


def bucket_edge(keys: torch.Tensor, k: int) -> torch.Tensor:
    """int64 [B]: the lower edge of the bucket holding every row's k-th largest key (a key <= it; 0 when a
    row holds fewer than k valid keys). Keys: int64 [B, C], -1 = none."""
    if keys.shape[1] < k:
        return torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
    return _levels(keys.contiguous(), k)[0]


def select_slots(k: int, slots: int | None = None) -> int:
    """Slots per row of ``bucket_topk``: ``slots`` where given, else room for the k largest keys and the ties
    around the k-th."""
    return slots if slots is not None else triton.next_power_of_2(2 * k + 1024)


def bucket_topk(keys: torch.Tensor, k: int, *, slots: int, by_rank: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the k largest keys of every row, descending, -1 padding: int64 [B, k]; bool [B] rows whose keys near
    the k-th overflowed the slots, where the first result is wrong and ``torch.topk`` must redo it).

    ``slots``: gather slots per row (``select_slots``); ``by_rank``: the gathered keys are ranked by counting (~n^2
    compares of the n ~ k gathered keys; for few rows, where the rank kernel's programs beat one sort a row),
    else sorted (``row_topk``). Both are the search plan's choice (``lsr.search.block_planner``: the block route's
    ``Selection``); either gives the same keys."""
    keys = keys.contiguous()
    B, C = keys.shape
    lo, total, _ = _levels(keys, k)
    buf = torch.empty((B, slots), dtype=torch.int64, device=keys.device)   # both read only the gathered slots
    count = torch.zeros(B, dtype=torch.int32, device=keys.device)
    _gather_kernel[(B, triton.cdiv(C, _BLOCK))](keys, C, lo, buf, count, slots, BLOCK=_BLOCK)
    if not by_rank:   # the gathered keys are unique and the empty slots -1: the k largest are the answer
        return row_topk_cuda.row_topk(buf, k, count), total > slots
    top = torch.full((B, k), -1, dtype=torch.int64, device=keys.device)
    _rank_kernel[(B, triton.cdiv(slots, _TILE))](buf, count, top, slots, k, TILE=_TILE, CH=_TILE)
    return top, total > slots


def torch_bucket_levels(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch twin of the two levels: (lo, total, theta) as ``_levels`` returns them."""
    B = keys.shape[0]
    valid = keys >= 0

    def level(digit: torch.Tensor, ok: torch.Tensor, need: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hist = torch.zeros((B, BINS), dtype=torch.int64, device=keys.device)
        hist.scatter_add_(1, torch.where(ok, digit, 0), ok.to(torch.int64))
        ge = hist.flip(1).cumsum(1).flip(1)
        d = torch.arange(BINS, device=keys.device)
        pick = torch.where(ge >= need.unsqueeze(1), d, -1).amax(1)
        return pick, hist

    d = torch.arange(BINS, device=keys.device)
    p1, h1 = level(keys >> SHIFT1, valid, torch.full((B,), k, device=keys.device))
    above = (h1 * (d > p1.unsqueeze(1))).sum(1)
    p2, h2 = level((keys >> SHIFT2) & (BINS - 1), valid & ((keys >> SHIFT1) == p1.unsqueeze(1)), k - above)
    lo = torch.where(p1 >= 0, (p1 << SHIFT1) | (p2 << SHIFT2), 0)
    total = above + (h2 * (d >= p2.unsqueeze(1))).sum(1)
    theta = torch.where(p1 >= 0, (lo >> 31).to(torch.int32).view(torch.float32), 0.0)
    return lo, total.to(torch.int32), theta
