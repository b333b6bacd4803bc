"""The gpu backend: ``gpu_search(index, queries, k, config)``, exact top-k with the Triton / CUDA kernels.

Every score is the fixed-point sum of ``kernels.fixed``, so both routes give bit-identical results. The route and
everything else a batch runs is decided by ``lsr.search.plan`` (``plan_search``, printed by ``--explain``); this
module prepares the queries and executes the plan (``run_plan``):

* ``block`` (``lsr.search.block_path``): spans of docs scored without a dense [B, N] matrix; the route at scale.
* ``dense-scatter`` (``kernels.scatter`` with fixed-point atomics, then ``select.triton_topk``): a dense [B, N]
  score matrix in query chunks; the small-collection route.

Runs on CUDA, or on the CPU under TRITON_INTERPRET=1 (tests, tiny sizes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lsr.search.block_path import block_search
from lsr.search.block_plan import QueryCSR, Repairs
from lsr.search.config import SearchConfig
from lsr.search.index_cache import index_cache
from lsr.search.kernels.fixed import query_scales
from lsr.search.kernels.scatter import triton_scatter_scores
from lsr.search.plan import SearchPlan, plan_search
from lsr.search.select import triton_topk
from lsr.utils.kernels import INTERPRET
from lsr.utils.ragged import segment_ids

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.sparse import SparseVectors

__all__ = ["gpu_search", "query_csr", "run_plan"]

_DEFAULT = SearchConfig()


def gpu_search(index: InvertedIndex, queries: SparseVectors, k: int, config: SearchConfig | None = None, *,
               trace: list[Repairs] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of every query by inner product with the index's documents.

    Args:
        index: an InvertedIndex on CUDA (or on the CPU under TRITON_INTERPRET=1).
        queries: B query vectors (moved to the index's device if needed).
        k: results per query (>= 1).
        config: route, kernels and tuning (default ``SearchConfig()``; its backend is not read here).
        trace: a list that gets one ``block_plan.Repairs`` record per block-route chunk (what the fallbacks did).
    Returns:
        (scores float32 [B, k] descending, doc_idx int64 [B, k]); ties by ascending doc index;
        0.0 / -1 padding where fewer than k docs score > 0. Bit-identical across runs and routes.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    dev = index.device
    if dev.type != "cuda" and not INTERPRET:
        raise RuntimeError("the gpu search backend needs a CUDA index, or TRITON_INTERPRET=1 on the CPU "
                           "(use SearchConfig(backend='torch') otherwise)")
    B = len(queries)
    if B == 0 or index.n_docs == 0:
        return (torch.zeros((B, k), dtype=torch.float32, device=dev),
                torch.full((B, k), -1, dtype=torch.int64, device=dev))
    return run_plan(index, queries, plan_search(index, queries, k, config or _DEFAULT), trace)


def run_plan(index: InvertedIndex, queries: SparseVectors, plan: SearchPlan,
             trace: list[Repairs] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Execute ``plan`` (``plan_search``'s for these queries on ``index``): the block route, or the dense scatter in
    the plan's query chunks."""
    if plan.block is not None:
        return block_search(plan.block, query_csr(index, queries), trace)
    return _dense_search(index, query_csr(index, queries), plan.k, plan.chunk)


def query_csr(index: InvertedIndex, queries: SparseVectors) -> QueryCSR:
    """Query CSR on the index's device, restricted to the index vocabulary."""
    dev = index.device
    q = queries.to(dev) if queries.device != dev else queries
    indptr, terms, weights = q.indptr, q.indices, q.values
    if q.vocab_size > index.vocab_size:  # terms the index has never seen match nothing
        keep = terms < index.vocab_size
        if not bool(keep.all()):
            row = segment_ids(q.lengths)
            indptr = torch.zeros_like(indptr)
            torch.cumsum(torch.bincount(row[keep], minlength=len(q)), 0, out=indptr[1:])
            terms, weights = terms[keep], weights[keep]
    return QueryCSR(indptr.contiguous(), terms.contiguous(), weights.contiguous())


def _dense_search(index: InvertedIndex, queries: QueryCSR, k: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense-scatter route: dense scores for query chunks of ``step`` queries (the plan's: they fit
    ``dense_budget``), then the on-chip top-k."""
    indptr, terms, weights = queries
    B, N = indptr.numel() - 1, index.n_docs
    index_cache(index).ran.note("route", "dense-scatter")
    outs_s, outs_d = [], []
    for b0 in range(0, B, step):
        b1 = min(B, b0 + step)
        ip = indptr[b0:b1 + 1] - indptr[b0]
        t, w = terms[indptr[b0]:indptr[b1]], weights[indptr[b0]:indptr[b1]]
        scale, inv = query_scales(ip, t, w, index.max_scores)
        dense = triton_scatter_scores(index.doc_ids, index.scores, index.offsets, index.padded_lengths,
                                      ip, t, w, N, scale, inv)
        s, d = triton_topk(dense, k)
        outs_s.append(s)
        outs_d.append(d)
    return torch.cat(outs_s), torch.cat(outs_d)
