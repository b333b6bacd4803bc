"""The block route's part of the search plan: every choice of a block-route search, made here once with its reason.

``plan_block`` turns a ``SearchConfig``, the index and a batch's size into a ``BlockPlan`` (what the executors
``lsr.search.block_path`` and ``lsr.search.fallbacks`` run) and the plan's printed steps: the span scorer (from the
registry ``lsr.search.scorers``), the spans, pass 1's sample, pass 2 exact or coarse with its floor and rescoring,
the selection, the fallbacks, CUDA graph or eager, and the query chunks. ``lsr.search.plan`` chooses the route and
caches the plans per index.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Hashable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from lsr.index.compact import COMPACT
from lsr.search.block_plan import BlockPlan, CoarsePlan, Selection
from lsr.search.scorers import SCORER_NAMES, SCORERS, Scorer, SpanScorer, scorer, why_not
from lsr.utils.plans import Step

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.search.config import SearchConfig
    from lsr.search.index_cache import IndexCache, RunCounts
    from lsr.sparse import SparseVectors

__all__ = ["CountedLaunch", "batch_group", "choose_scorer", "coarse_choice", "max_span", "plan_block", "terms_bound"]

ROW = 32   # docs per pass-1 row maximum (lsr.search.kernels.topk.ROW, one warp's worth)


@functools.cache
def _gpu() -> SimpleNamespace:
    """The gpu backend's modules, imported at first use: the torch backend runs without triton."""
    from lsr.search import spans
    from lsr.search.kernels import block_cuda, coarse, rescore_cuda, row_topk_cuda, topk
    from lsr.search.select import select_slots
    from lsr.utils.kernels import INTERPRET

    assert topk.ROW == ROW
    return SimpleNamespace(spans=spans, block_cuda=block_cuda, coarse=coarse, rescore_cuda=rescore_cuda,
                           row_topk_cuda=row_topk_cuda, select_slots=select_slots, interpret=INTERPRET)


class CountedLaunch:
    """A span scorer's launcher that notes each launch in its index's run counts (``IndexCache.ran``)."""

    __slots__ = ("fn", "name", "ran")

    def __init__(self, name: str, fn: SpanScorer, ran: RunCounts) -> None:
        self.name, self.fn, self.ran = name, fn, ran

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.ran.note("span scorer", self.name)
        return self.fn(*args, **kwargs)


def max_span(index: InvertedIndex) -> int:
    """The largest span the kernels can read: compact postings hold block-local ids, so spans divide the block
    (lsr.index.compact); float32 postings allow any span up to the collection rounded up to a power of two."""
    limit = _gpu().spans.span_limit(index)
    return min(index.block_size, limit) if index.postings == COMPACT else limit


def batch_group(cfg: SearchConfig, B: int) -> int:
    """Queries per work item for a batch of ``B``: ``triton.group``, at most B rounded up to a power of two."""
    return min(cfg.triton.group, 1 << (B - 1).bit_length())


def choose_scorer(cfg: SearchConfig, index: InvertedIndex, group: int) -> tuple[Scorer, int, str]:
    """(scorer, span, why) for ``cfg.scorer``: "auto" takes the first scorer of ``SCORERS`` that auto may choose
    and that can serve (``scorers.why_not``); a forced one that cannot is a RuntimeError."""
    limit = max_span(index)
    if cfg.scorer != "auto":
        sc = scorer(cfg.scorer)
        span = min(sc.span(cfg), limit)
        blocker = why_not(sc, cfg, index, span, group)
        if blocker is not None:
            raise RuntimeError(f"SearchConfig(scorer={cfg.scorer!r}) cannot run here: {blocker}; use scorer='auto' "
                               f"or another of {', '.join(SCORER_NAMES)}")
        return sc, span, "forced by config"
    passed = []
    for sc in (s for s in SCORERS if s.auto):
        span = min(sc.span(cfg), limit)
        blocker = why_not(sc, cfg, index, span, group)
        if blocker is None:
            return sc, span, "auto" + (f": {'; '.join(passed)}" if passed else "")
        passed.append(f"the {sc.name} scorer cannot run ({blocker})")
    raise RuntimeError(f"no span scorer can serve this index here: {'; '.join(passed)}")


def terms_bound(queries: SparseVectors, any_length: bool) -> int:
    """The query length the block route is planned for (its bucket picks the compiled kernel and CUDA graph). A
    scorer that needs the longest query (``Scorer.any_length`` False) costs one host sync, except for one query. One
    that reads queries of any length takes the mean length rounded up: a CUDA graph's term buffer holds B x the
    bound's bucket, enough for the whole batch, with no sync (a chunk of a split batch that holds more runs without
    a graph: ``block_path._search_chunk``). Out-of-vocabulary terms dropped later only shorten rows."""
    B = len(queries)
    if B == 1:
        return queries.nnz
    if any_length:
        return -(-queries.nnz // B)
    return int(queries.indptr.diff().max())


def coarse_choice(cfg: SearchConfig, index: InvertedIndex, sc: Scorer, span: int, group: int,
                  B: int) -> tuple[int | None, str]:
    """(the coarse pass 2's span or None, why): it runs where the scorer has the coarse modes, ``coarse.enabled``,
    the batch holds at least ``coarse.min_batch`` queries of one a work item, and a coarse span fits."""
    if not cfg.coarse.enabled:
        return None, "coarse.enabled=False"
    if sc.coarse_span is None:
        return None, f"the {sc.name} span scorer has no coarse mode"
    if B < cfg.coarse.min_batch:
        return None, f"{B} queries < coarse.min_batch: the coarse selection would cost more than it saves"
    if group != 1:
        return None, f"group {group}: the coarse modes take one query per work item"
    cspan, why_not_fit = sc.coarse_span(cfg, span, max(span, min(cfg.coarse.span, max_span(index))))
    bs = index.block_size
    if cspan is None or not (cspan % bs == 0 or bs % cspan == 0):
        return None, f"no coarse span fits (block {bs}, span {span}{', ' + why_not_fit if why_not_fit else ''})"
    return cspan, f"{B} queries >= coarse.min_batch"


def plan_block(index: InvertedIndex, cache: IndexCache, key: Hashable, B: int, k: int, cfg: SearchConfig,
               choice: tuple[Scorer, int, str], max_terms: int) -> tuple[BlockPlan, tuple[Step, ...]]:
    """The block route's plan for batches of ``B`` queries and its steps (after "route"); ``choice`` is
    ``choose_scorer``'s, ``max_terms`` the query-length bucket (``kernels.terms_bucket`` of ``terms_bound``)."""
    gpu = _gpu()
    sc, span, scorer_why = choice
    group = batch_group(cfg, B) if sc.groups else 1
    span_off = gpu.spans.span_offsets(index, span)
    n_spans = span_off.shape[1] - 1
    cspan, coarse_why = coarse_choice(cfg, index, sc, span, group, B)
    n_sample = _pass1_spans(n_spans, span, k, _coarse_sample_every(cfg, B) if cspan else cfg.pass1.sample_every)
    cap = cfg.pass2.slots_per_span or _slots_per_span(k, n_sample)
    chunk = max(group, int(cfg.pass2.candidate_budget // (n_spans * cap * 8)) // group * group)
    rows, dev = min(B, chunk), index.device
    coarse = _coarse_plan(cfg, index, k, n_sample, n_spans, cspan, span, rows) if cspan else None
    replay, graph_why = _graph_choice(cfg, sc, rows, dev)
    plan = BlockPlan(key=key, index=weakref.proxy(index), cache=cache, k=k, scorer=sc.name,
                     launch=CountedLaunch(sc.name, sc.bind(cfg, index, B), cache.ran), span=span, group=group,
                     span_off=span_off, max_terms=max_terms, n_sample=n_sample, cap=cap, coarse=coarse,
                     selection=_selection(cfg, rows, k, dev), chunk=chunk, fused=dev.type == "cuda" or gpu.interpret,
                     cuda_rescore=(dev.type == "cuda" and gpu.block_cuda.available(dev.index or 0)
                                   and index.vocab_size <= gpu.rescore_cuda.MAX_VOCAB),
                     replay=replay, graphs=cfg.graphs, caches=cfg.caches)
    steps = (Step("span scorer", f"{sc.name}, span {span} ({n_spans} spans)", scorer_why),
             Step("pass 1", f"{n_sample} of {n_spans} spans sampled" + (" on coarse sums" if coarse else ""),
                  "row maxima of 32 docs; the k-th is theta, a lower bound of the k-th score"),
             *_pass2_steps(plan, coarse_why),
             Step("fallbacks", "reselect -> overflow -> rescue -> redo",
                  "lsr.search.fallbacks" + ("" if coarse is None else "; incomplete coarse lists settled " + (
                      "inside the chunk" if coarse.settle_in_chunk else "on the host side"))),
             Step("cuda graph", "replayed" if replay else "no", graph_why),
             Step("query chunks", f"{-(-B // chunk)} of <= {chunk}", "candidate slots fit pass2.candidate_budget"))
    return plan, steps


def _coarse_sample_every(cfg: SearchConfig, B: int) -> int:
    """Pass 1's sampling on the coarse route (``coarse.sample_every``; None: sparser for mid-size batches)."""
    if cfg.coarse.sample_every is not None:
        return cfg.coarse.sample_every
    return 64 if cfg.batches.wide <= B <= cfg.coarse.sample_max_batch else 32


def _coarse_plan(cfg: SearchConfig, index: InvertedIndex, k: int, n_sample: int, n_spans: int, cspan: int,
                 span: int, rows: int) -> CoarsePlan:
    gpu, c = _gpu(), cfg.coarse
    rank = c.floor_rank or gpu.coarse.sampled_rank(k, n_sample / n_spans, c.sampled_rank_min_k)
    cap = (cfg.pass2.slots_per_span or _slots_per_span(rank, n_sample)) * cspan // span
    margin = max(c.margin_min, int(k * c.margin_share))
    offsets = gpu.spans.span_offsets(index, cspan)
    candidates = (offsets.shape[1] - 1) * cap   # coarse candidate slots of a query
    sampled = rank < k
    # a flagged list is rescored on every candidate in the chunk when they are few; not with a sampled floor: its
    # lists are long and rarely incomplete, and the rescoring would widen to every candidate
    return CoarsePlan(cspan, offsets, rank, sampled, cap, margin,
                      _selection(cfg, rows, min(k + margin, candidates), index.device),
                      rows * candidates <= c.rescue_cells and not sampled)


def _pass2_steps(plan: BlockPlan, coarse_why: str) -> list[Step]:
    coarse, exact = plan.coarse, plan.selection
    if coarse is None:
        return [Step("pass 2", f"exact, {plan.cap} slots per (query, span)", coarse_why),
                Step("selection", exact.describe(), f"the best {plan.k} of the candidate keys")]
    floor = f"floor from pass-1 key rank {coarse.floor_rank}" + (" (sampled, checked)" if coarse.sampled else "")
    rescore = "cuda" if plan.cuda_rescore else "triton csr"
    return [Step("pass 2", f"coarse 16-bit sums, span {coarse.span}, {coarse.cap} slots per (query, span)",
                 coarse_why),
            Step("coarse floor", floor, "a doc reaching theta has a coarse sum >= the floor"),
            Step("selection", coarse.selection.describe(), f"the best k + {coarse.margin} coarse keys" + (
                 ", and a redone query's best k" if exact == coarse.selection._replace(keep=exact.keep)
                 else f"; a redone query's best k: {exact.describe()}")),
            Step("rescoring", f"{rescore}: best k + {coarse.margin} coarse keys",
                 "exact float32 scores; incomplete lists rescored whole")]


def _selection(cfg: SearchConfig, rows: int, keep: int, device: torch.device) -> Selection:
    """The bucket selection of the best ``keep`` keys of ``rows`` rows: ranked by counting for few rows (or up to
    ``selection.rank_max_k`` keys where the CUDA row sort does not run), else sorted."""
    gpu, sel = _gpu(), cfg.selection
    slots = gpu.select_slots(keep, sel.slots)
    sortable = slots <= gpu.row_topk_cuda.MAX_ROW and gpu.row_topk_cuda.available(device)
    return Selection(keep, slots, rows <= sel.rank_max_b or (keep <= sel.rank_max_k and not sortable))


def _graph_choice(cfg: SearchConfig, sc: Scorer, rows: int, device: torch.device) -> tuple[bool, str]:
    g = cfg.graphs
    if not g.enabled:
        return False, "graphs.enabled=False"
    if device.type != "cuda":
        return False, f"{device.type} device"
    if not sc.graph_safe:
        return False, f"the {sc.name} span scorer syncs the host: no graph can hold it"
    if rows > g.max_batch:
        return False, f"chunks of {rows} queries > graphs.max_batch"
    when = "first" if rows <= g.capture_at_once else "second"
    return True, (f"captured at this shape's {when} search, cached per index; a chunk holding more terms than its "
                  "buffer runs eagerly")


def _pass1_spans(n_spans: int, span: int, k: int, every: int) -> int:
    """Spans of pass 1: ~1/every of them, but enough row maxima (4k) for a tight bound."""
    return min(n_spans, max(math.ceil(4 * k / (span // ROW)), math.ceil(n_spans / every)))


def _slots_per_span(k: int, n_sample: int) -> int:
    """Slots per (query, span): theta keeps ~k docs of the n_sample sampled spans, so ~k / n_sample per
    span; 3x that + 8 makes overflow (rescored, still exact) rare."""
    need = 3 * k / max(n_sample, 1) + 8
    return 1 << max(3, math.ceil(math.log2(need)))
