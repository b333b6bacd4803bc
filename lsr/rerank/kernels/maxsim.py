"""Fused MaxSim (late interaction):  s[q, c] = Σ_i qmask[q, i] · max_{j : dmask[doc, j]} Q[q, i] · D[doc, j]
with doc = candidates[q, c] (rerank) or doc = c (all pairs).

Public API: ``maxsim`` (differentiable, backend choice), ``torch_maxsim`` (torch twin, the one reference),
``triton_maxsim_fwd`` (forward launcher), ``MaxSimFunction`` (autograd). The backward kernels live in
``maxsim_bwd.py``.

Forward: one program per (query, candidate) pair. It loops over the query in BLOCK_Q chunks (the sum over
query tokens decomposes, so a long ColPali query costs registers for one chunk only), and for each chunk
over the document in BLOCK_L tiles: the [BLOCK_Q, BLOCK_L] similarity tile is a tl.dot with fp32
accumulation, masked document tokens are set to -inf, and a running max + argmax per query token stays on
chip. [Nq, C, Lq, Ld] is never stored; the outputs are the [Nq, C] fp32 scores and, for the backward, the
int32 argmax [Nq, C, Lq].

Conventions (shared with the twin): masked query tokens contribute 0; a query token whose document has no
unmasked token (an empty document, or candidate index -1) contributes 0 and gets argmax -1 (no gradient);
ties go to the first document position.
"""

from __future__ import annotations

import torch

from lsr.utils.kernels import INTERPRET, check_tensor, fold_row_max, grouped_program_ids, tl, triton, use_triton

__all__ = ["MaxSimFunction", "as_mask", "maxsim", "torch_maxsim", "triton_maxsim_fwd"]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def as_mask(name: str, m: torch.Tensor | None, n: int, length: int, device: torch.device) -> torch.Tensor:
    """A [n, length] bool mask from ``m``: None (all true), a bool/int mask [n, length] (nonzero = keep)
    or int lengths [n] (the first lengths[i] tokens are kept)."""
    if m is None:
        return torch.ones(n, length, dtype=torch.bool, device=device)
    if m.device != device:
        raise ValueError(f"{name} is on {m.device}, the embeddings on {device}: move it with .to()")
    if m.dim() == 1 and not m.is_floating_point() and m.dtype != torch.bool:
        check_tensor(name, m, shape=(n,))
        return torch.arange(length, device=device)[None, :] < m[:, None]
    check_tensor(name, m, shape=(n, length))
    return m if m.dtype == torch.bool else m != 0


def check_maxsim_args(q: torch.Tensor, d: torch.Tensor, q_mask: torch.Tensor | None, d_mask: torch.Tensor | None,
                      candidates: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate Q [Nq, Lq, dim], D [Nd, Ld, dim] (one float dtype, one device), candidates [Nq, C]
    (integer, in [-1, Nd)); return the bool masks [Nq, Lq] and [Nd, Ld]."""
    check_tensor("Q", q, ndim=3)
    check_tensor("D", d, ndim=3, dtype=q.dtype, device=q.device)
    if q.dtype not in DTYPES + (torch.float64,):
        raise ValueError(f"Q must be bfloat16, float16, float32 or float64, got {q.dtype}")
    if q.shape[2] != d.shape[2]:
        raise ValueError(f"Q and D must share the embedding dimension, got {q.shape[2]} and {d.shape[2]}")
    if candidates is not None:
        check_tensor("candidates", candidates, dtype=(torch.int32, torch.int64), shape=(q.shape[0], None),
                     device=q.device)
        if candidates.numel() and (int(candidates.min()) < -1 or int(candidates.max()) >= d.shape[0]):
            raise ValueError(f"candidates must be document indices in [0, {d.shape[0]}) or -1 (no candidate)")
    return (as_mask("q_mask", q_mask, q.shape[0], q.shape[1], q.device),
            as_mask("d_mask", d_mask, d.shape[0], d.shape[1], q.device))


def torch_maxsim(q: torch.Tensor, d: torch.Tensor, q_mask: torch.Tensor | None = None,
                 d_mask: torch.Tensor | None = None, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch twin: builds the [Nq, C, Lq, Ld] similarities (fp32; fp64 stays fp64).

    Differentiable (the gradient of each max goes to its first maximum, as in the kernels). Returns
    [Nq, C] scores, C = candidates.shape[1], or [Nq, Nd] for all pairs when ``candidates`` is None.
    """
    qm, dm = check_maxsim_args(q, d, q_mask, d_mask, candidates)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q32, d32 = q.to(cdt), d.to(cdt)
    if candidates is None:
        sim = torch.einsum("qid,njd->qnij", q32, d32)
        keep = dm[None, :, None, :].expand_as(sim)
    else:
        idx = candidates.long().clamp(min=0)
        sim = torch.einsum("qid,qcjd->qcij", q32, d32[idx])
        keep = (dm[idx] & (candidates >= 0)[..., None])[:, :, None, :].expand_as(sim)
    best = sim.masked_fill(~keep, float("-inf")).max(dim=3).values
    best = torch.where(torch.isinf(best) | ~qm[:, None, :], torch.zeros((), dtype=cdt, device=q.device), best)
    return best.sum(dim=2).to(torch.float64 if cdt == torch.float64 else torch.float32)


def lengths_of(mask: torch.Tensor) -> torch.Tensor:
    """int32 [n]: last kept position + 1 of each row (trailing padding is then never visited)."""
    if mask.shape[1] == 0:
        return torch.zeros(mask.shape[0], dtype=torch.int32, device=mask.device)
    pos = torch.arange(1, mask.shape[1] + 1, dtype=torch.int32, device=mask.device)
    return torch.where(mask, pos, 0).amax(dim=1).to(torch.int32)


if triton is not None:

    @triton.jit
    def _maxsim_fwd_kernel(q_ptr, d_ptr, qm_ptr, dm_ptr, qlen_ptr, dlen_ptr, cand_ptr, out_ptr, arg_ptr,
                           NQ, C, LQ, DIM, LD_KEY, s_qn, s_ql, s_dn, s_dl, s_qmn, s_dmn, s_cn,
                           ALL_PAIRS: tl.constexpr, STORE_ARGMAX: tl.constexpr, ONE_D: tl.constexpr,
                           DOT_FP32: tl.constexpr,
                           INPUT_PRECISION: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_L: tl.constexpr,
                           BLOCK_D: tl.constexpr, GROUP: tl.constexpr):
        # (LD_KEY, the bucketed document length, is only an autotuning key.)
        # GROUP queries sweep the candidates together: in the all-pairs case each D tile is then reused
        # by GROUP queries while in L2; in the rerank case each query's tokens stay in L1/L2.
        qi, c = grouped_program_ids(tl.program_id(0), NQ, C, GROUP)
        pair = qi.to(tl.int64) * C + c
        if ALL_PAIRS:
            doc = c
        else:
            doc = tl.load(cand_ptr + qi.to(tl.int64) * s_cn + c).to(tl.int32)
        n_d = tl.where(doc >= 0, tl.load(dlen_ptr + tl.maximum(doc, 0)), 0)
        doc = tl.maximum(doc, 0).to(tl.int64)
        n_q = tl.load(qlen_ptr + qi)
        q_base = q_ptr + qi.to(tl.int64) * s_qn
        d_base = d_ptr + doc * s_dn
        offs_k = tl.arange(0, BLOCK_D)
        total = tl.zeros([BLOCK_Q], tl.float32)
        for q0 in range(0, n_q, BLOCK_Q):  # query chunks: the sum over query tokens decomposes
            offs_q = q0 + tl.arange(0, BLOCK_Q)
            q_ok = offs_q < n_q
            run_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
            run_arg = tl.full([BLOCK_Q], -1, tl.int32)
            if ONE_D:  # the whole embedding in one tile: the query chunk stays in registers for every doc tile,
                # and the document loop is the innermost one, so num_stages pipelines its loads
                q_one = tl.load(q_base + offs_q[:, None] * s_ql + offs_k[None, :],
                                mask=q_ok[:, None] & (offs_k < DIM)[None, :], other=0.0)
                if DOT_FP32:  # the interpreter's bf16/fp16 tl.dot is wrong (triton 3.9); fp32 is exact
                    q_one = q_one.to(tl.float32)
            for l0 in range(0, n_d, BLOCK_L):
                offs_l = l0 + tl.arange(0, BLOCK_L)
                l_ok = offs_l < n_d
                if ONE_D:
                    dt = tl.load(d_base + offs_l[None, :] * s_dl + offs_k[:, None],
                                 mask=l_ok[None, :] & (offs_k < DIM)[:, None], other=0.0)
                    if DOT_FP32:
                        dt = dt.to(tl.float32)
                    acc = tl.dot(q_one, dt, input_precision=INPUT_PRECISION)
                else:
                    acc = tl.zeros([BLOCK_Q, BLOCK_L], tl.float32)
                    for k0 in range(0, DIM, BLOCK_D):
                        k_ok = k0 + offs_k < DIM
                        qt = tl.load(q_base + offs_q[:, None] * s_ql + (k0 + offs_k)[None, :],
                                     mask=q_ok[:, None] & k_ok[None, :], other=0.0)
                        dt = tl.load(d_base + offs_l[None, :] * s_dl + (k0 + offs_k)[:, None],
                                     mask=l_ok[None, :] & k_ok[:, None], other=0.0)
                        if DOT_FP32:
                            qt, dt = qt.to(tl.float32), dt.to(tl.float32)
                        acc = tl.dot(qt, dt, acc, input_precision=INPUT_PRECISION)
                keep = tl.load(dm_ptr + doc * s_dmn + offs_l, mask=l_ok, other=0) != 0
                run_max, run_arg = fold_row_max(acc, keep, run_max, run_arg, l0, STORE_ARGMAX)
            q_keep = tl.load(qm_ptr + qi.to(tl.int64) * s_qmn + offs_q, mask=q_ok, other=0) != 0
            found = q_keep & (run_max > float("-inf"))
            total += tl.where(found, run_max, 0.0)
            if STORE_ARGMAX:  # positions past n_q keep the launcher's -1
                tl.store(arg_ptr + pair * LQ + offs_q, tl.where(found, run_arg, -1), mask=q_ok)
        tl.store(out_ptr + pair, tl.sum(total, axis=0))

    # BLOCK_L and the pipeline depth are tuned per (Lq, dim, document length bucket); BLOCK_Q / BLOCK_D follow
    # from Lq and dim (_blocks). Configs that run out of shared memory are skipped by the autotuner.
    _FWD_TUNED = triton.autotune(
        [triton.Config({"BLOCK_L": bl}, num_warps=w, num_stages=st) for bl in (32, 64, 128) for w in (4, 8)
         for st in (2, 3, 4)],
        key=["LQ", "DIM", "LD_KEY", "ALL_PAIRS", "STORE_ARGMAX"])(_maxsim_fwd_kernel)


def _blocks(lq: int, dim: int) -> dict:
    """Tile sizes: tl.dot needs every side >= 16; BLOCK_D covers the whole embedding up to 128."""
    bq = min(max(triton.next_power_of_2(max(lq, 1)), 16), 64)
    bd = min(max(triton.next_power_of_2(dim), 16), 128)
    if INTERPRET:
        return {"BLOCK_Q": 16, "BLOCK_L": 16, "BLOCK_D": min(bd, 32), "GROUP": 2}
    return {"BLOCK_Q": bq, "BLOCK_L": 64 if bq <= 32 else 32, "BLOCK_D": bd, "GROUP": 8}


def triton_maxsim_fwd(q: torch.Tensor, d: torch.Tensor, q_mask: torch.Tensor, d_mask: torch.Tensor,
                      candidates: torch.Tensor | None, need_argmax: bool = False,
                      _blocks_override: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward launcher: Q [Nq, Lq, dim], D [Nd, Ld, dim] (one of bf16/fp16/fp32, rows contiguous),
    bool masks [Nq, Lq] / [Nd, Ld], candidates int [Nq, C] in [-1, Nd) or None (all pairs).

    Returns scores [Nq, C] float32 and, if ``need_argmax``, argmax int32 [Nq, C, Lq] (-1: no gradient).
    """
    if triton is None:
        raise RuntimeError("the Triton backend needs the `triton` package (pip install 'lsr-gpu[triton]')")
    nq, lq, dim = q.shape
    nd, ld, _ = d.shape
    check_tensor("Q", q, dtype=DTYPES, ndim=3)
    check_tensor("D", d, dtype=q.dtype, shape=(None, None, dim), device=q.device)
    check_tensor("q_mask", q_mask, dtype=torch.bool, shape=(nq, lq), device=q.device)
    check_tensor("d_mask", d_mask, dtype=torch.bool, shape=(nd, ld), device=q.device)
    if candidates is not None:
        check_tensor("candidates", candidates, dtype=(torch.int32, torch.int64), shape=(nq, None), device=q.device)
    n_cand = nd if candidates is None else candidates.shape[1]
    if nq * n_cand >= 2**31 or max(lq, ld) * dim >= 2**31:  # (row and pair offsets are int64 in the kernels)
        raise ValueError("Nq·C and L·dim must stay below 2**31: split the call into query batches")
    q, d = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, d))
    if candidates is not None:
        candidates = candidates.contiguous()
    dev = q.device
    scores = torch.empty(nq, n_cand, dtype=torch.float32, device=dev)
    arg = torch.full((nq, n_cand, lq), -1, dtype=torch.int32, device=dev) if need_argmax else None
    if nq == 0 or n_cand == 0:
        return scores, arg
    qm, dm = q_mask.contiguous().view(torch.uint8), d_mask.contiguous().view(torch.uint8)
    d_len = lengths_of(d_mask)
    ld_key = min(triton.next_power_of_2(max(int(d_len.max()) if nd else 1, 1)), 4096)
    args = (q, d, qm, dm, lengths_of(q_mask), d_len, candidates if candidates is not None else scores,
            scores, arg if need_argmax else scores, nq, n_cand, lq, dim, ld_key, q.stride(0), q.stride(1),
            d.stride(0), d.stride(1), qm.stride(0), dm.stride(0), candidates.stride(0) if candidates is not None else 0)
    flags = {"ALL_PAIRS": candidates is None, "STORE_ARGMAX": need_argmax, "DOT_FP32": INTERPRET,
             "INPUT_PRECISION": "ieee" if q.dtype == torch.float32 or INTERPRET else "tf32"}
    blocks = dict(_blocks_override or _blocks(lq, dim))
    flags["ONE_D"] = dim <= blocks["BLOCK_D"]
    if INTERPRET or _blocks_override is not None:
        launch = {} if INTERPRET else {"num_warps": 4, "num_stages": 3}
        _maxsim_fwd_kernel[(nq * n_cand,)](*args, **flags, **blocks, **launch)
    else:
        blocks.pop("BLOCK_L")
        _FWD_TUNED[(nq * n_cand,)](*args, **flags, **blocks)
    return scores, arg


class MaxSimFunction(torch.autograd.Function):
    """Triton forward; backward from the saved argmax only (see maxsim_bwd.py)."""

    @staticmethod
    def forward(ctx, q, d, q_mask, d_mask, candidates, deterministic):  # type: ignore[override]
        scores, arg = triton_maxsim_fwd(q, d, q_mask, d_mask, candidates, need_argmax=True)
        ctx.save_for_backward(q, d, arg, candidates)
        ctx.all_pairs, ctx.deterministic = candidates is None, deterministic
        return scores

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        from lsr.rerank.kernels.maxsim_bwd import triton_maxsim_bwd

        q, d, arg, candidates = ctx.saved_tensors
        dq, dd = triton_maxsim_bwd(grad, q, d, arg, None if ctx.all_pairs else candidates,
                                   need_dq=ctx.needs_input_grad[0], need_dd=ctx.needs_input_grad[1],
                                   deterministic=ctx.deterministic)
        return dq, dd, None, None, None, None


def maxsim(q: torch.Tensor, d: torch.Tensor, q_mask: torch.Tensor | None = None, d_mask: torch.Tensor | None = None,
           candidates: torch.Tensor | None = None, *, backend: str = "auto", deterministic: bool = False) -> torch.Tensor:
    """Late-interaction scores without building [Nq, C, Lq, Ld]; differentiable w.r.t. Q and D.

    Q [Nq, Lq, dim] and D [Nd, Ld, dim] (bf16/fp16/fp32, one dtype); masks: bool/int [N, L] or int
    lengths [N] (None: all tokens); candidates int [Nq, C] of document indices (-1: none) or None for
    all pairs. Returns float32 [Nq, C] (or [Nq, Nd]), accumulated in fp32. ``backend``: "auto" (Triton on
    CUDA, the twin elsewhere), "triton", "torch". ``deterministic=True`` makes the Triton backward
    bit-identical run to run (no atomics).
    """
    qm, dm = check_maxsim_args(q, d, q_mask, d_mask, candidates)
    if q.dtype == torch.float64 or not use_triton(backend, q.device):
        return torch_maxsim(q, d, qm, dm, candidates)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or d.requires_grad)
    if not needs_grad:
        return triton_maxsim_fwd(q, d, qm, dm, candidates)[0]
    return MaxSimFunction.apply(q, d, qm, dm, candidates, deterministic)
