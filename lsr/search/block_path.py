"""The block route: exact top-k at scale without a dense [B, N] score matrix (its plan: ``lsr.search.plan``).

Pass 1 scores a sample of doc spans and keeps the best doc of every 32 (row maxima); the k-th best of
those is a valid lower bound ``theta`` of each query's k-th score. Pass 2 scores every span and emits
the docs >= theta (a few per span) to fixed slots; a (query, span) whose slots overflowed is rescored
with all its docs >= theta. The exact top-k of the candidates is the answer. Memory: candidates
B * n_spans * cap * 8 bytes, never [B, N].

The span scorer is the CUDA kernel (``kernels.block_cuda``, shared-memory accumulation, NVRTC-compiled)
where it can run, else the Triton kernel (``kernels.block``); the plan chooses from the registry
``lsr.search.scorers`` (``SearchConfig.scorer`` forces one). Both give the same bits. With the CUDA kernel, both passes may sum coarse 16-bit fixed point (one shared
atomic per posting, two docs a word) and rescore the best k + margin docs exactly (``kernels.rescore_cuda``). What
happens when a pass could not be sure is the fallback chain of ``lsr.search.fallbacks``. docs/performance/search.md
explains each choice.

Everything a chunk of queries runs comes from one ``BlockPlan`` (``lsr.search.block_plan``, made by
``lsr.search.block_planner``): the scorer, the passes, the selection, graph or eager. Nothing here decides again;
what ran is noted in the index's ``IndexCache.ran``.
"""

from __future__ import annotations

import functools

import torch

from lsr.search.block_plan import BlockPlan, ChunkResult, QueryCSR, Repairs, ScoreArgs
from lsr.search.fallbacks import exact_scores, repair, settle
from lsr.search.kernels.coarse_checks import (
    candidate_docs,
    coarse_bounds,
    coarse_verdicts,
    torch_candidate_docs,
    torch_coarse_bounds,
    torch_coarse_verdicts,
)
from lsr.search.kernels.fixed import triton_query_scales
from lsr.search.kernels.topk import ROW
from lsr.search.select import bucket_edge, bucket_theta, bucket_topk, pack, row_topk, unpack
from lsr.utils.ragged import segment_ids

__all__ = ["block_search"]


def block_search(plan: BlockPlan, queries: QueryCSR,
                 trace: list[Repairs] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of ``queries`` in chunks of ``plan.chunk`` queries (the candidate slots' budget).

    ``trace``: a list that gets one ``Repairs`` record per chunk (what the fallback chain did)."""
    B = queries.indptr.numel() - 1
    group, step, k, dev = plan.group, plan.chunk, plan.k, queries.indptr.device
    plan.cache.ran.note("route", "block")
    if group == 1 and B <= step:  # the common case: one chunk, queries in their own order
        return _search_chunk(plan, queries, trace)
    order = _work_order(plan, queries) if group > 1 else torch.arange(B, device=dev)
    out_s = torch.empty((B, k), dtype=torch.float32, device=dev)
    out_d = torch.empty((B, k), dtype=torch.int64, device=dev)
    for c0 in range(0, B, step):
        sel = order[c0:c0 + step]
        out_s[sel], out_d[sel] = _search_chunk(plan, queries.select(sel), trace)
    return out_s, out_d


def _work_order(plan: BlockPlan, queries: QueryCSR) -> torch.Tensor:
    """Queries by decreasing work (sum of df), so that a group's queries end together."""
    indptr = queries.indptr
    B = indptr.numel() - 1
    row = segment_ids(indptr.diff())
    cost = torch.zeros(B, dtype=torch.int64, device=indptr.device)
    cost.index_add_(0, row, plan.index.lengths.to(torch.int64)[queries.terms[:row.numel()].long()])
    return torch.sort(cost, descending=True, stable=True).indices


def _coarse_bounds(plan: BlockPlan, maxima: torch.Tensor, args: ScoreArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta float32 [B], floor int64 [B]) of the coarse route from pass 1's coarse row maxima [B, R]: the key of
    the plan's floor rank as a score, and the coarse sum a doc reaching it has at least (``coarse_floor``)."""
    edge = bucket_edge(maxima, plan.coarse.floor_rank)
    bounds = coarse_bounds if plan.fused else torch_coarse_bounds
    return bounds(edge, args.inv_scale, args.scale, args.indptr)


def _search_chunk(plan: BlockPlan, queries: QueryCSR,
                  trace: list[Repairs] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [B, k], doc_idx [B, k]) of one chunk: both passes (as a CUDA graph where the plan says),
    then the fallback chain (``lsr.search.fallbacks``)."""
    B = queries.indptr.numel() - 1
    body = functools.partial(_score_chunk, plan)
    settled = None
    # the plan says replay; a chunk of a larger batch may still hold more terms than its share of the plan's bound
    # (the mean length, for a scorer that reads any length): such a chunk runs eagerly, as a graph's term buffer
    # holds B x plan.max_terms; so does a chunk searched inside a caller's own capture
    if (plan.replay and queries.terms.numel() <= B * plan.max_terms
            and not torch.cuda.is_current_stream_capturing()):
        graph = plan.cache.graphs.lookup(body, B, B * plan.max_terms, plan.graph_key(B), plan.graphs,
                                         plan.index.device)
        if graph is not None:
            with graph.lock:
                settled = settle(plan, graph(*queries), True)
            plan.cache.ran.note("cuda graph", "replayed")
    if settled is None:
        settled = settle(plan, body(*queries), False)
        plan.cache.ran.note("cuda graph", "eager")
    return repair(plan, queries, settled, _exact_pass, trace)


def _exact_pass(plan: BlockPlan, queries: QueryCSR) -> ChunkResult:
    return _score_chunk(plan, *queries)


def _score_chunk(plan: BlockPlan, indptr: torch.Tensor, terms: torch.Tensor, weights: torch.Tensor) -> ChunkResult:
    """Both passes and the merge, free of host syncs (so a CUDA graph can hold them).

    With ``plan.coarse``, pass 2 runs on coarse sums (``coarse_floor``: a doc reaching theta has a
    coarse sum >= the query's floor), takes the best k + margin coarse keys, rescores them exactly and
    keeps the top k. That list holds the exact top k when it also holds every doc whose coarse sum reaches
    the floor of the k-th coarse key's score (k docs score at least that). For large k, theta comes from a
    pass-1 key above the k-th (``CoarsePlan.floor_rank``: far fewer candidates), which is checked the same way: the
    query's floor must not exceed that floor. A query where a check fails, or whose coarse slots
    overflowed, is flagged for the exact pass 2.
    """
    B = indptr.numel() - 1
    dev = indptr.device
    index, ran = plan.index, plan.cache.ran
    scale, inv = triton_query_scales(indptr, terms, weights, index.max_scores)
    kw = {"group": plan.group, "max_terms": plan.max_terms}
    args = ScoreArgs(index.doc_ids, index.scores, plan.span_off, indptr, terms, weights, scale, inv, plan.span)
    # pass 1: row maxima of sampled spans -> theta (the exact pass: a lower bound of the k-th score)
    width = plan.span // ROW
    items1 = _items(plan, B, plan.n_sample, plan.n_spans, plan.group, width, dev)
    coarse = plan.coarse is not None   # then pass 1 also runs on coarse sums: a slightly lower theta, faster
    maxima, _ = plan.launch(*args, items1, B * plan.n_sample * width, **(dict(kw, coarse_rows=True) if coarse else kw))
    if coarse:   # row maxima of coarse sums; the key of the floor rank, checked in _coarse_pass2
        ran.note("pass 2", "coarse")
        theta, floor = _coarse_bounds(plan, maxima.view(B, -1), args)
        best, redo, rescue, cand, items2, flags = _coarse_pass2(plan, args, floor, kw)
        return ChunkResult(best, None, theta, args, redo, rescue, cand, None, flags, unpack(best, plan.fused), (items1, items2))
    ran.note("pass 2", "exact")
    theta = bucket_theta(maxima.view(B, -1), plan.k)
    # pass 2: every span, docs >= theta into cap slots
    cap = plan.cap
    items2 = _items(plan, B, plan.n_spans, plan.n_spans, plan.group, cap, dev)
    cand, counts = plan.launch(*args, items2, B * plan.n_spans * cap, theta=theta, cap=cap, **kw)
    over = counts.view(B, plan.n_spans) > cap
    # an overflowed (query, span) holds only its first cap docs: drop them; the overflow fallback rescores it
    cand = cand.view(B, plan.n_spans, cap).masked_fill_(over.unsqueeze(2), -1).view(B, -1)
    best, reselect = bucket_topk(cand, plan.k, slots=plan.selection.slots, by_rank=plan.selection.by_rank)
    return ChunkResult(best, over, theta, args, None, None, cand, reselect, _flags(over, reselect, None, None),
                       unpack(best, plan.fused), (items1, items2))


def _items(plan: BlockPlan, *key) -> tuple[torch.Tensor, ...]:
    """A pass's work items from the plan's index cache (``IndexCache.work_items``; ``key``: B, n_items, n_spans,
    group, width, device)."""
    return plan.cache.work_items(plan.caches, plan.graphs.max_batch, *key)


def _flags(*masks: torch.Tensor | None) -> torch.Tensor:
    """bool [len(masks)]: whether each mask has a True (False for None), for ``fallbacks.settle``'s one host read."""
    dev = next(m for m in masks if m is not None).device
    no = torch.zeros((), dtype=torch.bool, device=dev)
    return torch.stack([no if m is None else m.any() for m in masks])


def _coarse_pass2(plan: BlockPlan, args: ScoreArgs, floor: torch.Tensor, kw: dict[str, int]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, tuple, torch.Tensor]:
    """Coarse pass 2 + exact rescoring (see ``_score_chunk``): best keys [B, k], the queries for the exact
    pass 2 (bool [B]: a span's slots overflowed, a selection overflowed or no usable theta), the queries whose
    list failed only the completeness test (bool [B]; None where the chunk settled them itself), the coarse
    candidates [B, C], the work items read and the flags ``fallbacks.settle`` reads (int32 [4]).

    A list fails that test when many docs tie at the k-th coarse sum (quantised weights, few matching
    terms). Such a query still has every doc that can reach theta among its candidates (no slot
    overflowed), so rescoring all of them settles it exactly: here, inside the chunk (no host step), when
    the candidates are few (B x C <= ``rescue_cells``: small batches, as a server runs); else
    the rescue fallback does it for the flagged queries. The checks are ``kernels.coarse_checks.coarse_verdicts``.
    """
    indptr, scale, inv, k = args.indptr, args.scale, args.inv_scale, plan.k
    B = indptr.numel() - 1
    c = plan.coarse   # c.sampled: theta came from a pass-1 key above the k-th
    n_spans, cap = c.offsets.shape[1] - 1, c.cap
    items = _items(plan, B, n_spans, n_spans, 1, cap, indptr.device)
    cand, counts = plan.launch(*args._replace(span_off=c.offsets, span=c.span), items, B * n_spans * cap, cap=cap,
                               coarse_lo=floor, **kw)
    cand = cand.view(B, -1)
    top, reselect = bucket_topk(cand, c.selection.keep, slots=c.selection.slots,
                                by_rank=c.selection.by_rank)   # reselect: redo
    # a flagged query is rescored on every one of its candidates instead of its list (which is among them: one
    # copy of each doc), in the same launch as the other queries' lists, where the plan says (few candidates)
    settle_here = c.settle_in_chunk
    sampled, fused = c.sampled, plan.fused
    verdicts = coarse_verdicts if fused else torch_coarse_verdicts
    redo, rescue, flags = verdicts(top, k, cand.shape[1], counts.view(B, n_spans), cap, floor, reselect, inv, scale,
                                   indptr, sampled, not settle_here)
    docs = (candidate_docs if fused else torch_candidate_docs)(top, *((cand, rescue) if settle_here else ()))
    queries = QueryCSR(args.indptr, args.terms, args.weights)
    exact = pack(exact_scores(plan, queries, scale, inv, docs), docs, fused)   # -1: score 0
    return row_topk(exact, k), redo, None if settle_here else rescue, cand, items, flags
