"""Exact scores of candidate (query, doc) cells in CUDA C++: one warp per cell walks the doc's CSR row.

Same contract and outputs as ``lsr.search.kernels.csr.triton_csr_scores`` with a candidate list (its torch twin
is ``lsr.search.kernels.csr.torch_csr_scores``): the int64 fixed-point sum of lsr.search.kernels.fixed, so the
scores are bit-identical to every other scorer. Why a second kernel: the block path rescores ~k candidates
of every query, which the Triton kernel does slowly (a [4, 64] tile of cells gathers one posting per cell and
step; docs/performance/search.md); a warp per cell reads the doc's terms and weights as
coalesced runs, looks the query weights up in a dense [B, V] matrix (only for the doc terms a shared-memory
bitmap of the query's terms holds: most of a doc's terms are not the query's) and sums with shuffles.

Compiled at first use with NVRTC (``torch.cuda._compile_kernel``), like lsr.search.kernels.block_cuda; not
runnable under TRITON_INTERPRET (CPU CI tests the twin; the ``gpu`` tests compare bit for bit).
"""

from __future__ import annotations

import torch

from lsr.search.kernels import nvrtc_kernel

__all__ = ["MAX_VOCAB", "cuda_rescore"]

_WARPS = 8        # warps per CTA, a cell each at a time
_CTA_CELLS = 64   # cells per CTA (one query's): the CTA's bitmap of the query's terms serves them all; at most the
                  # source's MAX_CTA_CELLS (its shared table of the cells' rows)
MAX_GRID_Y = 65535   # queries a launch takes (its grid's y extent); more run as several launches
MAX_VOCAB = (48 * 1024 // 4 - 1 - 4 * _CTA_CELLS) * 32   # the bitmap and the cells' row bounds (16 B each) below the
                                                        # 48 KB of shared memory a launch gets without opting in


def _kernel(device_index: int):
    return nvrtc_kernel("rescore.cu", "lsr_rescore", device_index)


def cuda_rescore(doc_indptr: torch.Tensor, doc_terms: torch.Tensor, doc_weights: torch.Tensor,
                 qdense: torch.Tensor, scale: torch.Tensor, inv_scale: torch.Tensor,
                 doc_idx: torch.Tensor, q_indptr: torch.Tensor, q_terms: torch.Tensor, *,
                 max_grid_y: int = MAX_GRID_Y) -> torch.Tensor:
    """Scores of candidate (query, doc) cells (``triton_csr_scores`` with ``doc_idx``, on CUDA).

    Args:
        doc_indptr / doc_terms / doc_weights: int64 [N+1] / int32 [nnz] / float32 [nnz] doc CSR.
        qdense: float32 [B, V] dense queries (``lsr.search.kernels.csr.dense_queries``), rows contiguous.
        scale, inv_scale: float64 [B] fixed-point scales (``lsr.search.kernels.fixed.query_scales``).
        doc_idx: int32/int64 [B, C] docs to score per query (-1 = none).
        q_indptr / q_terms: int64 [B+1] / int32 query CSR whose rows hold (at least) every term of ``qdense``'s
            rows with a non-zero weight: the kernel skips doc terms outside them.
        max_grid_y: query rows per launch (the grid's y extent); more run as several launches.
    Returns:
        float32 [B, C]; 0 for -1 cells.
    """
    dev = qdense.device
    if dev.type != "cuda":
        raise RuntimeError("cuda_rescore needs CUDA tensors")
    if doc_indptr.dtype != torch.int64 or doc_terms.dtype != torch.int32 or doc_weights.dtype != torch.float32:
        raise ValueError("doc CSR must be int64 indptr, int32 terms, float32 weights")
    if qdense.dim() != 2 or qdense.dtype != torch.float32 or qdense.stride(1) != 1:
        raise ValueError("qdense must be float32 [B, V] with contiguous rows")
    if scale.shape != (qdense.shape[0],) or scale.dtype != torch.float64 or inv_scale.dtype != torch.float64:
        raise ValueError("scale and inv_scale must be float64 [B]")
    B, V = qdense.shape
    if V > MAX_VOCAB:
        raise ValueError(f"a vocabulary of {V} terms exceeds the rescoring bitmap ({MAX_VOCAB}); use triton_csr_scores")
    if q_indptr.shape != (B + 1,) or q_indptr.dtype != torch.int64 or q_terms.dtype != torch.int32:
        raise ValueError("q_indptr / q_terms must be the queries' int64 [B+1] / int32 CSR")
    if doc_idx.dim() != 2 or doc_idx.shape[0] != B or doc_idx.device != dev:
        raise ValueError("doc_idx must be [B, C] on the queries' device")
    C = doc_idx.shape[1]
    n_docs = doc_indptr.numel() - 1
    if B * C >= 1 << 31 or n_docs >= 1 << 31 or qdense.stride(0) >= 1 << 31:
        raise ValueError("too many cells for one launch (split the queries)")
    out = torch.empty((B, C), dtype=torch.float32, device=dev)
    if B and C:
        cand = doc_idx.to(torch.int64).contiguous()
        q_indptr, q_terms = q_indptr.contiguous(), q_terms.contiguous()
        with torch.cuda.device(dev):
            for b0 in range(0, B, max_grid_y):   # query rows b0.. in one launch; q_indptr's offsets stay absolute
                b1 = min(B, b0 + max_grid_y)
                _kernel(dev.index or 0)(grid=((C + _CTA_CELLS - 1) // _CTA_CELLS, b1 - b0, 1), block=(32 * _WARPS, 1, 1),
                          shared_mem=4 * ((V + 31) // 32),
                          args=[doc_indptr, doc_terms, doc_weights, qdense[b0:b1], qdense.stride(0), scale[b0:b1],
                                inv_scale[b0:b1], cand[b0:b1], C, n_docs, q_indptr[b0:b1 + 1], q_terms, V, _CTA_CELLS,
                                out[b0:b1]])
    return out
