"""MaxSim backward from the saved argmax only — no recomputed similarities.

With a = argmax[q, c, i] (-1: the token contributed nothing) and doc = candidates[q, c] (or c):

    dQ[q, i]   = Σ_c g[q, c] · D[doc, a]                               (a gather; one program per query chunk)
    dD[n, j]   = Σ_{(q, c) : doc = n} g[q, c] · Σ_{i : a = j} Q[q, i]

dQ is written once per row by the program that owns it (deterministic in both modes). For dD:

* fast (default): one program per (q, c) pair adds g · Q[q, i] into an fp32 dD at row (doc, a) with
  atomics; the fp32 summation order varies run to run.
* ``deterministic=True``: one program per (document, token tile) walks the pairs that point at its document
  in a fixed order (a stable sort of the candidate list: CSR of pairs by document) and builds the tile as
  Σ_pairs g · onehot(a)ᵀ·Q[q] — a [BLOCK_L, BLOCK_Q] x [BLOCK_Q, BLOCK_D] tl.dot per pair, no atomics, each
  dD element written once; bit-identical run to run.
"""

from __future__ import annotations

import torch

from lsr.utils.kernels import INTERPRET, tl, triton

__all__ = ["triton_maxsim_bwd"]


if triton is not None:

    @triton.jit
    def _maxsim_dq_kernel(g_ptr, d_ptr, arg_ptr, cand_ptr, dq_ptr, C, LQ, DIM, s_dn, s_dl, s_cn,
                          ALL_PAIRS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
        qi = tl.program_id(0)
        offs_q = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
        offs_k = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        q_ok, k_ok = offs_q < LQ, offs_k < DIM
        acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        for c in range(0, C):
            pair = qi.to(tl.int64) * C + c
            if ALL_PAIRS:
                doc = c
            else:
                doc = tl.load(cand_ptr + qi.to(tl.int64) * s_cn + c).to(tl.int32)
            g = tl.load(g_ptr + pair)
            a = tl.load(arg_ptr + pair * LQ + offs_q, mask=q_ok, other=-1)
            rows = tl.load(d_ptr + tl.maximum(doc, 0).to(tl.int64) * s_dn + tl.maximum(a, 0)[:, None] * s_dl
                           + offs_k[None, :], mask=(a >= 0)[:, None] & k_ok[None, :], other=0.0)
            acc += g * rows.to(tl.float32)
        tl.store(dq_ptr + qi.to(tl.int64) * LQ * DIM + offs_q[:, None] * DIM + offs_k[None, :], acc,
                 mask=q_ok[:, None] & k_ok[None, :])

    @triton.jit
    def _maxsim_dd_atomic_kernel(g_ptr, q_ptr, arg_ptr, cand_ptr, dd_ptr, C, LQ, LD, DIM, s_qn, s_ql, s_cn,
                                 ALL_PAIRS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
        pair = tl.program_id(0).to(tl.int64)
        qi = pair // C
        c = pair % C
        offs_k = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        k_ok = offs_k < DIM
        if ALL_PAIRS:
            doc = c
        else:
            doc = tl.load(cand_ptr + qi * s_cn + c)
        g = tl.load(g_ptr + pair)
        for q0 in range(0, LQ, BLOCK_Q):
            offs_q = q0 + tl.arange(0, BLOCK_Q)
            a = tl.load(arg_ptr + pair * LQ + offs_q, mask=offs_q < LQ, other=-1)
            ok = (a >= 0)[:, None] & k_ok[None, :]
            rows = tl.load(q_ptr + qi * s_qn + offs_q[:, None] * s_ql + offs_k[None, :], mask=ok, other=0.0)
            dst = dd_ptr + (tl.maximum(doc, 0).to(tl.int64) * LD + tl.maximum(a, 0))[:, None] * DIM + offs_k[None, :]
            tl.atomic_add(dst, g * rows.to(tl.float32), mask=ok, sem="relaxed")

    @triton.jit
    def _maxsim_dd_det_kernel(g_ptr, q_ptr, arg_ptr, indptr_ptr, pairs_ptr, dd_ptr, NQ, C, LQ, LD, DIM, s_qn, s_ql,
                              ALL_PAIRS: tl.constexpr, DOT_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                              BLOCK_L: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
        n = tl.program_id(0)
        offs_l = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
        offs_k = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        k_ok = offs_k < DIM
        if ALL_PAIRS:
            start, end = 0, NQ
        else:
            start = tl.load(indptr_ptr + n).to(tl.int32)  # < Nq·C < 2**31 (launcher check)
            end = tl.load(indptr_ptr + n + 1).to(tl.int32)
        acc = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
        for e in range(start, end):  # the pairs of document n, in candidate-list order
            if ALL_PAIRS:
                pair = (n + e * C).to(tl.int64)  # < Nq·C < 2**31 (launcher check)
            else:
                pair = tl.load(pairs_ptr + e)
            qi = pair // C
            g = tl.load(g_ptr + pair)
            part = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
            for q0 in range(0, LQ, BLOCK_Q):
                offs_q = q0 + tl.arange(0, BLOCK_Q)
                a = tl.load(arg_ptr + pair * LQ + offs_q, mask=offs_q < LQ, other=-1)
                rows = tl.load(q_ptr + qi * s_qn + offs_q[:, None] * s_ql + offs_k[None, :],
                               mask=(a >= 0)[:, None] & k_ok[None, :], other=0.0)
                hit = offs_l[:, None] == a[None, :]
                if DOT_FP32:  # (the interpreter also mis-converts bool -> bf16)
                    onehot, rows = hit.to(tl.float32), rows.to(tl.float32)
                else:
                    onehot = hit.to(rows.dtype)  # 0/1: exact in any float dtype
                part = tl.dot(onehot, rows, part, input_precision=INPUT_PRECISION)
            acc += g * part
        out = dd_ptr + (n.to(tl.int64) * LD + offs_l)[:, None] * DIM + offs_k[None, :]
        tl.store(out, acc, mask=(offs_l < LD)[:, None] & k_ok[None, :])


def _pairs_by_document(candidates: torch.Tensor, nd: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR of the pairs (q·C + c) by document: indptr int64 [Nd + 1], pairs int64, each document's pairs in
    ascending pair order (a stable sort: the same order every run). Pairs with candidate -1 are dropped."""
    flat = candidates.reshape(-1).long()
    keep = torch.nonzero(flat >= 0).flatten()
    order = torch.sort(flat[keep], stable=True).indices
    pairs = keep[order]
    indptr = torch.zeros(nd + 1, dtype=torch.int64, device=flat.device)
    indptr[1:] = torch.cumsum(torch.bincount(flat[keep], minlength=nd), 0)
    return indptr, pairs


def triton_maxsim_bwd(grad: torch.Tensor, q: torch.Tensor, d: torch.Tensor, arg: torch.Tensor,
                      candidates: torch.Tensor | None, need_dq: bool = True, need_dd: bool = True,
                      deterministic: bool = False) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Backward launcher: grad [Nq, C] (any float dtype), Q / D as in the forward, argmax int32 [Nq, C, Lq]
    from it. Returns (dQ, dD) in Q's / D's dtype (None where not needed)."""
    nq, lq, dim = q.shape
    nd, ld, _ = d.shape
    n_cand = arg.shape[1]
    g = grad.to(torch.float32).contiguous()
    arg = arg.contiguous()
    cand = candidates.contiguous() if candidates is not None else g
    s_cn = candidates.stride(0) if candidates is not None else 0
    all_pairs = candidates is None
    bd = min(max(triton.next_power_of_2(dim), 16), 32 if INTERPRET else 64)
    bq = 16 if INTERPRET else min(max(triton.next_power_of_2(lq), 16), 32)
    dq = dd = None
    if need_dq:
        dq32 = torch.empty(nq, lq, dim, dtype=torch.float32, device=q.device)
        if dq32.numel():
            _maxsim_dq_kernel[(nq, triton.cdiv(lq, bq), triton.cdiv(dim, bd))](
                g, d, arg, cand, dq32, n_cand, lq, dim, d.stride(0), d.stride(1), s_cn,
                ALL_PAIRS=all_pairs, BLOCK_Q=bq, BLOCK_D=bd)
        dq = dq32.to(q.dtype)
    if need_dd:
        if deterministic:
            dd32 = torch.empty(nd, ld, dim, dtype=torch.float32, device=q.device)
            indptr, pairs = (g, g) if all_pairs else _pairs_by_document(candidates, nd)
            bl = 16 if INTERPRET else 64
            if dd32.numel():
                _maxsim_dd_det_kernel[(nd, triton.cdiv(ld, bl), triton.cdiv(dim, bd))](
                    g, q, arg, indptr, pairs, dd32, nq, n_cand, lq, ld, dim, q.stride(0), q.stride(1),
                    ALL_PAIRS=all_pairs, DOT_FP32=INTERPRET,
                    INPUT_PRECISION="ieee" if q.dtype == torch.float32 or INTERPRET else "tf32",
                    BLOCK_L=bl, BLOCK_Q=bq, BLOCK_D=bd)
        else:
            dd32 = torch.zeros(nd, ld, dim, dtype=torch.float32, device=q.device)
            if nq * n_cand and dim:
                _maxsim_dd_atomic_kernel[(nq * n_cand, triton.cdiv(dim, bd))](
                    g, q, arg, cand, dd32, n_cand, lq, ld, dim, q.stride(0), q.stride(1), s_cn,
                    ALL_PAIRS=all_pairs, BLOCK_Q=bq, BLOCK_D=bd)
        dd = dd32.to(d.dtype)
    return dq, dd
