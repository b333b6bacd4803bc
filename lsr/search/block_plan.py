"""The records of the block route (``lsr.search.block_path``): what its helpers pass around.

``BlockPlan`` (built by ``lsr.search.block_planner``) holds what every query chunk of one search runs, with
``CoarsePlan`` and ``Selection`` for its passes; ``ScoreArgs``,
``ChunkResult`` and ``Settled`` are the stages of one chunk; ``Repairs`` is what the fallback chain
(``lsr.search.fallbacks``) did to a chunk, for a caller that asks (``trace``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import torch

from lsr.utils.ragged import ragged_positions

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.search.config import CacheTuning, GraphTuning
    from lsr.search.index_cache import IndexCache
    from lsr.search.scorers import SpanScorer

__all__ = ["BlockPlan", "ChunkResult", "CoarsePlan", "QueryCSR", "Repairs", "ScoreArgs", "Selection", "Settled"]

class QueryCSR(NamedTuple):
    """Queries as CSR on the index's device: int64 [B+1], int32 [nnz], float32 [nnz].

    ``terms`` / ``weights`` may run past ``indptr[-1]`` (a CUDA graph's fixed buffers): only rows read them.
    """

    indptr: torch.Tensor
    terms: torch.Tensor
    weights: torch.Tensor

    def select(self, sel: torch.Tensor) -> QueryCSR:
        """The queries ``sel`` (int64 indices), in that order."""
        lens = self.indptr.diff()[sel]
        ip = torch.zeros(sel.numel() + 1, dtype=torch.int64, device=sel.device)
        torch.cumsum(lens, 0, out=ip[1:])
        _, src = ragged_positions(self.indptr[sel], lens)
        return QueryCSR(ip, self.terms[src].contiguous(), self.weights[src].contiguous())


class Selection(NamedTuple):
    """The plan's bucket selection of the best keys of candidate rows (``lsr.search.kernels.bucket_select``)."""

    keep: int          # keys kept a row (k, or k + margin on the coarse route)
    slots: int         # gather slots a row
    by_rank: bool      # the gathered keys ranked by counting (few rows), else sorted (``row_topk``)

    def describe(self) -> str:
        return f"bucket levels + gather + {'rank kernel' if self.by_rank else 'row sort'}, {self.slots} slots"


@dataclass(frozen=True)
class CoarsePlan:
    """The coarse passes' plan: pass 2's span and span offsets, the pass-1 key rank behind the floor (``sampled``:
    below k, so not a proven bound and checked), pass 2's slots per (query, span), the keys kept beyond k and how
    they are selected, and whether incomplete lists are settled inside the chunk."""

    span: int
    offsets: torch.Tensor
    floor_rank: int
    sampled: bool
    cap: int
    margin: int
    selection: Selection     # the best k + margin coarse keys of a row's candidates
    settle_in_chunk: bool    # rescore every candidate of an incomplete list in the chunk (no host step)


@dataclass(frozen=True, eq=False)
class BlockPlan:
    """What every query chunk of one block-route search runs: each choice made once (``lsr.search.block_planner``)
    and only read by ``lsr.search.block_path`` and ``lsr.search.fallbacks``."""

    key: Hashable              # the plan's key in its index's cache; with a chunk's size, its CUDA graph's key
    index: InvertedIndex       # a weak proxy: the plan is cached with the index, which it must not keep alive
    cache: IndexCache          # the index's work items, graphs and counts of what ran
    k: int
    scorer: str                # the span scorer (``lsr.search.scorers``)
    launch: SpanScorer         # its launcher with its tuning bound (each call counted in ``cache.ran``)
    span: int                  # docs per work item of pass 1 and the exact pass 2
    group: int                 # queries per work item
    span_off: torch.Tensor     # int64 [V, n_spans + 1] span offsets for ``span``
    max_terms: int             # query-length bucket (``kernels.terms_bucket`` of ``block_planner.terms_bound``): one compile and one CUDA
                               # graph per bucket; a graph's term buffer holds n_queries x it
    n_sample: int              # spans scored by pass 1
    cap: int                   # candidate slots per (query, span) in the exact pass 2
    coarse: CoarsePlan | None  # the coarse passes (pass 1 on coarse sums too), where they run
    selection: Selection       # the exact pass 2's selection of the best k
    chunk: int                 # queries per chunk: the candidate slots of a chunk fit pass2.candidate_budget
    fused: bool                # the bookkeeping runs as Triton kernels (CUDA, or the interpreter), not torch twins
    cuda_rescore: bool         # exact rescoring with the CUDA kernel (kernels.rescore_cuda), else the Triton CSR one
    replay: bool               # chunks replay CUDA graphs (``graphs`` bounds their cache), else run eagerly
    graphs: GraphTuning
    caches: CacheTuning        # the work-items caches' bounds

    @property
    def n_spans(self) -> int:
        return self.span_off.shape[1] - 1

    def graph_key(self, n_queries: int) -> tuple:
        """A chunk's graph: everything its body runs follows from the plan's key and the chunk's size."""
        return (n_queries, self.key)

    def without_coarse(self) -> BlockPlan:
        """This plan with the exact pass 2 (the last fallback of a coarse query, ``lsr.search.fallbacks``)."""
        return replace(self, coarse=None, key=(self.key, "exact"))


class ScoreArgs(NamedTuple):
    """The span scorer's leading arguments for one chunk of queries."""

    doc_ids: torch.Tensor
    scores: torch.Tensor
    span_off: torch.Tensor
    indptr: torch.Tensor
    terms: torch.Tensor
    weights: torch.Tensor
    scale: torch.Tensor
    inv_scale: torch.Tensor
    span: int


class ChunkResult(NamedTuple):
    """Both passes of one chunk, before the fallback chain (``lsr.search.fallbacks``)."""

    best: torch.Tensor                 # int64 [B, k] best keys, overflowed (query, span) pairs left out
    overflow: torch.Tensor | None      # bool [B, n_spans] pairs whose slots overflowed (exact pass 2)
    theta: torch.Tensor                # float32 [B] pass 1's theta (a lower bound of the k-th score on the exact
                                       # route; on the coarse route it may be above it: _coarse_pass2 checks)
    args: ScoreArgs
    redo: torch.Tensor | None          # bool [B] queries the coarse pass could not settle (exact pass 2)
    rescue: torch.Tensor | None        # bool [B] queries to settle by rescoring all their coarse candidates
                                       # (None: none, or done inside the chunk)
    cand: torch.Tensor                 # int64 [B, C] the candidate keys best was selected from (-1 = none)
    reselect: torch.Tensor | None      # bool [B] exact pass 2: rows whose bucket selection overflowed
    flags: torch.Tensor                # bool or int32 [4]: any overflow / reselect / redo / rescue (one host read)
    unpacked: tuple[torch.Tensor, torch.Tensor]  # unpack_keys(best): the answer when no flag is set
    items: tuple                       # the cached work items the passes read: a captured graph keeps them
                                       # alive through its outputs after ``span_work_items`` drops them


class Settled(NamedTuple):
    """A chunk after ``fallbacks.settle``: copies that outlive the next graph replay."""

    best: torch.Tensor                 # int64 [B, k]; with ``unpacked``: the chunk's own (a graph's: no copy)
    redo: torch.Tensor | None          # int64 [n] queries for the exact pass 2, None if none
    rescue: tuple[torch.Tensor, ...] | None  # (int64 [n] queries, their coarse candidates [n, C], scale, inv_scale)
    unpacked: tuple[torch.Tensor, torch.Tensor] | None = None   # (scores, doc_idx) when nothing was repaired
    reselected: int = 0                # rows selected again
    overflowed: int = 0                # (query, span) pairs rescored whole


class Repairs(NamedTuple):
    """What the fallback chain did to one chunk (``lsr.search.fallbacks``), as query / pair counts: rows selected again
    (``reselect``), (query, span) pairs rescored whole (``overflow``), queries settled from all their coarse candidates
    on the host side (``rescue``) and queries that took the exact pass 2 (``redo``: int64 [n] chunk rows, or None)."""

    reselect: int
    overflow: int
    rescue: int
    redo: torch.Tensor | None
