"""Exact top-k selection without sorting [B, N]: packed keys, on-chip candidate emission, exact merge.

A (score, doc) pair is packed into one int64 key, ``bits(score) << 31 | (2**31 - 1 - doc)``: for
scores > 0 the float bits order like the floats, so "larger key" means "higher score, then lower doc
index" -- exactly the contract's ranking with its tie rule, and keys are unique, so any exact top-k of
keys (torch.topk included) is deterministic. Scores <= 0 get the key -1 (never returned; padding).

Selection in two passes over score tiles that are already on chip (a kernel's accumulator, or a
chunk of a dense score matrix):

1. ``row maxima``: the best key of every run of ``ROW`` = 32 docs. They are scores of distinct docs, so
   the k-th largest row maximum ``theta`` is a lower bound of the true k-th score (a sample of rows
   gives a looser but still valid bound).
2. ``emission``: every doc with score >= theta goes to a fixed slot list of ``CAP`` per (query, chunk),
   in ascending doc order, with its count. A count above CAP flags an overflow, which the caller fixes
   by rescoring that (query, chunk) -- so the result is exact whatever the data.

The k largest keys of the candidates are ``row_topk``'s (``kernels.row_topk_cuda``). ``torch_topk`` /
``torch_select`` are the torch twins (the reference: keys of all N docs, one ``torch.topk``). The public entry
point of the selection family is ``lsr.search.select``.
"""

from __future__ import annotations

import torch

from lsr.search.kernels.row_topk_cuda import row_topk
from lsr.utils.kernels import check_tensor, tl, triton

__all__ = [
    "DOC_MASK",
    "ROW",
    "emit_tile",
    "key_docs",
    "key_scores",
    "kth_threshold",
    "pack_key",
    "pack_keys",
    "row_max_keys",
    "torch_emit",
    "torch_row_max",
    "torch_select",
    "torch_topk",
    "triton_pack_keys",
    "triton_select",
    "triton_topk",
    "triton_unpack_keys",
    "unpack_keys",
]

ROW = 32                      # docs per row maximum (one warp's worth)
DOC_MASK = (1 << 31) - 1      # doc ids are int32, so 31 bits hold them

if triton is not None:

    _DOC_MASK = tl.constexpr(DOC_MASK)
    _ROW = tl.constexpr(ROW)


# ----------------------------------------------------------------------------------- keys (torch)
def pack_keys(scores: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """int64 keys of float32 ``scores`` and integer ``docs`` (broadcasting); -1 where score <= 0."""
    bits = scores.contiguous().view(torch.int32).to(torch.int64)
    keys = (bits << 31) | (DOC_MASK - docs.to(torch.int64))
    return torch.where(scores > 0, keys, torch.full_like(keys, -1))


def unpack_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores float32, doc_idx int64) of keys; -1 keys give (0.0, -1)."""
    return key_scores(keys), key_docs(keys)


def key_scores(keys: torch.Tensor) -> torch.Tensor:
    """float32 scores of keys (``unpack_keys``'s first half); 0.0 for -1 keys."""
    bits = (keys >> 31).clamp(0, DOC_MASK).to(torch.int32)
    return torch.where(keys >= 0, bits.view(torch.float32), torch.zeros((), dtype=torch.float32, device=keys.device))


def key_docs(keys: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """int64 doc_idx of keys (``unpack_keys``'s second half); -1 for -1 keys and where ``keep`` is False."""
    valid = keys >= 0 if keep is None else (keys >= 0) & keep
    return torch.where(valid, DOC_MASK - (keys & DOC_MASK), -1)


def kth_threshold(keys: torch.Tensor, k: int) -> torch.Tensor:
    """float32 [B]: the score of the k-th largest key of every row (0.0 when a row has fewer than k)."""
    B, C = keys.shape
    if C < k:
        return torch.zeros(B, dtype=torch.float32, device=keys.device)
    if B <= 64 and C <= 1 << 15:   # pass 1's row maxima at small batches: a radix select is faster
        kth = torch.kthvalue(keys, C - k + 1, dim=1).values
    else:                          # the smallest of the k largest (keys are unique, so it is the k-th)
        kth = torch.topk(keys, k, dim=1, sorted=False).values.amin(1)
    return key_scores(kth)


def torch_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference exact top-k of a dense float32 [B, N] score matrix (ties: ascending doc)."""
    docs = torch.arange(scores.shape[1], device=scores.device)
    return unpack_keys(row_topk(pack_keys(scores, docs.unsqueeze(0)), k))


def torch_emit(keys: torch.Tensor, ok: torch.Tensor, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of ``emit_tile`` for whole rows: keys / ok [R, T] -> (slots int64 [R, cap] holding the
    selected keys in column order, -1 after them; counts int32 [R], which may exceed cap)."""
    counts = ok.sum(1, dtype=torch.int32)
    pos = torch.cumsum(ok.to(torch.int32), 1) - 1
    out = torch.full((keys.shape[0], cap), -1, dtype=torch.int64, device=keys.device)
    r, j = torch.nonzero(ok & (pos < cap), as_tuple=True)
    out[r, pos[r, j].long()] = keys[r, j]
    return out, counts


def torch_row_max(keys: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``row_max_keys``: [R, T] -> [R, T // 32]."""
    return keys.view(keys.shape[0], -1, ROW).amax(2)


def torch_select(scores: torch.Tensor, theta: torch.Tensor | None, chunk: int,
                 cap: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Torch twin of ``triton_select`` (same arguments and results)."""
    B, N = scores.shape
    n_chunks = max(1, -(-N // chunk))
    s = torch.nn.functional.pad(scores, (0, n_chunks * chunk - N))
    keys = pack_keys(s, torch.arange(n_chunks * chunk, device=scores.device).unsqueeze(0))
    if theta is None:
        return torch_row_max(keys), None
    ok = (keys >= 0) & (s >= theta.unsqueeze(1))
    out, counts = torch_emit(keys.view(B * n_chunks, chunk), ok.view(B * n_chunks, chunk), cap)
    return out.view(B, n_chunks, cap), counts.view(B, n_chunks)


# ----------------------------------------------------------------------------------- device helpers
if triton is not None:

    @triton.jit
    def pack_key(score, doc):
        """int64 key of float32 ``score`` and integer ``doc`` (-1 where score <= 0)."""
        bits = score.to(tl.int32, bitcast=True).to(tl.int64)
        key = (bits << 31) | (_DOC_MASK - doc.to(tl.int64))
        return tl.where(score > 0, key, -1)


    @triton.jit
    def emit_tile(keys, ok, out_ptr, base, CAP: tl.constexpr):
        """Append ``keys`` where ``ok`` (row-major order) to the slots ``out_ptr[base...]``.

        keys int64 / ok bool [A, 32] (a run of 32 * A consecutive docs: row-major = ascending doc);
        out_ptr: scalar pointer to slot 0; base: int32 scalar. Slots >= CAP are dropped (the returned
        count still includes them). Returns base + count.
        """
        okc = ok.to(tl.int32)
        per_row = tl.sum(okc, axis=1)
        total = tl.sum(per_row, axis=0)
        if total > 0:  # most tiles hold no candidate: skip the scans
            pos = base + (tl.cumsum(per_row, axis=0) - per_row)[:, None] + tl.cumsum(okc, axis=1) - 1
            tl.store(out_ptr + pos, keys, mask=ok & (pos < CAP))
        return base + total


    @triton.jit
    def row_max_keys(keys):
        """[A, 32] int64 keys -> [A]: the best key of every run of 32 docs."""
        return tl.max(keys, axis=1)


    @triton.jit
    def _pack_kernel(scores_ptr, docs_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        key = pack_key(tl.load(scores_ptr + i, mask=m, other=0.0), tl.load(docs_ptr + i, mask=m, other=-1))
        tl.store(out_ptr + i, key, mask=m)


    @triton.jit
    def _unpack_kernel(keys_ptr, scores_ptr, docs_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        key = tl.load(keys_ptr + i, mask=m, other=-1)
        bits = tl.minimum(tl.maximum(key >> 31, 0), _DOC_MASK).to(tl.int32)
        tl.store(scores_ptr + i, tl.where(key >= 0, bits.to(tl.float32, bitcast=True), 0.0), mask=m)
        tl.store(docs_ptr + i, tl.where(key >= 0, _DOC_MASK - (key & _DOC_MASK), -1), mask=m)
else:  # pragma: no cover - no triton: the tl helpers other kernel modules import exist, unusable
    pack_key = emit_tile = row_max_keys = None


_PACK_BLOCK = 1024


def triton_pack_keys(scores: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """``pack_keys`` in one launch, for float32 ``scores`` and int64 ``docs`` of one shape (a CUDA graph's
    node instead of ~6: lsr.search.kernels.coarse_checks says why that matters)."""
    check_tensor("docs", docs, dtype=torch.int64, shape=tuple(scores.shape), device=scores.device)
    check_tensor("scores", scores, dtype=torch.float32)
    out = torch.empty(scores.shape, dtype=torch.int64, device=scores.device)
    n = out.numel()
    if n:
        _pack_kernel[(triton.cdiv(n, _PACK_BLOCK),)](scores.contiguous(), docs.contiguous(), out, n, BLOCK=_PACK_BLOCK)
    return out


def triton_unpack_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``unpack_keys`` in one launch (int64 keys of any shape)."""
    check_tensor("keys", keys, dtype=torch.int64)
    scores = torch.empty(keys.shape, dtype=torch.float32, device=keys.device)
    docs = torch.empty(keys.shape, dtype=torch.int64, device=keys.device)
    n = keys.numel()
    if n:
        _unpack_kernel[(triton.cdiv(n, _PACK_BLOCK),)](keys.contiguous(), scores, docs, n, BLOCK=_PACK_BLOCK)
    return scores, docs


# ----------------------------------------------------------------------------------- dense selection
if triton is not None:

    @triton.jit
    def _select_kernel(scores_ptr, stride_s_b, theta_ptr, out_ptr, count_ptr, N, n_chunks,
                       CHUNK: tl.constexpr, CAP: tl.constexpr, ROWMAX: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        A: tl.constexpr = CHUNK // _ROW
        a = tl.arange(0, A)
        cols = chunk * CHUNK + a[:, None] * _ROW + tl.arange(0, _ROW)[None, :]
        s = tl.load(scores_ptr + row * stride_s_b + cols, mask=cols < N, other=0.0)
        keys = pack_key(s, cols)
        if ROWMAX:
            tl.store(out_ptr + row * (n_chunks * A) + chunk * A + a, row_max_keys(keys))
        else:
            theta = tl.load(theta_ptr + row)
            slot = row * n_chunks + chunk
            cnt = emit_tile(keys, (keys >= 0) & (s >= theta), out_ptr + slot * CAP, 0, CAP)
            tl.store(count_ptr + slot, cnt)


def triton_select(scores: torch.Tensor, theta: torch.Tensor | None, chunk: int = 1024,
                  cap: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Candidate emission over a dense score matrix.

    Args:
        scores: float32 [B, N], rows contiguous (stride 1 along N).
        theta: float32 [B] thresholds, or None for the row-maximum pass.
        chunk: docs per chunk (power of two >= 32); cap: slots per (row, chunk).
    Returns:
        theta None: (row-maximum keys int64 [B, ceil(N/chunk) * chunk/32], None).
        otherwise: (candidate keys int64 [B, n_chunks, cap] (-1 = empty), counts int32 [B, n_chunks]).
    """
    check_tensor("scores", scores, dtype=torch.float32, ndim=2, rows_contiguous=True)
    if chunk < ROW or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= {ROW}")
    B, N = scores.shape
    n_chunks = max(1, triton.cdiv(N, chunk))
    grid = (B, n_chunks)
    if theta is None:
        out = torch.empty((B, n_chunks * (chunk // ROW)), dtype=torch.int64, device=scores.device)
        if B:
            _select_kernel[grid](scores, scores.stride(0), scores, out, out, N, n_chunks,
                                 CHUNK=chunk, CAP=1, ROWMAX=True)
        return out, None
    check_tensor("theta", theta, dtype=torch.float32, shape=(B,), device=scores.device)
    out = torch.full((B, n_chunks, cap), -1, dtype=torch.int64, device=scores.device)
    counts = torch.empty((B, n_chunks), dtype=torch.int32, device=scores.device)
    if B:
        _select_kernel[grid](scores, scores.stride(0), theta.contiguous(), out, counts, N, n_chunks,
                             CHUNK=chunk, CAP=cap, ROWMAX=False)
    return out, counts


def triton_topk(scores: torch.Tensor, k: int, chunk: int = 1024, cap: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of a dense float32 [B, N] score matrix without sorting it.

    Row maxima give theta (the k-th best row maximum, a valid lower bound of the k-th score); every doc
    >= theta is emitted per chunk; rows where a chunk overflowed its ``cap`` slots are redone with
    ``torch_topk``. Returns (scores float32 [B, k], doc_idx int64 [B, k]).
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    maxima, _ = triton_select(scores, None, chunk)
    theta = kth_threshold(maxima, k)
    cand, counts = triton_select(scores, theta, chunk, cap)
    top_s, top_d = unpack_keys(row_topk(cand.view(scores.shape[0], -1), k))
    bad = torch.nonzero((counts > cap).any(1)).flatten()
    if bad.numel():
        fix_s, fix_d = torch_topk(scores[bad], k)
        top_s[bad], top_d[bad] = fix_s, fix_d
    return top_s, top_d
