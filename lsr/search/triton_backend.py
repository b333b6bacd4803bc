"""Exact top-k search with the Triton kernels: ``triton_search(index, queries, k, path=...)``.

Paths (all exact and deterministic: every score is the fixed-point sum of lsr.search.kernels.fixed, so the
three give bit-identical results):

* ``"block"``: the path at scale. Pass 1 scores a sample of doc spans and keeps the best doc of
  every 32 (row maxima); the k-th best of those is a valid lower bound ``theta`` of each query's k-th
  score. Pass 2 scores every span and emits the docs >= theta (a few per span) to fixed slots; a
  (query, span) whose slots overflowed is rescored with all its docs >= theta. The exact top-k of the
  candidates is the answer. Memory: candidates B * n_spans * cap * 8 bytes, never [B, N]; spans finer
  than the index blocks add a cached table of run starts (``span_offsets``). The scorer is the CUDA
  kernel lsr.search.kernels.block_cuda (shared-memory accumulation, NVRTC-compiled) where it can run, else the
  Triton kernel lsr.search.kernels.block (L2 atomics: 2.2K QPS at 8.8M docs on an H200); ``BlockConfig.kernel``
  forces one. Both give the same bits. With the CUDA kernel, pass 2 sums coarse uint32 fixed point
  (one shared atomic per posting) and the best k + margin docs are rescored exactly
  (lsr.search.kernels.rescore_cuda); queries its checks cannot settle take the exact pass 2 (``_chunk_body``).
  H200, 8.8M docs, B=500, k=1000: 22.6K QPS (exact pass 2: 14.6K).
* ``"scatter"`` (lsr.search.kernels.scatter, fixed-point atomics) + lsr.search.kernels.topk: dense [B, N] scores
  in query chunks; the small-collection path.
* ``"csr"`` (lsr.search.kernels.csr): doc-parallel, dense [B, N] in query chunks; for small collections and
  as an independent check (its cost grows with the doc lengths, not the postings touched).

``"auto"`` takes "block" (whose batches of up to GRAPH_MAX_B queries replay a captured CUDA graph),
except "scatter" for larger batches on small collections (N <= SMALL_N) without the CUDA kernel.
Runs on CUDA, or on the CPU under TRITON_INTERPRET=1 (tests, tiny sizes).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from lsr.search.kernels import block_cuda, rescore_cuda
from lsr.search.kernels.block import coarse_floor, default_programs, span_items, terms_bucket, triton_block_candidates
from lsr.search.kernels.csr import dense_queries, triton_csr_scores
from lsr.search.kernels.fixed import query_scales
from lsr.search.kernels.scatter import triton_scatter_scores
from lsr.search.kernels.topk import ROW, kth_threshold, pack_keys, topk_keys, triton_topk, unpack_keys

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.sparse import SparseVectors

__all__ = ["PATHS", "SMALL_N", "BlockConfig", "choose_path", "default_config", "span_offsets", "triton_search"]

PATHS = ("auto", "block", "scatter", "csr")
SMALL_N = 1 << 18              # auto: dense scatter path up to this many docs for large batches (H200)
DENSE_BUDGET = 1 << 30         # bytes of dense [B_chunk, N] buffers on the dense paths
CAND_BUDGET = 1 << 30          # bytes of candidate slots per block-path query chunk
GRAPH_MAX_B = 64               # block path: batches up to this size replay a captured CUDA graph
GRAPH_CACHE = 16               # graphs kept per index (one per batch size x query-length bucket x k)


@dataclass(frozen=True)
class BlockConfig:
    """Tuning of the block path (defaults: measured on an H200, docs/benchmarks-search.md)."""

    span: int = 2048          # Triton kernel: docs per work item (power of two dividing or multiple of the index block)
    group: int = 1            # queries per work item
    rows: int = 8             # chunks per step: the step's posting tile is [rows, chunk]
    chunk: int = 32           # postings per chunk
    readout: int = 1024       # cells per read-out tile
    per_sm: int = 8           # resident programs per SM (persistent grid)
    num_warps: int = 4
    sample_every: int = 16    # pass 1 scores about 1/sample_every of the spans (at least enough rows)
    kernel: str = "auto"      # "cuda" (shared-memory tiles, lsr.search.kernels.block_cuda) | "triton" | "auto"
    cuda_span: int = block_cuda.SPAN    # CUDA kernel: docs per work item (one shared-memory tile per CTA)
    cuda_warps: int = block_cuda.WARPS  # CUDA kernel: warps per CTA
    cuda_step: int = block_cuda.STEP    # CUDA kernel: 128-posting steps whose loads are issued together
    graphs: bool = True       # CUDA: replay a captured graph for batches <= GRAPH_MAX_B (no per-kernel host cost)
    coarse: bool = True       # CUDA: pass 2 on coarse uint32 sums, then the exact rescoring of the best k + margin
    coarse_span: int = 16384  # CUDA coarse pass: docs per work item (4 bytes of shared memory each)
    coarse_min_batch: int = 12  # smaller batches take the exact pass 2: there the coarse rescoring's selection
                                # costs more than the coarse sums save (H200: exact faster at B <= 8, coarse
                                # at B >= 16; docs/benchmarks-search.md)


_SPAN_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def default_config(n_queries: int) -> BlockConfig:
    """Block-path tuning by batch size (H200 sweep, docs/notes-search.md): wide [32, 32] steps with 8
    warps for batches, more and smaller programs for a few queries (more items in flight)."""
    if n_queries >= 16:
        return BlockConfig(rows=32, num_warps=8, per_sm=2)
    return BlockConfig()


def choose_path(n_docs: int, n_queries: int = GRAPH_MAX_B + 1, cuda_kernel: bool = False) -> str:
    """The path "auto" takes: "block", except "scatter" for large batches on small collections when the
    block path would run on the Triton kernel (the CUDA kernel is as fast or faster there too)."""
    small = n_docs <= SMALL_N and n_queries > GRAPH_MAX_B and not cuda_kernel
    return "scatter" if small else "block"


def span_offsets(index: InvertedIndex, span: int) -> torch.Tensor:
    """int64 [V, ceil(N / span) + 1]: where term t's postings for docs [j * span, (j + 1) * span) start.

    ``span`` a multiple of the index's block size reuses ``block_offsets`` columns; a divisor needs a
    binary search inside every (term, block) segment (docs ascending, then -1 padding). The result is
    cached per index (it is V * n_spans * 8 bytes: build the index with block_size = span to avoid it).
    """
    bs = index.block_size
    cached = _SPAN_CACHE.setdefault(index, {})
    if span in cached:
        return cached[span]
    bo = index.block_offsets
    n_spans = max(1, -(-index.n_docs // span))
    if span % bs == 0:
        cols = torch.arange(0, index.n_blocks, span // bs, device=bo.device)
        out = torch.cat([bo[:, cols], bo[:, -1:]], 1)
    elif bs % span == 0:
        out = _split_blocks(index.doc_ids, bo, bs, span, n_spans)
    else:
        raise ValueError(f"span {span} must divide or be a multiple of the block size {bs}")
    out = out[:, :n_spans].contiguous() if out.shape[1] > n_spans + 1 else out.contiguous()
    if out.shape[1] == n_spans:  # trimmed: close with the end of every list
        out = torch.cat([out, bo[:, -1:]], 1).contiguous()
    cached[span] = out
    return out


def _split_blocks(doc_ids: torch.Tensor, bo: torch.Tensor, bs: int, span: int, n_spans: int,
                  terms_per_step: int = 2048) -> torch.Tensor:
    """Sub-span starts by a vectorised binary search (torch; chunked over terms to bound memory)."""
    V, nb = bo.shape[0], bo.shape[1] - 1
    m = bs // span
    out = torch.empty((V, nb * m + 1), dtype=torch.int64, device=bo.device)
    out[:, -1] = bo[:, -1]
    sub = torch.arange(m, device=bo.device)
    for t0 in range(0, V, terms_per_step):
        t1 = min(V, t0 + terms_per_step)
        lo = bo[t0:t1, :-1].unsqueeze(2).expand(-1, -1, m).clone()          # [T, nb, m]
        hi = bo[t0:t1, 1:].unsqueeze(2).expand(-1, -1, m).clone()
        bound = (torch.arange(nb, device=bo.device).view(1, nb, 1) * bs + sub.view(1, 1, m) * span)
        for _ in range(max(1, int(bs).bit_length() + 1)):                  # segments hold <= bs postings (+pad)
            active = lo < hi
            if not bool(active.any()):
                break
            mid = (lo + hi) // 2
            d = doc_ids[mid.clamp(max=doc_ids.numel() - 1)]
            right = (d >= bound) | (d < 0)                                # first doc >= bound, or padding
            hi = torch.where(active & right, mid, hi)
            lo = torch.where(active & ~right, mid + 1, lo)
        out[t0:t1, :-1] = lo.view(t1 - t0, nb * m)
    return out


def _query_arrays(index: InvertedIndex, queries: SparseVectors):
    """Query CSR on the index's device, restricted to the index vocabulary."""
    dev = index.device
    q = queries.to(dev) if queries.device != dev else queries
    indptr, terms, weights = q.indptr, q.indices, q.values
    if q.vocab_size > index.vocab_size:  # terms the index has never seen match nothing
        keep = terms < index.vocab_size
        if not bool(keep.all()):
            row = q.row_ids()
            indptr = torch.zeros_like(indptr)
            torch.cumsum(torch.bincount(row[keep], minlength=len(q)), 0, out=indptr[1:])
            terms, weights = terms[keep], weights[keep]
    return indptr.contiguous(), terms.contiguous(), weights.contiguous()


def _check_device(dev: torch.device) -> None:
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton_search needs a CUDA index, or TRITON_INTERPRET=1 on the CPU "
                           "(use the torch backend of lsr.Searcher otherwise)")


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
    _check_device(dev)
    B = len(queries)
    if B == 0 or index.n_docs == 0:
        return (torch.zeros((B, k), dtype=torch.float32, device=dev),
                torch.full((B, k), -1, dtype=torch.int64, device=dev))
    cfg = config or default_config(B)
    if path == "auto":
        path = choose_path(index.n_docs, B, cfg.kernel in ("auto", "cuda") and _cuda_span(cfg, index) is not None)
    if path == "block":
        # longest query: free when the queries are on the host, else the one sync before the kernels
        # (out-of-vocabulary terms dropped below only shorten rows: this stays an upper bound)
        max_terms = int(queries.indptr.diff().max())
        return _block_search(index, *_query_arrays(index, queries), k, cfg, max_terms)
    return _dense_search(index, *_query_arrays(index, queries), k, path)


def _dense_search(index, indptr, terms, weights, k, path):
    """scatter / csr paths: dense scores for query chunks that fit DENSE_BUDGET, then triton_topk."""
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


def _block_search(index, indptr, terms, weights, k, cfg: BlockConfig, max_terms: int):
    """The block path over query chunks that keep the candidate slots within CAND_BUDGET."""
    B = indptr.numel() - 1
    cfg = replace(cfg, group=min(cfg.group, 1 << (B - 1).bit_length()))
    score, span = _block_kernel(cfg, index)
    cfg = replace(cfg, span=span)
    span_off = span_offsets(index, span)
    n_spans = span_off.shape[1] - 1
    cspan = _coarse_span(cfg, index, score) if B >= cfg.coarse_min_batch else None
    coarse = (cspan, span_offsets(index, cspan)) if cspan else None
    if cfg.group > 1:  # queries ordered by work (sum of df) so that a group's queries end together
        row = torch.repeat_interleave(torch.arange(B, device=indptr.device), indptr.diff())
        cost = torch.zeros(B, dtype=torch.int64, device=indptr.device)
        cost.index_add_(0, row, index.lengths.to(torch.int64)[terms.long()])
        perm = torch.sort(cost, descending=True, stable=True).indices
    else:
        perm = torch.arange(B, device=indptr.device)
    n_samp = _n_sample(n_spans, span, k, cfg.sample_every)
    cap = _cap(k, n_samp)
    step = max(cfg.group, int(CAND_BUDGET // (n_spans * cap * 8)) // cfg.group * cfg.group)
    if cfg.group == 1 and B <= step:  # the common case: one chunk, queries in their own order
        return _block_chunk(index, span_off, indptr, terms, weights, k, cfg, n_samp, cap, score, max_terms, coarse)
    out_s = torch.empty((B, k), dtype=torch.float32, device=indptr.device)
    out_d = torch.empty((B, k), dtype=torch.int64, device=indptr.device)
    for c0 in range(0, B, step):
        sel = perm[c0:c0 + step]
        ip, tt, ww = _select_queries(indptr, terms, weights, sel)
        s, d = _block_chunk(index, span_off, ip, tt, ww, k, cfg, n_samp, cap, score, max_terms, coarse)
        out_s[sel], out_d[sel] = s, d
    return out_s, out_d


def _select_queries(indptr, terms, weights, sel):
    """The CSR (indptr, terms, weights) of queries ``sel`` (in that order)."""
    lens = indptr.diff()[sel]
    ip = torch.zeros(sel.numel() + 1, dtype=torch.int64, device=sel.device)
    torch.cumsum(lens, 0, out=ip[1:])
    src = torch.repeat_interleave(indptr[sel], lens) + torch.arange(int(ip[-1]), device=sel.device) \
        - torch.repeat_interleave(ip[:-1], lens)
    return ip, terms[src].contiguous(), weights[src].contiguous()


def _coarse_span(cfg: BlockConfig, index, score) -> int | None:
    """The coarse pass's span where it runs (the CUDA kernel scores, ``cfg.coarse``), else None."""
    if not cfg.coarse or getattr(score, "func", None) is not block_cuda.cuda_block_candidates:
        return None
    cspan = max(cfg.span, min(cfg.coarse_span, _span_limit(index), block_cuda.MAX_SPAN))
    bs = index.block_size
    return cspan if cspan % bs == 0 or bs % cspan == 0 else None


def _n_sample(n_spans: int, span: int, k: int, every: int) -> int:
    """Spans of pass 1: ~1/every of them, but enough row maxima (4k) for a tight bound."""
    return min(n_spans, max(math.ceil(4 * k / (span // ROW)), math.ceil(n_spans / every)))


def _cap(k: int, n_samp: int) -> int:
    """Slots per (query, span): theta keeps ~k docs of the n_samp sampled spans, so ~k / n_samp per span;
    3x that + 8 makes overflow (rescored, still exact) rare."""
    need = 3 * k / max(n_samp, 1) + 8
    return 1 << max(3, math.ceil(math.log2(need)))


def _block_chunk(index, span_off, indptr, terms, weights, k, cfg: BlockConfig, n_samp: int, cap: int, score,
                 max_terms: int, coarse=None):
    B = indptr.numel() - 1
    width = terms_bucket(max_terms)
    body = functools.partial(_chunk_body, index=index, span_off=span_off, k=k, cfg=cfg, n_samp=n_samp, cap=cap, score=score,
                             max_terms=width, coarse=coarse)
    out = None
    if cfg.graphs and indptr.is_cuda and B <= GRAPH_MAX_B and not torch.cuda.is_current_stream_capturing():
        graph = _chunk_graph(index, body, B, B * width, (B, width, k, cfg, n_samp, cap))
        if graph is not None:
            with graph.lock:
                out = _finish(score, *graph(indptr, terms, weights), k)
    if out is None:
        out = _finish(score, *body(indptr, terms, weights), k)
    best, redo = out
    if redo is not None:   # rare: queries the coarse pass could not settle take the exact pass 2
        sel = torch.nonzero(redo).flatten()
        fixed, _ = _finish(score, *body(*_select_queries(indptr, terms, weights, sel), coarse=None), k)
        best[sel] = fixed
    return unpack_keys(best)


def _chunk_body(indptr, terms, weights, index, span_off, *, k: int, cfg: BlockConfig, n_samp: int, cap: int,
                score, max_terms: int, coarse=None):
    """Both passes and the merge, free of host syncs (so a CUDA graph can hold them).

    ``terms`` / ``weights`` may run past ``indptr[-1]`` (a graph's fixed buffers): only rows read them.
    Returns (best keys [B, k] with every overflowed (query, span) left out, overflow mask bool
    [B, n_spans] or None, theta [B], the scorer's arguments, the queries to redo bool [B] or None) for
    ``_finish``.

    ``coarse`` = (span, span offsets) runs pass 2 on coarse sums (``coarse_floor``: a doc reaching theta
    has a coarse sum >= the query's floor, so no candidate is lost), takes the best k + margin coarse
    keys, rescores them exactly and keeps the top k. That list holds the exact top k when it also holds
    every doc whose coarse sum reaches the floor of the k-th coarse key's score (k docs score at least
    that); a query where this fails, or whose coarse slots overflowed, is flagged for the exact pass 2.
    """
    B = indptr.numel() - 1
    dev = indptr.device
    n_spans = span_off.shape[1] - 1
    span = cfg.span
    scale, inv = query_scales(indptr, terms, weights, index.max_scores)
    kw = {"group": cfg.group, "max_terms": max_terms}
    args = (index.doc_ids, index.scores, span_off, indptr, terms, weights, scale, inv, span)
    # pass 1: row maxima of sampled spans -> theta
    sample = (torch.arange(n_samp, device=dev) * n_spans) // n_samp
    width = span // ROW
    items = span_items(B, sample, cfg.group, width)
    maxima, _ = score(*args, items, B * n_samp * width, **kw)
    theta = kth_threshold(maxima.view(B, -1), k)
    if coarse is not None:
        best, redo = _coarse_pass(index, indptr, terms, weights, scale, inv, theta, coarse, k,
                                  cap * coarse[0] // span, score, kw)
        return best, None, theta, args, redo
    # pass 2: every span, docs >= theta into cap slots
    items = span_items(B, torch.arange(n_spans, device=dev), cfg.group, cap)
    cand, counts = score(*args, items, B * n_spans * cap, theta=theta, cap=cap, **kw)
    over = counts.view(B, n_spans) > cap
    # an overflowed (query, span) holds only its first cap docs: drop them; _finish rescores it whole
    cand = cand.view(B, n_spans, cap).masked_fill_(over.unsqueeze(2), -1)
    return topk_keys(cand.view(B, -1), k), over, theta, args, None


def _coarse_pass(index, indptr, terms, weights, scale, inv, theta, coarse, k: int, cap: int, score, kw):
    """Coarse pass 2 + exact rescoring (see ``_chunk_body``): (best keys [B, k], redo bool [B])."""
    B = indptr.numel() - 1
    dev = indptr.device
    cspan, coff = coarse
    n_spans = coff.shape[1] - 1
    floor = coarse_floor(theta, scale, indptr)
    items = span_items(B, torch.arange(n_spans, device=dev), 1, cap)
    cand, counts = score(index.doc_ids, index.scores, coff, indptr, terms, weights, scale, inv, cspan, items,
                         B * n_spans * cap, cap=cap, coarse_lo=floor, **kw)
    over = (counts.view(B, n_spans) > cap).any(1)
    cand = cand.view(B, -1)
    top = topk_keys(cand, min(k + _margin(k), cand.shape[1]))
    # the k-th coarse key: k docs have int64 sums >= its coarse sum << 30, so the k-th exact score is at
    # least that sum's float32 score, and every doc of the exact top k has a coarse sum >= its floor
    kth = top[:, min(k, top.shape[1]) - 1]
    s_lo = ((kth.clamp_min(0) >> 31) << 30).to(torch.float64).mul_(inv).to(torch.float32)
    last = top[:, -1]
    complete = (last < 0) | (top.shape[1] == cand.shape[1]) | ((last >> 31) < coarse_floor(s_lo, scale, indptr))
    _, docs = unpack_keys(top)   # coarse keys hold docs like exact ones
    best = topk_keys(pack_keys(_rescore(index, indptr, terms, weights, scale, inv, docs), docs), k)  # -1: score 0
    return best, over | ~complete | (floor < 1)


def _margin(k: int) -> int:
    """Coarse keys kept beyond k for the exact rescoring (the completeness test rarely needs more)."""
    return max(32, k // 8)


def _rescore(index, indptr, terms, weights, scale, inv, docs):
    """Exact float32 scores of candidate docs [B, C] (-1 = none: 0.0), free of host syncs."""
    dev = indptr.device
    qd = dense_queries(indptr, terms, weights, index.vocab_size)
    csr = index.docs
    if dev.type == "cuda" and block_cuda.available(dev.index or 0):
        return rescore_cuda.cuda_rescore(csr.indptr, csr.indices, csr.values, qd, scale, inv, docs)
    return triton_csr_scores(csr.indptr, csr.indices, csr.values, qd, scale, inv, docs)


def _finish(score, best, over, theta, args, redo, k):
    """Rescore the (rare) overflowed (query, span) pairs (host side): (best keys [B, k], the queries
    to redo with the exact pass 2 as a bool mask, or None)."""
    if over is not None and bool(over.any()):
        best = _fix_overflow(score, args, torch.nonzero(over), theta, best, k)
    if redo is not None:
        redo = redo.clone() if bool(redo.any()) else None
    return best.clone(), redo


class _ChunkGraph:
    """``_chunk_body`` captured once as a CUDA graph for a fixed batch size and query-term buffer; a call
    copies the queries into the graph's input buffers and replays it. The outputs live in the graph's
    memory until the next replay (``lock`` serialises callers; ``_finish`` copies what it returns)."""

    def __init__(self, body, B: int, n_terms: int, device: torch.device) -> None:
        self.indptr = torch.zeros(B + 1, dtype=torch.int64, device=device)
        self.terms = torch.zeros(n_terms, dtype=torch.int32, device=device)
        self.weights = torch.zeros(n_terms, dtype=torch.float32, device=device)
        self.lock = threading.Lock()
        main = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):  # compile / autotune every kernel outside the capture
            body(self.indptr, self.terms, self.weights)
        main.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = body(self.indptr, self.terms, self.weights)

    def __call__(self, indptr: torch.Tensor, terms: torch.Tensor, weights: torch.Tensor):
        n = terms.numel()
        self.indptr.copy_(indptr)
        self.terms[:n].copy_(terms)
        self.weights[:n].copy_(weights)
        self.graph.replay()
        return self.out


_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _chunk_graph(index, body, B: int, n_terms: int, key: tuple) -> _ChunkGraph | None:
    """The cached graph for ``key`` (least recently used beyond GRAPH_CACHE dropped); None where capture
    failed (then the caller runs eagerly, as it does for every later call with that key)."""
    graphs = _GRAPHS.setdefault(index, OrderedDict())
    if key not in graphs:
        try:
            graphs[key] = _ChunkGraph(body, B, n_terms, index.device)
        except Exception as e:  # noqa: BLE001 - a capture problem must not fail the search
            warnings.warn(f"CUDA graph capture of the block path failed ({type(e).__name__}: {e}); "
                          "running it eagerly", RuntimeWarning, stacklevel=3)
            graphs[key] = None
        while len(graphs) > GRAPH_CACHE:
            graphs.popitem(last=False)
    graphs.move_to_end(key)
    return graphs[key]


def _block_kernel(cfg: BlockConfig, index: InvertedIndex):
    """(scorer with its tuning bound, span) for ``cfg.kernel``: "auto" takes the CUDA kernel where it
    serves (CUDA device with NVRTC, group 1, aligned postings, a collection of at least one CUDA span),
    else the Triton one. Spans never exceed the collection rounded up to a power of two."""
    if cfg.kernel not in ("auto", "cuda", "triton"):
        raise ValueError(f"kernel must be 'auto', 'cuda' or 'triton', got {cfg.kernel!r}")
    span = _cuda_span(cfg, index) if cfg.kernel != "triton" else None
    if cfg.kernel == "cuda" and span is None:
        raise RuntimeError("kernel='cuda' needs a CUDA device with NVRTC, group=1, 16-byte aligned postings "
                           "and at least cuda_span docs")
    if span is not None:
        return functools.partial(block_cuda.cuda_block_candidates, warps=cfg.cuda_warps, step=cfg.cuda_step), span
    dev = index.device
    return functools.partial(triton_block_candidates, rows=cfg.rows, chunk=cfg.chunk, readout=cfg.readout,
                             num_warps=cfg.num_warps, n_programs=default_programs(dev, cfg.per_sm)), \
        min(cfg.span, _span_limit(index))


def _span_limit(index: InvertedIndex) -> int:
    """The collection size rounded up to a power of two (>= ROW): no span is larger."""
    return max(ROW, 1 << max(0, (index.n_docs - 1).bit_length()))


def _cuda_span(cfg: BlockConfig, index: InvertedIndex) -> int | None:
    """cfg.cuda_span where the CUDA kernel serves this index (group 1, a collection of at least one CUDA
    span, a CUDA device with NVRTC, aligned postings), else None."""
    ok = cfg.group == 1 and min(cfg.cuda_span, _span_limit(index)) == cfg.cuda_span \
        and block_cuda.usable(index.doc_ids, index.scores, cfg.cuda_span, cfg.cuda_warps)
    return cfg.cuda_span if ok else None


def _fix_overflow(score, args, over, theta, best, k):
    span = args[-1]
    n_fix = over.shape[0]
    items = (over[:, 0].to(torch.int32).contiguous(), over[:, 1].to(torch.int32).contiguous(),
             torch.arange(n_fix, device=over.device, dtype=torch.int64) * span, span)
    keys, _ = score(*args, items, n_fix * span, theta=theta, cap=span, group=1)
    keys = topk_keys(keys.view(n_fix, span), min(k, span))
    # append every fixed pair's keys to its query's row, then take the top k again
    q = over[:, 0]
    rank = torch.arange(n_fix, device=q.device) - torch.searchsorted(q, q)   # pairs come sorted by query
    extra = torch.full((best.shape[0], int(rank.max()) + 1, keys.shape[1]), -1, dtype=torch.int64,
                       device=q.device)
    extra[q, rank] = keys
    return topk_keys(torch.cat([best, extra.view(best.shape[0], -1)], 1), k)

