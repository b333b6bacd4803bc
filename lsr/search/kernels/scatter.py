"""Term-parallel scatter-add scorer (the seed design): one program per (query term, posting slice).

Each program walks the padded posting list of one query term in chunks of ``CHUNK`` and adds
``w_query * w_doc`` into a dense [B, N] accumulator with global atomics. This is the baseline the
block kernel is measured against: at 8.8M docs its cost is random read-modify-writes into a
B * N buffer in HBM. It stays useful as the small-N path (the buffer is small and stays in L2).

Two accumulators (``fixed``):
* False -- float32 atomics, exactly the seed design; the order of the adds (and so the last bits)
  depends on scheduling: NOT deterministic on a GPU.
* True -- int64 fixed-point atomics (lsr.search.kernels.fixed): integer adds commute, so the result is
  bit-identical on every run and equal to every other lsr scoring kernel. This is the default.
"""

from __future__ import annotations

import torch

from lsr.search.kernels.fixed import (
    check_query_csr,
    check_scales,
    from_fixed,
    to_fixed,
    torch_from_fixed,
    torch_to_fixed,
)
from lsr.utils.kernels import check_tensor, tl, triton
from lsr.utils.ragged import ragged_positions, segment_ids

__all__ = ["torch_scatter_scores", "triton_scatter_scores"]


if triton is not None:

    @triton.jit
    def _scatter_kernel(post_doc_ptr, post_w_ptr, offsets_ptr, plen_ptr,
                        q_row_ptr, q_terms_ptr, q_w_ptr, scale_ptr,
                        acc_ptr, stride_acc_b, n_split,
                        CHUNK: tl.constexpr, FIXED: tl.constexpr):
        entry = tl.program_id(0)        # one non-zero of the query CSR = one (query, term)
        split = tl.program_id(1)        # long lists are cut into n_split interleaved slices
        row = tl.load(q_row_ptr + entry).to(tl.int64)
        term = tl.load(q_terms_ptr + entry).to(tl.int64)
        wq = tl.load(q_w_ptr + entry)
        start = tl.load(offsets_ptr + term)
        length = tl.load(plen_ptr + term)
        lane = tl.arange(0, CHUNK)
        out_row = acc_ptr + row * stride_acc_b
        if FIXED:
            scale = tl.load(scale_ptr + row)
        for c0 in range(split * CHUNK, length, n_split * CHUNK):
            m = c0 + lane < length
            doc = tl.load(post_doc_ptr + start + c0 + lane, mask=m, other=-1)
            w = tl.load(post_w_ptr + start + c0 + lane, mask=m, other=0.0)
            ok = doc >= 0                   # -1 = segment padding
            if FIXED:
                tl.atomic_add(out_row + doc, to_fixed(wq, w, scale), mask=ok, sem="relaxed")
            else:
                tl.atomic_add(out_row + doc, wq * w, mask=ok, sem="relaxed")


    @triton.jit
    def _fixed_to_float_kernel(acc_ptr, inv_ptr, out_ptr, N, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < N
        acc = tl.load(acc_ptr + row * N + cols, mask=m, other=0)
        tl.store(out_ptr + row * N + cols, from_fixed(acc, tl.load(inv_ptr + row)), mask=m)


def triton_scatter_scores(post_doc: torch.Tensor, post_w: torch.Tensor, offsets: torch.Tensor,
                          padded_lengths: torch.Tensor, q_indptr: torch.Tensor, q_terms: torch.Tensor,
                          q_weights: torch.Tensor, n_docs: int, scale: torch.Tensor | None = None,
                          inv_scale: torch.Tensor | None = None, *, chunk: int = 1024,
                          max_split: int = 64) -> torch.Tensor:
    """Dense scores [B, n_docs] float32 by term-parallel scatter-add.

    Args:
        post_doc: int32 [P] posting doc ids (-1 = padding); post_w: float32 [P] posting weights.
        offsets: int64 [V] start of every term's list; padded_lengths: int32 [V] its length.
        q_indptr / q_terms / q_weights: int64 [B+1] / int32 [nnz] / float32 [nnz] query CSR.
        scale, inv_scale: float64 [B] from ``query_scales`` -> deterministic fixed-point
            accumulation; both None -> float32 atomics (the seed design, not deterministic).
        chunk: postings per program step; max_split: programs per (query, term) at most.
    """
    dev = post_doc.device
    check_tensor("post_doc", post_doc, dtype=torch.int32, ndim=1, device=dev)
    check_tensor("post_w", post_w, dtype=torch.float32, shape=tuple(post_doc.shape), device=dev)
    check_tensor("offsets", offsets, dtype=torch.int64, ndim=1, device=dev)
    check_tensor("padded_lengths", padded_lengths, dtype=torch.int32, shape=tuple(offsets.shape), device=dev)
    B = check_query_csr(q_indptr, q_terms, q_weights, dev)
    fixed = scale is not None
    if fixed:
        check_scales(scale, inv_scale, B, dev)
    acc = torch.zeros((B, n_docs), dtype=torch.int64 if fixed else torch.float32, device=dev)
    nnz = q_terms.numel()
    if nnz and n_docs:
        rows = segment_ids(q_indptr.diff(), nnz, dtype=torch.int32)
        longest = int(padded_lengths[q_terms.long()].max())
        n_split = max(1, min(max_split, triton.cdiv(longest, chunk)))
        _scatter_kernel[(nnz, n_split)](post_doc, post_w, offsets, padded_lengths, rows, q_terms, q_weights,
                                        scale if fixed else q_weights, acc, acc.stride(0), n_split,
                                        CHUNK=chunk, FIXED=fixed)
    if not fixed:
        return acc
    out = torch.empty((B, n_docs), dtype=torch.float32, device=dev)
    if B and n_docs:
        _fixed_to_float_kernel[(B, triton.cdiv(n_docs, 1024))](acc, inv_scale, out, n_docs, BLOCK=1024)
    return out


def torch_scatter_scores(post_doc: torch.Tensor, post_w: torch.Tensor, offsets: torch.Tensor,
                         padded_lengths: torch.Tensor, q_indptr: torch.Tensor, q_terms: torch.Tensor,
                         q_weights: torch.Tensor, n_docs: int, scale: torch.Tensor | None = None,
                         inv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Torch twin of ``triton_scatter_scores`` (same arguments; one vectorised index_add_).

    With scales the result is bit-identical to the kernel's; without, it is float32 index_add_.
    """
    dev = post_doc.device
    B = q_indptr.numel() - 1
    t = q_terms.long()
    lens = padded_lengths[t].long()
    entry, pos = ragged_positions(offsets[t], lens)
    doc = post_doc[pos].long()
    keep = doc >= 0
    entry, doc, w = entry[keep], doc[keep], post_w[pos][keep]
    row = segment_ids(q_indptr.diff())[entry]
    flat = row * n_docs + doc
    if scale is None:
        out = torch.zeros(B * n_docs, dtype=torch.float32, device=dev)
        return out.index_add_(0, flat, q_weights[entry] * w).view(B, n_docs)
    acc = torch.zeros(B * n_docs, dtype=torch.int64, device=dev)
    acc.index_add_(0, flat, torch_to_fixed(q_weights[entry], w, scale[row]))
    return torch_from_fixed(acc.view(B, n_docs), inv_scale.unsqueeze(1))
