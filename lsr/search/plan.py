"""The search plan: every choice of how a search is carried out, made in this one module.

How a search runs (``lsr.Searcher.search`` -> this plan -> the execution modules):

1. **Backend** (``choose_backend``): ``torch`` (the reference: for each doc chunk a weighted ``embedding_bag`` sum
   in float32, then an exact top-k merged across chunks; ``lsr.search.searcher``) or ``gpu`` (the Triton / CUDA
   kernels, every score an exact fixed-point sum, ``lsr.search.kernels.fixed``; ``lsr.search.gpu_search``).
   ``auto`` takes gpu on a CUDA device where triton imports.
2. **Query batches**: the Searcher cuts the queries into batches (``SearchConfig.query_batch``); each batch is
   planned on its own (``plan_batch``), and plans are cached per index.
3. **Route** (gpu): ``block`` scores spans of docs without a dense [B, N] matrix (``lsr.search.block_path``);
   ``dense-scatter`` scatters every posting into a dense [B, N] fixed-point matrix and selects on chip
   (``kernels.scatter`` + ``kernels.topk``), which pays only on small collections with the Triton span scorer.
4. **Span scorer** (block): the CUDA kernel (shared-memory tiles, NVRTC; group 1, aligned postings, a collection of
   at least one CUDA span), else the Triton kernel; ``kernel="torch"`` runs the Triton kernel's torch twin.
5. **Pass 1**: the best doc of every 32 in ~1/``sample_every`` of the spans; the k-th best of those row maxima is
   theta, a lower bound of each query's k-th score (``bucket_theta``).
6. **Pass 2**: every span, docs >= theta into fixed slots per (query, span); exact, or on **coarse** 16-bit sums
   (CUDA kernel or twin, batches of at least ``coarse_min_batch``) followed by the exact rescoring of the best
   k + margin coarse keys (the CUDA rescoring kernel where it runs, else the Triton CSR kernel).
7. **Selection**: the k best keys of the candidates (``lsr.search.select``: bucket selection).
8. **Fallbacks** (``lsr.search.fallbacks``): reselect, overflow, rescue, redo, in that order, each keeping the
   result exact when a fast step could not be sure.
9. **CUDA graphs**: chunks of up to ``graph_max_batch`` queries on CUDA replay a captured graph of passes 1-2
   (``lsr.search.graphs``); query **chunks** keep the candidate slots within ``candidate_budget``.

``Searcher.explain(queries, k)`` and ``lsr search --explain`` print the plan (``SearchPlan.describe``) with the
reason for each choice; ``SearchConfig`` forces any of them.
"""

from __future__ import annotations

import functools
import importlib
import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from lsr.index.compact import COMPACT
from lsr.search.block_plan import BlockPlan, CoarseSpans, terms_bucket
from lsr.search.config import SearchConfig

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.sparse import SparseVectors

__all__ = ["SearchPlan", "block_plan", "cached_plan_keys", "choose_backend", "coarse_choice", "execution_plan",
           "plan_batch", "terms_bound", "torch_plan"]

_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ROW = 32   # docs per pass-1 row maximum (lsr.search.kernels.topk.ROW, one warp's worth)


@functools.cache
def _gpu() -> SimpleNamespace:
    """The gpu backend's kernel modules, imported at first use: the torch backend (and ``choose_backend``) runs
    without triton."""
    from lsr.search import spans
    from lsr.search.kernels import block, block_cuda, coarse, rescore_cuda, row_topk_cuda, topk
    from lsr.search.select import select_slots
    from lsr.utils.kernels import INTERPRET

    assert topk.ROW == ROW
    return SimpleNamespace(spans=spans, block=block, block_cuda=block_cuda, coarse=coarse, rescore_cuda=rescore_cuda,
                           row_topk_cuda=row_topk_cuda, select_slots=select_slots, interpret=INTERPRET)


@dataclass(frozen=True, eq=False)
class SearchPlan:
    """The plan of one batch: what runs, in order, and why. ``str(plan)`` is ``describe()``."""

    backend: str                                  # "torch" | "gpu"
    route: str                                    # "torch-reference" | "block" | "dense-scatter"
    n_queries: int
    k: int
    chunk: int                                    # queries per chunk (the last may hold fewer)
    steps: tuple[tuple[str, str, str], ...]       # (step, choice, why), in the order a search takes them
    kernel: str | None = None                     # block route: the span scorer ("cuda" | "triton" | "torch")
    block: BlockPlan | None = None                # block route: what its execution reads

    def describe(self) -> str:
        """A readable multi-line summary: one line per step, its choice and the reason."""
        width = max(len(step) for step, _, _ in self.steps)
        lines = [f"search plan: {self.n_queries} queries, k={self.k}"]
        lines += [f"  {step:<{width}}  {choice}" + (f"  ({why})" if why else "") for step, choice, why in self.steps]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def with_steps(self, before: tuple[tuple[str, str, str], ...]) -> SearchPlan:
        """This plan with ``before`` (the Searcher's own choices) ahead of its steps."""
        return replace(self, steps=before + self.steps)


def choose_backend(cfg: SearchConfig, device: torch.device) -> tuple[str, str]:
    """(backend, why): the gpu backend where asked (ImportError without triton) or, for "auto", on a CUDA device
    where triton imports; the torch reference otherwise."""
    if cfg.backend == "torch":
        return "torch", "forced by config"
    if cfg.backend == "auto" and device.type != "cuda":
        return "torch", f"auto: {device.type} device (the gpu backend runs on CUDA)"
    try:
        importlib.import_module("triton")
    except ImportError as e:
        if cfg.backend == "gpu":
            raise RuntimeError(f"backend='gpu' needs triton ({e}); install lsr-gpu[triton] or use backend='torch'") from e
        return "torch", f"auto: triton does not import ({e})"
    return "gpu", "forced by config" if cfg.backend == "gpu" else "auto: CUDA device, triton imports"


def torch_plan(n_queries: int, k: int, doc_chunks: int) -> SearchPlan:
    """The torch backend's plan of one batch (its route has no choices: ``Searcher`` sizes the doc chunks)."""
    steps = (("route", "torch-reference", "weighted embedding_bag sums per doc chunk in float32, deterministic"),
             ("doc chunks", str(doc_chunks), "chunk scores fit max_memory_bytes"),
             ("selection", "exact_topk", "per chunk, merged into the running top-k"))
    return SearchPlan("torch", "torch-reference", n_queries, k, n_queries, steps)


def terms_bound(queries: SparseVectors, cuda_kernel: bool) -> int:
    """The query length the block route is planned for (its bucket picks the compiled kernel and CUDA graph). The
    Triton kernel needs the longest query: free for one query, else one host sync. The CUDA kernel reads queries of
    any length; a CUDA graph's term buffer holds B x the bound's bucket, so the mean length rounded up is enough for
    the whole batch, with no sync (a chunk of a split batch that holds more runs without a graph:
    ``block_path._search_chunk``). Out-of-vocabulary terms dropped later only shorten rows: either stays a bound."""
    B = len(queries)
    if B == 1:
        return queries.nnz
    if cuda_kernel:
        return -(-queries.nnz // B)
    return int(queries.indptr.diff().max())


def plan_batch(index: InvertedIndex, queries: SparseVectors, k: int, config: SearchConfig) -> SearchPlan:
    """The gpu backend's plan of one batch of ``queries`` (printable; what ``execution_plan`` returns, with the
    reasons)."""
    route, kernel, chunk, steps, block = _lookup(index, queries, k, config)
    return SearchPlan("gpu", route, len(queries), k, chunk, steps, kernel if block else None, block)


def execution_plan(index: InvertedIndex, queries: SparseVectors, k: int,
                   config: SearchConfig) -> tuple[str, int, BlockPlan | None]:
    """(route, queries per chunk, the block route's plan or None): ``plan_batch`` without building the printable
    record, for every search."""
    route, _, chunk, _, block = _lookup(index, queries, k, config)
    return route, chunk, block


def _lookup(index: InvertedIndex, queries: SparseVectors, k: int, config: SearchConfig) -> tuple:
    """The cheap choices (span scorer, route, query-length bucket) run every time; the rest is cached per index and
    (batch size, k, config, bucket), at most ``config.plan_cache`` plans, the least recently used dropped first."""
    B = len(queries)
    cfg = config.for_batch(B)
    cfg = _resolved(cfg, min(cfg.group, 1 << (B - 1).bit_length()), cfg.span)
    # a forced dense route never asks about the CUDA kernel (the check compiles it at first use)
    kernel, span, kernel_why = _span_scorer(cfg, index) if cfg.route != "dense-scatter" else ("", 0, "")
    route, route_why = _route(cfg, index, B, kernel)
    max_terms = terms_bound(queries, kernel == "cuda") if route == "block" else 0
    key = (B, k, cfg, terms_bucket(max_terms))
    plans = _PLANS.setdefault(index, OrderedDict())
    parts = plans.get(key)
    if parts is not None:
        plans.move_to_end(key)
    else:
        parts = _plan_parts(index, B, k, cfg, route, (kernel, span, kernel_why, route_why), max_terms)
        plans[key] = parts
        while len(plans) > cfg.plan_cache:
            plans.popitem(last=False)
    chunk, steps, block_parts = parts
    return route, kernel, chunk, steps, BlockPlan(index, *block_parts) if block_parts is not None else None


def cached_plan_keys(index: InvertedIndex) -> list[tuple]:
    """The keys (batch size, k, config, query-length bucket) of the plans cached for ``index``, least recently used
    first."""
    return list(_PLANS.get(index, ()))


def block_plan(index: InvertedIndex, queries: SparseVectors, k: int, config: SearchConfig) -> BlockPlan:
    """The block route's plan for ``queries`` (the route forced to "block"; benchmarks and tests of the block route)."""
    block = execution_plan(index, queries, k, replace(config, route="block"))[2]
    assert block is not None
    return block


@functools.lru_cache(maxsize=256)
def _resolved(cfg: SearchConfig, group: int, span: int) -> SearchConfig:
    """``cfg`` with the group and span a search resolved (cached: ``dataclasses.replace`` is most of the host work of
    a cached plan lookup)."""
    return replace(cfg, group=group, span=span) if (group, span) != (cfg.group, cfg.span) else cfg


def _max_span(index: InvertedIndex) -> int:
    """The largest span the kernels can read: compact postings hold block-local ids, so spans divide the block
    (lsr.index.compact); float32 postings allow any span up to the collection rounded up to a power of two."""
    limit = _gpu().spans.span_limit(index)
    return min(index.block_size, limit) if index.postings == COMPACT else limit


def _span_scorer(cfg: SearchConfig, index: InvertedIndex) -> tuple[str, int, str]:
    """(kernel, span, why) for ``cfg.kernel``: "auto" takes the CUDA kernel where it serves, else the Triton one."""
    if cfg.kernel in ("triton", "torch"):
        return cfg.kernel, min(cfg.span, _max_span(index)), "forced by config"
    blocker = _cuda_blocker(cfg, index)
    if blocker is None:
        why = "NVRTC available, group 1, aligned postings, a collection of at least cuda_span docs"
        return "cuda", cfg.cuda_span, ("forced by config: " if cfg.kernel == "cuda" else "auto: ") + why
    if cfg.kernel == "cuda":
        raise RuntimeError(f"SearchConfig(kernel='cuda') cannot run here: {blocker}; use kernel='auto' or 'triton'")
    return "triton", min(cfg.span, _max_span(index)), f"auto: the CUDA kernel cannot run ({blocker})"


def _cuda_blocker(cfg: SearchConfig, index: InvertedIndex) -> str | None:
    """Why the CUDA span scorer cannot serve this index and config, or None when it can."""
    if cfg.group != 1:
        return f"group {cfg.group} (it takes one query per work item)"
    if min(cfg.cuda_span, _max_span(index)) != cfg.cuda_span:
        return f"fewer docs than cuda_span {cfg.cuda_span} (or compact blocks smaller)"
    if _gpu().block_cuda.usable(index.doc_ids, index.scores, cfg.cuda_span, cfg.cuda_warps):
        return None
    if index.device.type != "cuda":
        return f"{index.device.type} device"
    return "no NVRTC, or postings not 16-byte aligned, or a cuda_span outside the kernel's range"


def _route(cfg: SearchConfig, index: InvertedIndex, B: int, kernel: str) -> tuple[str, str]:
    compact = index.postings == COMPACT
    if cfg.route == "dense-scatter" and compact:
        raise ValueError("SearchConfig(route='dense-scatter') reads float32 postings; search a compact index with "
                         "route 'block', or build it with postings='float32'")
    if cfg.route != "auto":
        return cfg.route, "forced by config"
    if compact:
        return "block", "auto: compact postings (the scatter kernel reads float32 ones)"
    if kernel == "cuda":
        return "block", "auto: the CUDA span scorer runs (as fast or faster than a dense scatter at any size)"
    if index.n_docs <= cfg.scatter_max_docs and B >= cfg.scatter_min_batch:
        return "dense-scatter", (f"auto: {index.n_docs} docs <= scatter_max_docs and {B} queries >= "
                                 "scatter_min_batch on the Triton span scorer")
    return "block", "auto"


def _plan_parts(index: InvertedIndex, B: int, k: int, cfg: SearchConfig, route: str, choices: tuple,
                max_terms: int) -> tuple:
    """(chunk, steps, ``BlockPlan``'s fields after the index or None): no reference to the index, which the cache
    holds weakly."""
    kernel, span, kernel_why, route_why = choices
    steps: list[tuple[str, str, str]] = [("route", route, route_why)]
    if route == "dense-scatter":
        chunk = max(1, int(cfg.dense_budget // (index.n_docs * 12)))
        steps += [("scores", "dense [chunk, N] fixed-point scatter", "bit-identical to the block route"),
                  ("selection", "on-chip row maxima -> theta -> emission -> top-k", "overflowed rows: torch.topk"),
                  ("query chunks", f"{-(-B // chunk)} of <= {chunk}", "dense buffers fit dense_budget")]
        return chunk, tuple(steps), None
    gpu = _gpu()
    cfg = _resolved(cfg, cfg.group, span)
    span_off = gpu.spans.span_offsets(index, span)
    n_spans = span_off.shape[1] - 1
    coarse, coarse_why = coarse_choice(cfg, index, kernel, B)
    n_sample = _pass1_spans(n_spans, span, k, cfg.coarse_sample_every if coarse else cfg.sample_every)
    cap = cfg.slots_per_span or _slots_per_span(k, n_sample)
    coarse_spans = _coarse_spans(cfg, index, k, n_sample, n_spans, coarse) if coarse else None
    chunk = max(cfg.group, int(cfg.candidate_budget // (n_spans * cap * 8)) // cfg.group * cfg.group)
    dev = index.device
    fused = dev.type == "cuda" or gpu.interpret
    cuda_rescore = (dev.type == "cuda" and gpu.block_cuda.available(dev.index or 0)
                    and index.vocab_size <= gpu.rescore_cuda.MAX_VOCAB)
    steps += [("span scorer", f"{kernel}, span {span} ({n_spans} spans)", kernel_why),
              ("pass 1", f"{n_sample} of {n_spans} spans sampled" + (" on coarse sums" if coarse else ""),
               "row maxima of 32 docs; the k-th is theta, a lower bound of the k-th score")]
    steps += _pass2_steps(cfg, k, cap, coarse_spans, coarse_why, cuda_rescore)
    steps += [("selection", _selection(cfg, min(B, chunk), k, dev), "bucket selection of the candidate keys"),
              ("fallbacks", "reselect -> overflow -> rescue -> redo", "lsr.search.fallbacks"),
              ("cuda graph", *_graph_choice(cfg, min(B, chunk), dev)),
              ("query chunks", f"{-(-B // chunk)} of <= {chunk}", "candidate slots fit candidate_budget")]
    block = (cfg, kernel, _scorer(kernel, cfg, index), span_off, k, n_sample, cap, terms_bucket(max_terms),
             coarse_spans, chunk, fused, cuda_rescore)
    return chunk, tuple(steps), block


def _scorer(kernel: str, cfg: SearchConfig, index: InvertedIndex):
    gpu = _gpu()
    if kernel == "cuda":
        return functools.partial(gpu.block_cuda.cuda_block_candidates, warps=cfg.cuda_warps)
    if kernel == "torch":
        return gpu.block.torch_block_candidates
    return functools.partial(gpu.block.triton_block_candidates, rows=cfg.rows, chunk=cfg.chunk, readout=cfg.readout,
                             num_warps=cfg.num_warps, n_programs=gpu.block.default_programs(index.device, cfg.per_sm))


def coarse_choice(cfg: SearchConfig, index: InvertedIndex, kernel: str, B: int) -> tuple[int | None, str]:
    """(the coarse pass 2's span or None, why): it runs on the CUDA kernel (or its twin, ``kernel="torch"``), when
    ``cfg.coarse`` and the batch holds at least ``coarse_min_batch`` queries."""
    if not cfg.coarse:
        return None, "coarse=False"
    if kernel == "triton":
        return None, "the Triton span scorer has no coarse mode"
    if B < cfg.coarse_min_batch:
        return None, f"{B} queries < coarse_min_batch: the coarse selection would cost more than it saves"
    block_cuda = _gpu().block_cuda
    limit = _max_span(index) if kernel == "torch" else min(_max_span(index), block_cuda.MAX_COARSE_SPAN)
    cspan = max(cfg.span, min(cfg.coarse_span, limit))
    bs = index.block_size
    fits = cspan % bs == 0 or bs % cspan == 0
    if kernel == "cuda":   # pass 1 runs in coarse mode on cfg.span: its read-out rows take COARSE_ROW docs a warp too
        fits = fits and block_cuda.COARSE_ROW * cfg.cuda_warps <= cfg.span
        fits = fits and cspan <= block_cuda.max_coarse_span(cfg.cuda_warps)
    if not fits:
        return None, f"no coarse span fits (block {bs}, span {cfg.span}, {cfg.cuda_warps} warps)"
    return cspan, f"{B} queries >= coarse_min_batch"


def _coarse_spans(cfg: SearchConfig, index: InvertedIndex, k: int, n_sample: int, n_spans: int,
                  cspan: int) -> CoarseSpans:
    gpu = _gpu()
    rank = cfg.floor_rank or gpu.coarse.sampled_rank(k, n_sample / n_spans, cfg.sampled_rank_min_k)
    cap = (cfg.slots_per_span or _slots_per_span(rank, n_sample)) * cspan // cfg.span
    margin = max(cfg.coarse_margin_min, int(k * cfg.coarse_margin_share))
    return CoarseSpans(cspan, gpu.spans.span_offsets(index, cspan), rank, rank < k, cap, margin)


def _pass2_steps(cfg: SearchConfig, k: int, cap: int, coarse: CoarseSpans | None, coarse_why: str,
                 cuda_rescore: bool) -> list[tuple[str, str, str]]:
    if coarse is None:
        return [("pass 2", f"exact, {cap} slots per (query, span)", coarse_why)]
    floor = f"floor from pass-1 key rank {coarse.floor_rank}" + (" (sampled, checked)" if coarse.sampled else "")
    return [("pass 2", f"coarse 16-bit sums, span {coarse.span}, {coarse.cap} slots per (query, span)", coarse_why),
            ("coarse floor", floor, "a doc reaching theta has a coarse sum >= the floor"),
            ("rescoring", f"{'cuda' if cuda_rescore else 'triton csr'}: best k + {coarse.margin} coarse keys",
             "exact float32 scores; incomplete lists rescored whole")]


def _selection(cfg: SearchConfig, rows: int, k: int, device: torch.device) -> str:
    """The bucket selection's last step for ``rows`` x k (``kernels.bucket_select.bucket_topk`` decides the same)."""
    gpu = _gpu()
    sortable = (gpu.select_slots(k, cfg.select_slots) <= gpu.row_topk_cuda.MAX_ROW
                and gpu.row_topk_cuda.available(device))
    if rows <= cfg.rank_max_b or (k <= cfg.rank_max_k and not sortable):
        return "bucket levels + gather + rank kernel"
    return "bucket levels + gather + row sort"


def _graph_choice(cfg: SearchConfig, rows: int, device: torch.device) -> tuple[str, str]:
    if not cfg.graphs:
        return "no", "graphs=False"
    if device.type != "cuda":
        return "no", f"{device.type} device"
    if rows > cfg.graph_max_batch:
        return "no", f"chunks of {rows} queries > graph_max_batch"
    when = "first" if rows <= cfg.graph_capture_at_once else "second"
    return "replayed", f"captured at this shape's {when} search, cached per index"


def _pass1_spans(n_spans: int, span: int, k: int, every: int) -> int:
    """Spans of pass 1: ~1/every of them, but enough row maxima (4k) for a tight bound."""
    return min(n_spans, max(math.ceil(4 * k / (span // ROW)), math.ceil(n_spans / every)))


def _slots_per_span(k: int, n_sample: int) -> int:
    """Slots per (query, span): theta keeps ~k docs of the n_sample sampled spans, so ~k / n_sample per
    span; 3x that + 8 makes overflow (rescored, still exact) rare."""
    need = 3 * k / max(n_sample, 1) + 8
    return 1 << max(3, math.ceil(math.log2(need)))
