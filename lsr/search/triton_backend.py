"""Exact top-k search with the Triton / CUDA kernels: ``triton_search(index, queries, k, path=...)``.

Paths (all exact and deterministic: every score is the fixed-point sum of ``kernels.fixed``, so the
three give bit-identical results):

* ``"block"`` (``lsr.search.block_path``): the path at scale; scores spans of docs without a dense
  [B, N] matrix, with the CUDA span scorer where it runs (CUDA graphs for small batches).
* ``"scatter"`` (``kernels.scatter``, fixed-point atomics) + ``kernels.topk``: dense [B, N] scores in
  query chunks; the small-collection path.
* ``"csr"`` (``kernels.csr``): doc-parallel, dense [B, N] in query chunks; for small collections and as
  an independent check (its cost grows with the doc lengths, not the postings touched).

``"auto"`` takes "block", except "scatter" for larger batches on small collections (N <= SMALL_N)
without the CUDA kernel. Runs on CUDA, or on the CPU under TRITON_INTERPRET=1 (tests, tiny sizes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lsr.index.compact import COMPACT
from lsr.search.block_path import block_search
from lsr.search.block_plan import BlockConfig, QueryCSR, default_config
from lsr.search.kernels.csr import dense_queries, triton_csr_scores
from lsr.search.kernels.fixed import query_scales
from lsr.search.kernels.scatter import triton_scatter_scores
from lsr.search.kernels.topk import triton_topk
from lsr.search.span_scorer import cuda_span
from lsr.search.spans import span_offsets
from lsr.utils.kernels import INTERPRET
from lsr.utils.ragged import segment_ids

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.sparse import SparseVectors

__all__ = ["PATHS", "SMALL_N", "BlockConfig", "choose_path", "default_config", "span_offsets", "terms_bound",
           "triton_search"]

PATHS = ("auto", "block", "scatter", "csr")
SMALL_N = 1 << 18              # auto: dense scatter path up to this many docs for large batches
DENSE_BUDGET = 1 << 30         # bytes of dense [B_chunk, N] buffers on the dense paths
SCATTER_MIN_B = 65             # auto, Triton kernel, small collections: batches from this size take the scatter path


def choose_path(n_docs: int, n_queries: int = SCATTER_MIN_B, cuda_kernel: bool = False) -> str:
    """The path "auto" takes: "block", except "scatter" for large batches on small collections when the
    block path would run on the Triton kernel (the CUDA kernel is as fast or faster there too)."""
    small = n_docs <= SMALL_N and n_queries >= SCATTER_MIN_B and not cuda_kernel
    return "scatter" if small else "block"


def triton_search(index: InvertedIndex, queries: SparseVectors, k: int, *, path: str = "auto",
                  config: BlockConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of every query by inner product with the index's documents.

    Args:
        index: an InvertedIndex on CUDA (or on the CPU under TRITON_INTERPRET=1).
        queries: B query vectors (moved to the index's device if needed).
        k: results per query (>= 1).
        path: "auto" | "block" | "scatter" | "csr" (see the module docstring).
        config: block-path tuning (default ``default_config(B)``).
    Returns:
        (scores float32 [B, k] descending, doc_idx int64 [B, k]); ties by ascending doc index;
        0.0 / -1 padding where fewer than k docs score > 0. Bit-identical across runs and paths.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    dev = index.device
    if dev.type != "cuda" and not INTERPRET:
        raise RuntimeError("triton_search needs a CUDA index, or TRITON_INTERPRET=1 on the CPU "
                           "(use the torch backend of lsr.Searcher otherwise)")
    B = len(queries)
    if B == 0 or index.n_docs == 0:
        return (torch.zeros((B, k), dtype=torch.float32, device=dev),
                torch.full((B, k), -1, dtype=torch.int64, device=dev))
    cfg = config or default_config(B)
    compact = index.postings == COMPACT
    # (only the auto and block paths ask: the check compiles the CUDA kernel at first use)
    cuda_kernel = path in ("auto", "block") and cfg.kernel in ("auto", "cuda") and cuda_span(cfg, index) is not None
    if path == "auto":
        path = choose_path(index.n_docs, B, cuda_kernel or compact)   # compact: no scatter kernel
    if path == "scatter" and compact:
        raise ValueError("the scatter path reads float32 postings; search a compact index with path 'block' or "
                         "'csr', or build it with postings='float32'")
    if path == "block":
        return block_search(index, _query_csr(index, queries), k, cfg, terms_bound(queries, cuda_kernel))
    return _dense_search(index, _query_csr(index, queries), k, path)


def terms_bound(queries: SparseVectors, cuda_kernel: bool) -> int:
    """The query length the block path is planned for (``block_search``'s ``max_terms``). The Triton kernel needs
    the longest query: free for one query, else one host sync. The CUDA kernel reads queries of any length; a
    CUDA graph's term buffer holds B x the bound's bucket, so the mean length rounded up is enough for the whole
    batch, and it needs no sync (a chunk of a split batch that holds more runs without a graph:
    ``block_path._search_chunk``). Out-of-vocabulary terms dropped later only shorten rows: either stays a bound."""
    B = len(queries)
    if B == 1:
        return queries.nnz
    if cuda_kernel:
        return -(-queries.nnz // B)
    return int(queries.indptr.diff().max())


def _query_csr(index: InvertedIndex, queries: SparseVectors) -> QueryCSR:
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


def _dense_search(index: InvertedIndex, queries: QueryCSR, k: int, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """scatter / csr paths: dense scores for query chunks that fit DENSE_BUDGET, then triton_topk."""
    indptr, terms, weights = queries
    B, N = indptr.numel() - 1, index.n_docs
    per_row = N * (12 if path == "scatter" else 4 + 4 * index.vocab_size / max(N, 1))
    step = max(1, int(DENSE_BUDGET // per_row))
    outs_s, outs_d = [], []
    for b0 in range(0, B, step):
        b1 = min(B, b0 + step)
        ip = indptr[b0:b1 + 1] - indptr[b0]
        t, w = terms[indptr[b0]:indptr[b1]], weights[indptr[b0]:indptr[b1]]
        scale, inv = query_scales(ip, t, w, index.max_scores)
        if path == "scatter":
            dense = triton_scatter_scores(index.doc_ids, index.scores, index.offsets, index.padded_lengths,
                                          ip, t, w, N, scale, inv)
        else:
            docs = index.docs
            dense = triton_csr_scores(docs.indptr, docs.indices, docs.values,
                                      dense_queries(ip, t, w, index.vocab_size), scale, inv)
        s, d = triton_topk(dense, k)
        outs_s.append(s)
        outs_d.append(d)
    return torch.cat(outs_s), torch.cat(outs_d)
