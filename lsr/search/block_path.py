"""The block path of ``triton_search``: exact top-k at scale without a dense [B, N] score matrix.

Pass 1 scores a sample of doc spans and keeps the best doc of every 32 (row maxima); the k-th best of
those is a valid lower bound ``theta`` of each query's k-th score. Pass 2 scores every span and emits
the docs >= theta (a few per span) to fixed slots; a (query, span) whose slots overflowed is rescored
with all its docs >= theta. The exact top-k of the candidates is the answer. Memory: candidates
B * n_spans * cap * 8 bytes, never [B, N].

The span scorer is the CUDA kernel (``kernels.block_cuda``, shared-memory accumulation, NVRTC-compiled)
where it can run, else the Triton kernel (``kernels.block``); ``lsr.search.span_scorer`` chooses, and
``BlockConfig.kernel`` forces one. Both give the same bits. With the CUDA kernel, both passes may sum coarse
16-bit fixed point (one shared atomic per posting, two docs a word) and rescore the best k + margin docs exactly
(``kernels.rescore_cuda``); a query whose list fails the completeness test has all its candidates rescored,
and one whose slots overflowed (or has no usable theta) takes the exact pass 2. docs/notes-search.md
explains each choice.

``BlockPlan`` (``lsr.search.block_plan``, with ``BlockConfig`` and the per-chunk records) holds what every query
chunk of one search shares (index arrays, the chosen scorer and span, slots per span, ...), so the helpers below
take one plan instead of a dozen arguments.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from lsr.search.block_plan import (
    BlockConfig,
    BlockPlan,
    ChunkResult,
    CoarseSpans,
    QueryCSR,
    ScoreArgs,
    Settled,
)
from lsr.search.graphs import GRAPH_MAX_B, cached_chunk_graph
from lsr.search.kernels import block_cuda, rescore_cuda
from lsr.search.kernels.block import terms_bucket
from lsr.search.kernels.coarse import sampled_rank
from lsr.search.kernels.coarse_checks import (
    candidate_docs,
    coarse_bounds,
    coarse_verdicts,
    torch_candidate_docs,
    torch_coarse_bounds,
    torch_coarse_verdicts,
)
from lsr.search.kernels.csr import dense_queries, triton_csr_scores
from lsr.search.kernels.fixed import triton_query_scales
from lsr.search.kernels.select import bucket_edge, bucket_theta, bucket_topk
from lsr.search.kernels.topk import (
    ROW,
    pack_keys,
    topk_keys,
    triton_pack_keys,
    triton_unpack_keys,
    unpack_keys,
)
from lsr.search.span_scorer import coarse_span, cuda_span, select_span_scorer
from lsr.search.spans import span_offsets
from lsr.search.work_items import span_work_items
from lsr.utils.kernels import INTERPRET
from lsr.utils.ragged import segment_ids

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex

__all__ = ["CAND_BUDGET", "BlockConfig", "QueryCSR", "block_search", "cuda_span"]

CAND_BUDGET = 1 << 30          # bytes of candidate slots per block-path query chunk
RESCUE_CELLS = 1 << 21         # coarse candidates (B x C) up to which incomplete lists are settled in the chunk
COARSE_MIN_MARGIN = 128        # coarse keys kept beyond k at least (``_coarse_margin``)
PLAN_CACHE = 64                # plans kept per index (``_make_plan``), the least recently used dropped first

_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def block_search(index: InvertedIndex, queries: QueryCSR, k: int, cfg: BlockConfig,
                 max_terms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k over query chunks that keep the candidate slots within CAND_BUDGET.

    ``max_terms`` bounds the longest query for the Triton kernel and the mean one for the CUDA kernel
    (``triton_backend.terms_bound``); its bucket picks the compiled kernel and CUDA graph.
    """
    B = queries.indptr.numel() - 1
    plan = _make_plan(index, B, k, cfg, max_terms)
    group = plan.cfg.group
    step = max(group, int(CAND_BUDGET // (plan.n_spans * plan.cap * 8)) // group * group)
    if group == 1 and B <= step:  # the common case: one chunk, queries in their own order
        return _search_chunk(plan, queries)
    order = _work_order(index, queries) if group > 1 else torch.arange(B, device=queries.indptr.device)
    out_s = torch.empty((B, k), dtype=torch.float32, device=queries.indptr.device)
    out_d = torch.empty((B, k), dtype=torch.int64, device=queries.indptr.device)
    for c0 in range(0, B, step):
        sel = order[c0:c0 + step]
        out_s[sel], out_d[sel] = _search_chunk(plan, queries.select(sel))
    return out_s, out_d


def _make_plan(index: InvertedIndex, B: int, k: int, cfg: BlockConfig, max_terms: int) -> BlockPlan:
    """The plan of a search, its parts cached per index and (B, k, cfg, terms bucket): building them took ~30 µs,
    ~1.5% of a 64-query search."""
    plans = _PLANS.setdefault(index, OrderedDict())
    key = (B, k, cfg, terms_bucket(max_terms))   # the plan reads only the bucket
    parts = plans.get(key)
    if parts is not None:
        plans.move_to_end(key)
    else:
        parts = _plan_parts(index, B, k, cfg, max_terms)
        plans[key] = parts
        while len(plans) > PLAN_CACHE:
            plans.popitem(last=False)
    return BlockPlan(index, *parts)


def _plan_parts(index: InvertedIndex, B: int, k: int, cfg: BlockConfig, max_terms: int) -> tuple:
    """``BlockPlan``'s fields after the index (no reference to it: the cache holds the index weakly)."""
    cfg = _resolved(cfg, min(cfg.group, 1 << (B - 1).bit_length()), cfg.span)
    scorer, span = select_span_scorer(cfg, index)
    cfg = _resolved(cfg, cfg.group, span)
    span_off = span_offsets(index, span)
    n_spans = span_off.shape[1] - 1
    cspan = coarse_span(cfg, index, scorer) if B >= cfg.coarse_min_batch else None
    n_sample = _pass1_spans(n_spans, span, k, cfg.coarse_sample_every if cspan else cfg.sample_every)
    return (cfg, scorer, span_off, k, n_sample, _slots_per_span(k, n_sample), terms_bucket(max_terms),
            CoarseSpans(cspan, span_offsets(index, cspan)) if cspan else None)


@functools.lru_cache(maxsize=256)
def _resolved(cfg: BlockConfig, group: int, span: int) -> BlockConfig:
    """``cfg`` with the group and span a search resolved (cached: ``dataclasses.replace`` took ~20 of the ~60 µs
    of host work a small search spends in its plan)."""
    return replace(cfg, group=group, span=span)


def _work_order(index: InvertedIndex, queries: QueryCSR) -> torch.Tensor:
    """Queries by decreasing work (sum of df), so that a group's queries end together."""
    indptr = queries.indptr
    B = indptr.numel() - 1
    row = segment_ids(indptr.diff())
    cost = torch.zeros(B, dtype=torch.int64, device=indptr.device)
    cost.index_add_(0, row, index.lengths.to(torch.int64)[queries.terms[:row.numel()].long()])
    return torch.sort(cost, descending=True, stable=True).indices


def _pass1_spans(n_spans: int, span: int, k: int, every: int) -> int:
    """Spans of pass 1: ~1/every of them, but enough row maxima (4k) for a tight bound."""
    return min(n_spans, max(math.ceil(4 * k / (span // ROW)), math.ceil(n_spans / every)))


def _slots_per_span(k: int, n_sample: int) -> int:
    """Slots per (query, span): theta keeps ~k docs of the n_sample sampled spans, so ~k / n_sample per
    span; 3x that + 8 makes overflow (rescored, still exact) rare."""
    need = 3 * k / max(n_sample, 1) + 8
    return 1 << max(3, math.ceil(math.log2(need)))


def _coarse_bounds(plan: BlockPlan, maxima: torch.Tensor, args: ScoreArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta float32 [B], floor int64 [B]) of the coarse route from pass 1's coarse row maxima [B, R]: the key of
    rank _floor_rank as a score, and the coarse sum a doc reaching it has at least (``coarse_floor``)."""
    edge = bucket_edge(maxima, _floor_rank(plan))
    return (coarse_bounds if _fused(edge) else torch_coarse_bounds)(edge, args.inv_scale, args.scale, args.indptr)


def _fused(t: torch.Tensor) -> bool:
    """Whether the coarse route's bookkeeping runs as the Triton kernels of ``kernels.coarse_checks`` (CUDA, and the
    interpreter of the CPU tests) rather than their torch twins: a graph node each instead of dozens."""
    return t.is_cuda or INTERPRET


def _floor_rank(plan: BlockPlan) -> int:
    """The pass-1 key rank behind the coarse pass 2's floor (``coarse.sampled_rank``; plan.k: a proven bound)."""
    return sampled_rank(plan.k, plan.n_sample / plan.n_spans)


def _coarse_margin(k: int) -> int:
    """Coarse keys kept beyond k for the exact rescoring. The list is complete when its last coarse sum lies a
    query's term count below the k-th (each term's floor loses < 1 unit); with 16-bit coarse sums that is ~1.5%
    of the score at the k-th, and a margin of k / 8 left ~18% of synthetic queries at k = 1000 to a rescue
    (docs/notes-search.md, session 18)."""
    return max(COARSE_MIN_MARGIN, k // 2)


def _search_chunk(plan: BlockPlan, queries: QueryCSR) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [B, k], doc_idx [B, k]) of one chunk: both passes (as a CUDA graph up to GRAPH_MAX_B queries),
    then the host-side repairs and, for the rare queries the coarse pass could not settle, the exact pass."""
    B = queries.indptr.numel() - 1
    body = functools.partial(_score_chunk, plan)
    out = None
    # a chunk of a larger batch may hold more terms than its share of the plan's bound (the mean length where
    # the CUDA kernel scores): such a chunk runs eagerly, as a graph's term buffer holds B x plan.max_terms
    if (plan.cfg.graphs and queries.indptr.is_cuda and B <= GRAPH_MAX_B and queries.terms.numel() <= B * plan.max_terms
            and not torch.cuda.is_current_stream_capturing()):
        graph = cached_chunk_graph(plan.index, body, B, B * plan.max_terms, plan.graph_key(B))
        if graph is not None:
            with graph.lock:
                out = _settle(plan, graph(*queries), True)
    if out is None:
        out = _settle(plan, body(*queries), False)
    if out.unpacked is not None:
        return out.unpacked
    best = out.best
    if out.rescue is not None:
        sel, cand, scale, inv = out.rescue
        best[sel] = _rescore_candidates(plan, queries.select(sel), cand, scale, inv)
    if out.redo is not None:
        sel = out.redo
        exact = replace(plan, coarse=None)
        best[sel] = _settle(exact, _score_chunk(exact, *queries.select(sel)), False).best
    return _unpack(best)


def _score_chunk(plan: BlockPlan, indptr: torch.Tensor, terms: torch.Tensor, weights: torch.Tensor) -> ChunkResult:
    """Both passes and the merge, free of host syncs (so a CUDA graph can hold them).

    With ``plan.coarse``, pass 2 runs on coarse sums (``coarse_floor``: a doc reaching theta has a
    coarse sum >= the query's floor), takes the best k + margin coarse keys, rescores them exactly and
    keeps the top k. That list holds the exact top k when it also holds every doc whose coarse sum reaches
    the floor of the k-th coarse key's score (k docs score at least that). For large k, theta comes from a
    pass-1 key above the k-th (``_floor_rank``: far fewer candidates), which is checked the same way: the
    query's floor must not exceed that floor. A query where a check fails, or whose coarse slots
    overflowed, is flagged for the exact pass 2.
    """
    B = indptr.numel() - 1
    dev = indptr.device
    cfg, index = plan.cfg, plan.index
    scale, inv = triton_query_scales(indptr, terms, weights, index.max_scores)
    kw = {"group": cfg.group, "max_terms": plan.max_terms}
    args = ScoreArgs(index.doc_ids, index.scores, plan.span_off, indptr, terms, weights, scale, inv, cfg.span)
    # pass 1: row maxima of sampled spans -> theta (the exact pass: a lower bound of the k-th score)
    width = cfg.span // ROW
    items1 = span_work_items(B, plan.n_sample, plan.n_spans, cfg.group, width, dev)
    coarse = plan.coarse is not None   # then pass 1 also runs on coarse sums: a slightly lower theta, faster
    maxima, _ = plan.scorer(*args, items1, B * plan.n_sample * width, **(dict(kw, coarse_rows=True) if coarse else kw))
    if coarse:   # row maxima of coarse sums; the key of rank _floor_rank, checked in _coarse_pass2
        theta, floor = _coarse_bounds(plan, maxima.view(B, -1), args)
        best, redo, rescue, cand, items2, flags = _coarse_pass2(plan, args, floor, kw)
        return ChunkResult(best, None, theta, args, redo, rescue, cand, None, flags, _unpack(best), (items1, items2))
    theta = bucket_theta(maxima.view(B, -1), plan.k)
    # pass 2: every span, docs >= theta into cap slots
    cap = plan.cap
    items2 = span_work_items(B, plan.n_spans, plan.n_spans, cfg.group, cap, dev)
    cand, counts = plan.scorer(*args, items2, B * plan.n_spans * cap, theta=theta, cap=cap, **kw)
    over = counts.view(B, plan.n_spans) > cap
    # an overflowed (query, span) holds only its first cap docs: drop them; _settle rescores it whole
    cand = cand.view(B, plan.n_spans, cap).masked_fill_(over.unsqueeze(2), -1).view(B, -1)
    best, reselect = bucket_topk(cand, plan.k)
    return ChunkResult(best, over, theta, args, None, None, cand, reselect, _flags(over, reselect, None, None),
                       _unpack(best), (items1, items2))


def _unpack(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``unpack_keys``, fused where ``_fused``."""
    return triton_unpack_keys(keys) if _fused(keys) else unpack_keys(keys)


def _flags(*masks: torch.Tensor | None) -> torch.Tensor:
    """bool [len(masks)]: whether each mask has a True (False for None), for ``_settle``'s one host read."""
    dev = next(m for m in masks if m is not None).device
    no = torch.zeros((), dtype=torch.bool, device=dev)
    return torch.stack([no if m is None else m.any() for m in masks])


def _coarse_pass2(plan: BlockPlan, args: ScoreArgs, floor: torch.Tensor, kw: dict[str, int]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, tuple, torch.Tensor]:
    """Coarse pass 2 + exact rescoring (see ``_score_chunk``): best keys [B, k], the queries for the exact
    pass 2 (bool [B]: a span's slots overflowed, a selection overflowed or no usable theta), the queries whose
    list failed only the completeness test (bool [B]; None where the chunk settled them itself), the coarse
    candidates [B, C], the work items read and the flags ``_settle`` reads (int32 [4]).

    A list fails that test when many docs tie at the k-th coarse sum (quantised weights, few matching
    terms). Such a query still has every doc that can reach theta among its candidates (no slot
    overflowed), so rescoring all of them settles it exactly: here, inside the chunk (no host step), when
    the candidates are few (B x C <= RESCUE_CELLS: small batches, as a server runs); else
    ``_search_chunk`` does it for the flagged queries. The checks are ``kernels.coarse_checks.coarse_verdicts``.
    """
    indptr, scale, inv, k = args.indptr, args.scale, args.inv_scale, plan.k
    B = indptr.numel() - 1
    cspan, coff = plan.coarse
    rank = _floor_rank(plan)
    sampled = rank < k   # theta came from a pass-1 key above the k-th: not a proven bound
    cap = _slots_per_span(rank, plan.n_sample) * cspan // plan.cfg.span
    n_spans = coff.shape[1] - 1
    items = span_work_items(B, n_spans, n_spans, 1, cap, indptr.device)
    cand, counts = plan.scorer(*args._replace(span_off=coff, span=cspan), items, B * n_spans * cap, cap=cap,
                               coarse_lo=floor, **kw)
    cand = cand.view(B, -1)
    top, reselect = bucket_topk(cand, min(k + _coarse_margin(k), cand.shape[1]))   # reselect: exact pass 2
    # a flagged query is rescored on every one of its candidates instead of its list (which is among them: one
    # copy of each doc), in the same launch as the other queries' lists, when the candidates are few. Not with a
    # sampled floor: its lists are long and rarely incomplete, and the rescoring would widen to every candidate
    settle_here = cand.numel() <= RESCUE_CELLS and not sampled
    fused = _fused(top)
    verdicts = coarse_verdicts if fused else torch_coarse_verdicts
    redo, rescue, flags = verdicts(top, k, cand.shape[1], counts.view(B, n_spans), cap, floor, reselect, inv, scale,
                                   indptr, sampled, not settle_here)
    docs = (candidate_docs if fused else torch_candidate_docs)(top, *((cand, rescue) if settle_here else ()))
    queries = QueryCSR(args.indptr, args.terms, args.weights)
    exact = _pack(_exact_scores(plan.index, queries, scale, inv, docs), docs)   # -1: score 0
    return topk_keys(exact, k), redo, None if settle_here else rescue, cand, items, flags


def _exact_scores(index: InvertedIndex, queries: QueryCSR, scale: torch.Tensor, inv_scale: torch.Tensor,
                  docs: torch.Tensor) -> torch.Tensor:
    """Exact float32 scores of candidate docs [B, C] (-1 = none: 0.0), free of host syncs."""
    dev = queries.indptr.device
    qd = dense_queries(*queries, index.vocab_size)
    csr = index.docs
    if dev.type == "cuda" and block_cuda.available(dev.index or 0) and index.vocab_size <= rescore_cuda.MAX_VOCAB:
        return rescore_cuda.cuda_rescore(csr.indptr, csr.indices, csr.values, qd, scale, inv_scale, docs,
                                         queries.indptr, queries.terms)
    return triton_csr_scores(csr.indptr, csr.indices, csr.values, qd, scale, inv_scale, docs)


def _rescore_candidates(plan: BlockPlan, queries: QueryCSR, cand: torch.Tensor, scale: torch.Tensor,
                        inv: torch.Tensor) -> torch.Tensor:
    """Best keys [n, k] of queries from the exact scores of all their coarse candidates [n, C] (``scale`` /
    ``inv`` [n]: the queries' fixed-point scales, as the chunk computed them)."""
    docs = _unpack(cand)[1]   # one launch where fused: this runs on the host side, launch by launch
    return topk_keys(_pack(_exact_scores(plan.index, queries, scale, inv, docs), docs), plan.k)


def _pack(scores: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """``pack_keys``, fused where ``_fused``."""
    return triton_pack_keys(scores, docs) if _fused(scores) else pack_keys(scores, docs)


def _settle(plan: BlockPlan, result: ChunkResult, replayed: bool) -> Settled:
    """Read the chunk's flags (the one host sync), repair what they name and pick out the queries that need
    more: the exact pass 2, or the rescoring of all their coarse candidates. Rows whose bucket selection
    overflowed are selected again with ``torch.topk``; overflowed (query, span) pairs are rescored. A graph's
    outputs are overwritten by its next replay (``replayed``), so what is returned from them is a copy; the copy
    of the unpacked result is queued before the flag read, so that it runs right behind the graph rather than
    after the host has woken up (it goes unused when something is repaired)."""
    unpacked = tuple(t.clone() for t in result.unpacked) if replayed else result.unpacked
    any_over, any_reselect, any_redo, any_rescue = result.flags.tolist()
    if not (any_over or any_reselect or any_redo or any_rescue):
        return Settled(result.best, None, None, unpacked)
    best = result.best.clone()
    if any_reselect:
        rows = torch.nonzero(result.reselect).flatten()
        best[rows] = topk_keys(result.cand[rows], plan.k)
    if any_over:
        best = _rescore_overflow(plan, result._replace(best=best), torch.nonzero(result.overflow))
    redo = torch.nonzero(result.redo).flatten() if any_redo else None
    rescue = None
    if any_rescue:
        sel = torch.nonzero(result.rescue).flatten()
        rescue = (sel, result.cand[sel], result.args.scale[sel], result.args.inv_scale[sel])
    return Settled(best, redo, rescue)


def _rescore_overflow(plan: BlockPlan, result: ChunkResult, over: torch.Tensor) -> torch.Tensor:
    """Score every overflowed (query, span) pair ``over`` [n, 2] whole and merge its docs >= theta."""
    span, k, best = result.args.span, plan.k, result.best
    n_fix = over.shape[0]
    items = (over[:, 0].to(torch.int32).contiguous(), over[:, 1].to(torch.int32).contiguous(),
             torch.arange(n_fix, device=over.device, dtype=torch.int64) * span, span)
    keys, _ = plan.scorer(*result.args, items, n_fix * span, theta=result.theta, cap=span, group=1)
    keys = topk_keys(keys.view(n_fix, span), min(k, span))
    # append every fixed pair's keys to its query's row, then take the top k again
    q = over[:, 0]
    rank = torch.arange(n_fix, device=q.device) - torch.searchsorted(q, q)   # pairs come sorted by query
    extra = torch.full((best.shape[0], int(rank.max()) + 1, keys.shape[1]), -1, dtype=torch.int64,
                       device=q.device)
    extra[q, rank] = keys
    return topk_keys(torch.cat([best, extra.view(best.shape[0], -1)], 1), k)
