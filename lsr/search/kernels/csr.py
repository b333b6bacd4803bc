"""Doc-parallel CSR scorer: every program owns output cells (queries x docs) and computes them whole.

A cell (q, d) walks document d's CSR row (its terms ascending) and looks each term up in a dense
[B, V] query matrix (0 = the query lacks the term). No atomics and no shared output: every cell is one
program's private sum, accumulated in fixed point (lsr.search.kernels.fixed), so the result is deterministic
and bit-identical to the other scorers.

Work is sum over cells of the doc length (~127 lookups per cell for SPLADE) whether or not the query
shares the terms, so this path pays off for re-scoring short candidate lists (``doc_idx`` given) or
small collections, not for exhaustive search at scale, where term-at-a-time touches ~2% of that.

The cells are either all docs (``doc_idx=None``: an all-docs grid with a stride-0 doc table) or a
per-query candidate list ``doc_idx`` [B, C] (-1 = empty cell, scored 0).
"""

from __future__ import annotations

import torch

from lsr.search.kernels.fixed import check_scales, from_fixed, to_fixed, torch_from_fixed, torch_to_fixed
from lsr.utils.kernels import check_tensor, tl, triton
from lsr.utils.ragged import ragged_positions

__all__ = ["dense_queries", "torch_csr_scores", "triton_csr_scores"]


def dense_queries(q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                  vocab_size: int) -> torch.Tensor:
    """float32 [B, V] dense query matrix of a query CSR, without a host sync (CUDA-graph safe): entries
    past ``q_indptr[-1]`` (a graph's fixed buffer) land in a spare row that is cut off."""
    B = q_indptr.numel() - 1
    rows = torch.searchsorted(q_indptr[1:], torch.arange(q_terms.numel(), device=q_terms.device), right=True)
    out = torch.zeros((B + 1, vocab_size), dtype=torch.float32, device=q_terms.device)
    out[rows, q_terms.long()] = q_weights
    return out[:B]


if triton is not None:

    @triton.jit
    def _csr_kernel(doc_indptr_ptr, doc_terms_ptr, doc_w_ptr, qd_ptr, stride_qd_b, scale_ptr, inv_ptr,
                    cand_ptr, stride_cand_b, stride_cand_c, out_ptr, stride_out_b, B, C, n_docs,
                    BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        cell = (rows < B)[:, None] & (cols < C)[None, :]
        rows64 = rows.to(tl.int64)
        doc = tl.load(cand_ptr + rows64[:, None] * stride_cand_b + cols[None, :].to(tl.int64) * stride_cand_c,
                      mask=cell, other=-1).to(tl.int64)
        valid = cell & (doc >= 0) & (doc < n_docs)
        start = tl.load(doc_indptr_ptr + doc, mask=valid, other=0)
        length = tl.load(doc_indptr_ptr + doc + 1, mask=valid, other=0) - start
        scale = tl.load(scale_ptr + rows, mask=rows < B, other=1.0)
        acc = tl.zeros([BLOCK_Q, BLOCK_C], dtype=tl.int64)
        for r in range(tl.max(tl.max(length, axis=1), axis=0)):
            m = r < length
            term = tl.load(doc_terms_ptr + start + r, mask=m, other=0)
            w = tl.load(doc_w_ptr + start + r, mask=m, other=0.0)
            wq = tl.load(qd_ptr + rows64[:, None] * stride_qd_b + term, mask=m, other=0.0)
            acc += to_fixed(wq, w, scale[:, None])  # wq = 0 for terms the query lacks: adds 0
        inv = tl.load(inv_ptr + rows, mask=rows < B, other=1.0)
        score = tl.where(valid, from_fixed(acc, inv[:, None]), 0.0)
        tl.store(out_ptr + rows64[:, None] * stride_out_b + cols[None, :], score, mask=cell)


def triton_csr_scores(doc_indptr: torch.Tensor, doc_terms: torch.Tensor, doc_weights: torch.Tensor,
                      qdense: torch.Tensor, scale: torch.Tensor, inv_scale: torch.Tensor,
                      doc_idx: torch.Tensor | None = None, *, block_q: int = 4,
                      block_c: int = 64) -> torch.Tensor:
    """Scores of (query, doc) cells by walking the docs' CSR rows.

    Args:
        doc_indptr / doc_terms / doc_weights: int64 [N+1] / int32 [nnz] / float32 [nnz] doc CSR.
        qdense: float32 [B, V] dense queries (``dense_queries``), rows contiguous.
        scale, inv_scale: float64 [B] fixed-point scales (``lsr.search.kernels.fixed.query_scales``).
        doc_idx: int32/int64 [B, C] docs to score per query (-1 = none), or None for all N docs.
    Returns:
        float32 [B, C] (or [B, N]); 0 for -1 cells.
    """
    dev = qdense.device
    check_tensor("qdense", qdense, dtype=torch.float32, ndim=2, rows_contiguous=True)
    for name, t, dt in (("doc_indptr", doc_indptr, torch.int64), ("doc_terms", doc_terms, torch.int32),
                        ("doc_weights", doc_weights, torch.float32)):
        check_tensor(name, t, dtype=dt, ndim=1, device=dev)
    B = qdense.shape[0]
    check_scales(scale, inv_scale, B, dev)
    n_docs = doc_indptr.numel() - 1
    if doc_idx is None:
        # all docs for every query: a [B, N] view of one arange (stride 0 along B)
        doc_idx = torch.arange(n_docs, device=dev).unsqueeze(0).expand(B, n_docs)
    check_tensor("doc_idx", doc_idx, dtype=(torch.int32, torch.int64), shape=(B, None), device=dev)
    C = doc_idx.shape[1]
    out = torch.empty((B, C), dtype=torch.float32, device=dev)
    if B and C:
        grid = (triton.cdiv(B, block_q), triton.cdiv(C, block_c))
        _csr_kernel[grid](doc_indptr, doc_terms, doc_weights, qdense, qdense.stride(0), scale, inv_scale,
                          doc_idx, doc_idx.stride(0), doc_idx.stride(1), out, out.stride(0), B, C, n_docs,
                          BLOCK_Q=block_q, BLOCK_C=block_c)
    return out


def torch_csr_scores(doc_indptr: torch.Tensor, doc_terms: torch.Tensor, doc_weights: torch.Tensor,
                     qdense: torch.Tensor, scale: torch.Tensor, inv_scale: torch.Tensor,
                     doc_idx: torch.Tensor | None = None) -> torch.Tensor:
    """Torch twin of ``triton_csr_scores`` (same arguments; bit-identical result)."""
    dev = qdense.device
    B = qdense.shape[0]
    n_docs = doc_indptr.numel() - 1
    if doc_idx is None:
        doc_idx = torch.arange(n_docs, device=dev).unsqueeze(0).expand(B, n_docs)
    doc = doc_idx.long()
    valid = (doc >= 0) & (doc < n_docs)
    d = torch.where(valid, doc, 0)
    lens = torch.where(valid, doc_indptr[d + 1] - doc_indptr[d], 0)
    row = torch.arange(B, device=dev).unsqueeze(1).expand_as(d)
    cell, pos = ragged_positions(doc_indptr[d.flatten()], lens.flatten())
    r = row.flatten()[cell]
    contrib = torch_to_fixed(qdense[r, doc_terms[pos].long()], doc_weights[pos], scale[r])
    acc = torch.zeros(d.numel(), dtype=torch.int64, device=dev).index_add_(0, cell, contrib)
    out = torch_from_fixed(acc.view(B, -1), inv_scale.unsqueeze(1))
    return torch.where(valid, out, torch.zeros((), device=dev))
