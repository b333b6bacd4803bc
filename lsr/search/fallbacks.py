"""The fallback chain of the block route: how a chunk stays exact when a fast step could not be sure.

The passes (``lsr.search.block_path``) bet on the common case: fixed slots per (query, span), a bounded gather in
the bucket selection, a list of the best k + margin coarse keys. Each bet is checked, and a query (or a span of
one) that lost it is repaired. The repairs apply in this order, each after the passes of the whole chunk:

0. **In the chunk** (no host step, so a CUDA graph holds it): the coarse pass 2 checks every list
   (``kernels.coarse_checks.coarse_verdicts``). A list that fails only the completeness test (many docs tied at
   the k-th coarse sum) still has every doc that can reach theta among its candidates; when the chunk's
   candidates are few (B x C <= ``rescue_cells``) all of them are rescored right there.
1. **settle**: one host read of the chunk's four flags (the only sync of a chunk). Nothing set: done.
2. **reselect**: rows whose bucket selection overflowed its gather slots (thousands of keys tied near the
   k-th) are selected again with ``row_topk`` over all their candidates.
3. **overflow**: (query, span) pairs of the exact pass 2 whose slots overflowed held only their first docs;
   each is scored whole and its docs >= theta merged into the query's row.
4. **rescue**: the coarse queries the chunk could not settle in step 0 (too many candidates for one launch) are
   rescored on all their coarse candidates.
5. **redo**: coarse queries whose slots or selection overflowed, or that had no usable theta, or whose sampled
   floor failed its check, take the exact pass 2 (the coarse route's last resort; it has steps 2-3 of its own).

Every step computes exact fixed-point scores, so the result is the same bits whichever steps ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from lsr.search.block_plan import BlockPlan, ChunkResult, QueryCSR, Repairs, Settled
from lsr.search.kernels import rescore_cuda
from lsr.search.kernels.csr import dense_queries, triton_csr_scores
from lsr.search.select import pack, row_topk, unpack

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex

__all__ = ["exact_scores", "repair", "settle"]

ExactPass = Callable[[BlockPlan, QueryCSR], ChunkResult]


def settle(plan: BlockPlan, result: ChunkResult, replayed: bool) -> Settled:
    """Steps 1-3, and the queries steps 4-5 need. A graph's outputs are overwritten by its next replay
    (``replayed``), so what is returned from them is a copy; the copy of the unpacked result is queued before the
    flag read, so that it runs right behind the graph rather than after the host has woken up (it goes unused when
    something is repaired)."""
    unpacked = tuple(t.clone() for t in result.unpacked) if replayed else result.unpacked
    any_over, any_reselect, any_redo, any_rescue = result.flags.tolist()
    if not (any_over or any_reselect or any_redo or any_rescue):
        return Settled(result.best, None, None, unpacked)
    best = result.best.clone()
    n_reselect = n_over = 0
    if any_reselect:
        rows = torch.nonzero(result.reselect).flatten()
        best[rows] = row_topk(result.cand[rows], plan.k)
        n_reselect = rows.numel()
    if any_over:
        over = torch.nonzero(result.overflow)
        best = _rescore_overflow(plan, result._replace(best=best), over)
        n_over = over.shape[0]
    redo = torch.nonzero(result.redo).flatten() if any_redo else None
    rescue = None
    if any_rescue:
        sel = torch.nonzero(result.rescue).flatten()
        rescue = (sel, result.cand[sel], result.args.scale[sel], result.args.inv_scale[sel])
    return Settled(best, redo, rescue, None, n_reselect, n_over)


def repair(plan: BlockPlan, queries: QueryCSR, settled: Settled, exact_pass: ExactPass,
           trace: list[Repairs] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 4-5 on a settled chunk: (scores [B, k], doc_idx [B, k]). ``exact_pass`` runs both passes of a plan on
    some queries (``block_path``'s chunk body); ``trace``, when given, gets what was repaired."""
    if trace is not None:
        trace.append(Repairs(settled.reselected, settled.overflowed,
                             0 if settled.rescue is None else settled.rescue[0].numel(), settled.redo))
    if settled.unpacked is not None:
        return settled.unpacked
    best = settled.best
    if settled.rescue is not None:
        sel, cand, scale, inv = settled.rescue
        best[sel] = _rescore_candidates(plan, queries.select(sel), cand, scale, inv)
    if settled.redo is not None:
        sel = settled.redo
        exact = plan.without_coarse()
        best[sel] = settle(exact, exact_pass(exact, queries.select(sel)), False).best
    return unpack(best, plan.fused)


def exact_scores(plan: BlockPlan, queries: QueryCSR, scale: torch.Tensor, inv_scale: torch.Tensor,
                 docs: torch.Tensor) -> torch.Tensor:
    """Exact float32 scores of candidate docs [B, C] (-1 = none: 0.0), free of host syncs (the CUDA rescoring
    kernel where the plan says, else the Triton CSR kernel; the same bits)."""
    index: InvertedIndex = plan.index
    qd = dense_queries(*queries, index.vocab_size)
    csr = index.docs
    plan.cache.ran.note("rescoring", "cuda" if plan.cuda_rescore else "triton csr")
    if plan.cuda_rescore:
        return rescore_cuda.cuda_rescore(csr.indptr, csr.indices, csr.values, qd, scale, inv_scale, docs,
                                         queries.indptr, queries.terms)
    return triton_csr_scores(csr.indptr, csr.indices, csr.values, qd, scale, inv_scale, docs)


def _rescore_candidates(plan: BlockPlan, queries: QueryCSR, cand: torch.Tensor, scale: torch.Tensor,
                        inv: torch.Tensor) -> torch.Tensor:
    """Best keys [n, k] of queries from the exact scores of all their coarse candidates [n, C] (``scale`` /
    ``inv`` [n]: the queries' fixed-point scales, as the chunk computed them)."""
    docs = unpack(cand, plan.fused)[1]   # one launch where fused: this runs on the host side, launch by launch
    return row_topk(pack(exact_scores(plan, queries, scale, inv, docs), docs, plan.fused), plan.k)


def _rescore_overflow(plan: BlockPlan, result: ChunkResult, over: torch.Tensor) -> torch.Tensor:
    """Score every overflowed (query, span) pair ``over`` [n, 2] whole and merge its docs >= theta."""
    span, k, best = result.args.span, plan.k, result.best
    n_fix = over.shape[0]
    items = (over[:, 0].to(torch.int32).contiguous(), over[:, 1].to(torch.int32).contiguous(),
             torch.arange(n_fix, device=over.device, dtype=torch.int64) * span, span)
    keys, _ = plan.launch(*result.args, items, n_fix * span, theta=result.theta, cap=span, group=1)
    keys = row_topk(keys.view(n_fix, span), min(k, span))
    # append every fixed pair's keys to its query's row, then take the top k again
    q = over[:, 0]
    rank = torch.arange(n_fix, device=q.device) - torch.searchsorted(q, q)   # pairs come sorted by query
    extra = torch.full((best.shape[0], int(rank.max()) + 1, keys.shape[1]), -1, dtype=torch.int64,
                       device=q.device)
    extra[q, rank] = keys
    return row_topk(torch.cat([best, extra.view(best.shape[0], -1)], 1), k)
