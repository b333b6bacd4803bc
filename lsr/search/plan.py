"""The search plan: every choice of how a search is carried out, made before anything runs; executors only read it.

How a search runs (``lsr.Searcher.search`` -> this plan -> the execution modules):

1. **Backend** (``choose_backend``): ``torch`` (the reference: for each doc chunk a weighted ``embedding_bag`` sum
   in float32, then an exact top-k merged across chunks; ``lsr.search.searcher``) or ``gpu`` (the Triton / CUDA
   kernels, every score an exact fixed-point sum, ``lsr.search.kernels.fixed``; ``lsr.search.gpu_search``).
   ``auto`` takes gpu on a CUDA device where triton imports.
2. **Query batches** (``query_batch``): the Searcher cuts the queries into batches; each batch is planned on its own
   (``plan_search``; the torch backend's ``torch_plan``), and the gpu backend's plans are cached per index
   (``lsr.search.index_cache``).
3. **Route** (gpu): ``block`` scores spans of docs without a dense [B, N] matrix (``lsr.search.block_path``);
   ``dense-scatter`` scatters every posting into a dense [B, N] fixed-point matrix and selects on chip
   (``kernels.scatter`` + ``kernels.topk``), which pays only on small collections with the Triton span scorer.
4. **Span scorer** (block): the first scorer of the registry ``lsr.search.scorers`` that can serve (the CUDA kernel,
   else the Triton one); ``scorer="torch"`` runs their torch twin. Each scorer declares its abilities there.
5. **Pass 1**: a sample of the spans gives theta, a lower bound of each query's k-th score.
6. **Pass 2**: every span emits its docs >= theta into fixed slots (exact), or both passes run on 16-bit coarse
   sums (scorers with coarse modes, batches of at least ``coarse.min_batch``) followed by the exact rescoring of the
   best k + margin coarse keys (the CUDA rescoring kernel where it runs, else the Triton CSR kernel).
7. **Selection**: the k best keys of the candidates (``lsr.search.select``: bucket selection, ranked or sorted).
8. **Fallbacks** (``lsr.search.fallbacks``): reselect, overflow, rescue, redo, in that order, each keeping the
   result exact when a fast step could not be sure.
9. **CUDA graphs**: chunks of up to ``graphs.max_batch`` queries on CUDA replay a captured graph of passes 1-2
   (``lsr.search.graphs``); query **chunks** keep the candidate slots within ``pass2.candidate_budget``.

Steps 4-9 are ``lsr.search.block_planner``'s. ``Searcher.explain(queries, k)`` and ``lsr search --explain`` print
the plan (``SearchPlan.describe``) with the reason for each choice; ``SearchConfig`` forces any of them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from lsr.index.compact import COMPACT
from lsr.search.block_plan import BlockPlan
from lsr.search.config import SearchConfig
from lsr.search.index_cache import index_cache
from lsr.search.kernels import terms_bucket
from lsr.utils.plans import Plan, Step

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.search.scorers import Scorer
    from lsr.sparse import SparseVectors

__all__ = ["SearchPlan", "choose_backend", "plan_search", "query_batch", "torch_plan"]


@dataclass(frozen=True, eq=False)
class SearchPlan(Plan):
    """The plan of one batch: what runs, in order, and why. ``str(plan)`` is ``describe()``."""

    backend: str                       # "torch" | "gpu"
    route: str                         # "torch-reference" | "block" | "dense-scatter"
    n_queries: int
    k: int
    chunk: int                         # queries per chunk (the last may hold fewer)
    steps: tuple[Step, ...]            # in the order a search takes them
    scorer: str | None = None          # block route: the span scorer (``lsr.search.scorers``)
    block: BlockPlan | None = None     # block route: what its execution reads
    doc_chunks: tuple[tuple[int, int, int, int], ...] = ()   # torch route: (row0, row1, nnz0, nnz1) per doc chunk

    def title(self) -> str:
        return f"search plan: {self.n_queries} queries, k={self.k}"

    def plan_steps(self) -> tuple[Step, ...]:
        return self.steps

    def with_steps(self, before: tuple[Step, ...]) -> SearchPlan:
        """This plan with ``before`` (the Searcher's own choices) ahead of its steps."""
        return replace(self, steps=before + self.steps)


def choose_backend(cfg: SearchConfig, device: torch.device) -> tuple[str, str]:
    """(backend, why) for ``cfg.backend`` on ``device``; "gpu" needs triton (CUDA, or TRITON_INTERPRET=1)."""
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


def query_batch(cfg: SearchConfig, backend: str, n_queries: int, vocab_size: int, memory: int,
                given: int | None = None) -> tuple[int, str]:
    """(queries per batch, why): ``given`` (a ``search`` argument), else ``batches.size``, else the backend's:
    ``batches.gpu``, or on the torch backend the most whose dense [V, b] block and its [b, V] source take at
    most a quarter of ``memory``, at most ``batches.torch``."""
    qb = given if given is not None else cfg.batches.size
    if qb is not None:
        if isinstance(qb, bool) or int(qb) <= 0:
            raise ValueError(f"query_batch must be a positive integer, got {qb!r}")
        return int(qb), "query_batch" if given is not None else "batches.size"
    if backend == "gpu":
        return max(1, min(n_queries, cfg.batches.gpu)), "batches.gpu"
    per_query = 8 * max(vocab_size, 1)
    return (max(1, min(n_queries, cfg.batches.torch, memory // (4 * per_query))),
            "dense query blocks fit a quarter of batches.memory, at most batches.torch")


def torch_plan(n_queries: int, k: int, doc_chunks: list[tuple[int, int, int, int]]) -> SearchPlan:
    """The torch backend's plan of one batch: its doc chunks (``Searcher`` sizes them to its memory budget)."""
    steps = (Step("route", "torch-reference", "weighted embedding_bag sums per doc chunk in float32, deterministic"),
             Step("doc chunks", str(len(doc_chunks)), "chunk scores fit batches.memory"),
             Step("selection", "exact_topk", "per chunk, merged into the running top-k"))
    return SearchPlan("torch", "torch-reference", n_queries, k, n_queries, steps, doc_chunks=tuple(doc_chunks))


def plan_search(index: InvertedIndex, queries: SparseVectors, k: int, config: SearchConfig) -> SearchPlan:
    """The gpu backend's plan of one batch of ``queries``: what ``gpu_search`` runs, with the reasons.

    The cheap choices (span scorer, route, query-length bucket) run every time; the rest is cached in the index's
    cache per (batch size, k, config, bucket), at most ``caches.plans`` plans, the least recently used dropped
    first."""
    from lsr.search.block_planner import batch_group, choose_scorer, plan_block, terms_bound

    B = len(queries)
    # a forced dense route never asks about the CUDA scorer (its check compiles it at first use)
    choice = choose_scorer(config, index, batch_group(config, B)) if config.route != "dense-scatter" else None
    route, route_why = _route(config, index, B, choice[0] if choice else None)
    # the plan (cached per bucket) holds the bucket, not this batch's bound: a later batch of the bucket may hold
    # longer queries, and a CUDA graph's term buffer must take them (B x the bucket)
    bucket = terms_bucket(terms_bound(queries, choice[0].any_length) if route == "block" and choice else 0)
    key = (B, k, config, bucket)
    cache = index_cache(index)

    def make() -> SearchPlan:
        head = (Step("route", route, route_why),)
        if route == "dense-scatter":
            return _dense_plan(index, B, k, config, head)
        assert choice is not None
        block, steps = plan_block(index, cache, key, B, k, config, choice, bucket)
        return SearchPlan("gpu", "block", B, k, block.chunk, head + steps, block.scorer, block)

    return cache.plan(key, make, config.caches.plans)


def _dense_plan(index: InvertedIndex, B: int, k: int, cfg: SearchConfig, head: tuple[Step, ...]) -> SearchPlan:
    chunk = max(1, int(cfg.dense.budget // (index.n_docs * 12)))
    steps = (Step("scores", "dense [chunk, N] fixed-point scatter", "bit-identical to the block route"),
             Step("selection", "on-chip row maxima -> theta -> emission -> top-k", "overflowed rows: torch.topk"),
             Step("query chunks", f"{-(-B // chunk)} of <= {chunk}", "dense buffers fit dense.budget"))
    return SearchPlan("gpu", "dense-scatter", B, k, chunk, head + steps)


def _route(cfg: SearchConfig, index: InvertedIndex, B: int, sc: Scorer | None) -> tuple[str, str]:
    compact = index.postings == COMPACT
    if cfg.route == "dense-scatter" and compact:
        raise ValueError("SearchConfig(route='dense-scatter') reads float32 postings; search a compact index with "
                         "route 'block', or build it with postings='float32'")
    if cfg.route != "auto":
        return cfg.route, "forced by config"
    assert sc is not None
    if compact:
        return "block", "auto: compact postings (the scatter kernel reads float32 ones)"
    if sc.beats_scatter:
        return "block", f"auto: the {sc.name} span scorer runs (as fast or faster than a dense scatter at any size)"
    if index.n_docs <= cfg.dense.max_docs and B >= cfg.dense.min_batch:
        return "dense-scatter", (f"auto: {index.n_docs} docs <= dense.max_docs and {B} queries >= "
                                 f"dense.min_batch on the {sc.name} span scorer")
    return "block", "auto"
