"""``SearchConfig``: every knob of a search in one frozen object.

A ``Searcher`` takes one (``Searcher(index, config=SearchConfig(...))``); ``lsr.search.plan`` reads it, with the
index and the batch of queries, to build the plan a search follows. The defaults are the tuned behaviour
(the sweeps behind them: docs/performance/search.md). A field left at ``None`` is
chosen per search (by batch size or backend), as its comment says; any value set here is used as given, which is
how tests and benchmarks force a route, a kernel or a repair.

Facts of a kernel's layout (warp sizes, tile widths, the shared memory a CUDA kernel is compiled for) stay beside
their kernels in ``lsr.search.kernels``; everything that tunes behaviour is here.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["BACKENDS", "KERNELS", "ROUTES", "SearchConfig"]

BACKENDS = ("auto", "torch", "gpu")
ROUTES = ("auto", "block", "dense-scatter")
KERNELS = ("auto", "cuda", "triton", "torch")


@dataclass(frozen=True)
class SearchConfig:
    """How to search: backend, route, kernels and their tuning (module docstring).

    Backends: ``"torch"`` (the reference: a weighted gather-sum per document chunk, any device), ``"gpu"`` (the
    Triton / CUDA kernels, exact in fixed point; CUDA, or the CPU under TRITON_INTERPRET=1), ``"auto"`` (gpu on a
    CUDA device where triton imports, else torch). Routes of the gpu backend: ``"block"`` (span scorers, no dense
    score matrix: the route at scale), ``"dense-scatter"`` (a dense [B, N] fixed-point scatter and an on-chip
    top-k: small collections). Kernels of the block route's span scorer: ``"cuda"`` (shared-memory tiles, NVRTC),
    ``"triton"``, ``"torch"`` (the Triton kernel's torch twin: slow, for tests; it also runs the coarse pass).
    """

    # --------------------------------------------------------------- what runs
    backend: str = "auto"
    route: str = "auto"
    kernel: str = "auto"
    # --------------------------------------------------------------- query batches and memory
    query_batch: int | None = None       # queries per batch (None: gpu_query_batch on the gpu backend; the torch
                                         # backend's memory bound, at most torch_query_batch)
    gpu_query_batch: int = 512           # the gpu backend's working set is ~0.64 GiB at 500 queries and its
                                         # throughput grows with the batch up to there
    torch_query_batch: int = 256
    max_memory_bytes: int | None = None  # torch backend working memory (None: 1 GiB on CPU, min(8 GiB, free / 4))
    # --------------------------------------------------------------- block route: the Triton span scorer
    span: int = 2048                     # docs per work item (a power of two dividing or multiple of the block)
    group: int = 1                       # queries per work item
    rows: int | None = None              # chunks per step (None: 32 from wide_batch queries on, else 8)
    chunk: int = 32                      # postings per chunk: a step's posting tile is [rows, chunk]
    readout: int = 1024                  # cells per read-out tile (CPU only: on CUDA one 32-doc row)
    per_sm: int | None = None            # resident programs per SM (None: 2 from wide_batch queries on, else 8)
    num_warps: int | None = None         # (None: 8 from wide_batch queries on, else 4)
    wide_batch: int = 16                 # batches from this size take wide steps with fewer, larger programs;
                                         # smaller ones more items in flight
    # --------------------------------------------------------------- block route: the CUDA span scorer
    cuda_span: int = 8192                # docs per work item (one shared-memory tile per CTA)
    cuda_warps: int = 16                 # warps per CTA
    # --------------------------------------------------------------- pass 1 (theta from sampled spans)
    sample_every: int = 16               # pass 1 scores ~1/sample_every of the spans (at least 4k row maxima)
    coarse_sample_every: int | None = None   # the same on the coarse route (None: 64 for batches of wide_batch to
                                         # sparse_sample_max_batch queries, 32 otherwise: larger batches pay more
                                         # for a looser floor's extra candidates than the pass saves)
    sparse_sample_max_batch: int = 128
    slots_per_span: int | None = None    # pass-2 candidate slots per (query, span) (None: 3k / sampled spans + 8,
                                         # as a power of two >= 8; fewer force the overflow repair)
    # --------------------------------------------------------------- pass 2 on coarse sums (CUDA kernel, twin)
    coarse: bool = True                  # both passes on 16-bit coarse sums, then the exact rescoring of the best
                                         # k + margin coarse keys
    coarse_span: int = 32768             # coarse pass 2: docs per work item (2 bytes of shared memory each)
    coarse_min_batch: int = 17           # smaller batches take the exact pass 2: for them the selection of the best
                                         # k + margin coarse keys costs more than the coarse sums save
    coarse_margin_min: int = 128         # coarse keys kept beyond k: max(coarse_margin_min, k * share). The list is
    coarse_margin_share: float = 0.5     # complete when its last coarse sum lies a query's term count below the
                                         # k-th (~1.5% of the score with 16-bit sums); a margin of k / 8 left many
                                         # queries to the rescue (docs/performance/search.md)
    sampled_rank_min_k: int = 256        # from this k on the coarse floor comes from a sampled pass-1 key above
                                         # the k-th (lsr.search.kernels.coarse.sampled_rank), checked afterwards
    floor_rank: int | None = None        # the pass-1 key rank behind the coarse floor (None: sampled_rank)
    rescue_cells: int = 1 << 21          # coarse candidates (B x C) up to which incomplete lists are settled
                                         # inside the chunk (no host step), else on the host side
    candidate_budget: int = 1 << 30      # bytes of candidate slots per block-route query chunk
    # --------------------------------------------------------------- bucket selection of key rows
    select_slots: int | None = None      # gather slots per row (None: next_power_of_2(2k + 1024)); rows with more
                                         # keys near the k-th are selected again with torch.topk
    rank_max_b: int = 16                 # rows up to which the gathered keys are ranked by counting (~k^2
    rank_max_k: int = 512                # compares); more rows sort them, except up to rank_max_k where the CUDA
                                         # sort is not available
    # --------------------------------------------------------------- dense routes
    dense_budget: int = 1 << 30          # bytes of dense [B_chunk, N] buffers (query chunks fit it)
    scatter_max_docs: int = 1 << 18      # auto: dense-scatter up to this many docs for batches of at least
    scatter_min_batch: int = 65          # scatter_min_batch queries on the Triton span scorer
    # --------------------------------------------------------------- CUDA graphs of the block route
    graphs: bool = True                  # replay a captured graph for batches <= graph_max_batch
    graph_max_batch: int = 512
    graph_capture_at_once: int = 64      # batches up to this size are captured at their first search, larger
                                         # ones at their second (a one-off shape never pays a capture)
    graph_cache: int = 32                # graphs kept per index (a server's warm-up captures up to 20)
    graph_bytes: int = 1 << 29           # GPU memory the kept graphs of an index hold at most (the newest stays)
    graph_shapes_seen: int = 64          # large-batch shapes remembered per index until their second search
    graph_shared_pool: bool = True       # the graphs of an index share one memory pool and one lock
    # --------------------------------------------------------------- host-side caches
    plan_cache: int = 64                 # plans kept per index, the least recently used dropped first
    items_cache_max_batch: int = 64      # batches whose work items are cached per shape (items_cache_small shapes)
    items_cache_small: int = 64
    items_cache_large: int = 8           # larger batches (up to graph_max_batch): this many item sets
    items_cache_large_bytes: int = 1 << 23   # ... of at most this many bytes each

    def __post_init__(self) -> None:
        for name, allowed in (("backend", BACKENDS), ("route", ROUTES), ("kernel", KERNELS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"SearchConfig.{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _NON_NEGATIVE:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
                if not ok:
                    raise ValueError(f"SearchConfig.{f.name} must be a number >= 0, got {value!r}")
            elif isinstance(value, bool) or f.name in _FLAGS:
                if not isinstance(value, bool):
                    raise ValueError(f"SearchConfig.{f.name} must be True or False, got {value!r}")
            elif f.name not in _NAMES and value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"SearchConfig.{f.name} must be a positive integer or None, got {value!r}")
        # a config is a cache key of every search (plans, graphs): hash its ~50 fields once
        object.__setattr__(self, "_hash", hash(dataclasses.astuple(self)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def replace(self, **changes: Any) -> SearchConfig:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def for_batch(self, n_queries: int) -> SearchConfig:
        """This config with the batch-dependent fields left at None chosen for ``n_queries`` queries."""
        return _for_batch(self, n_queries >= self.wide_batch,
                          self.wide_batch <= n_queries <= self.sparse_sample_max_batch)


_NAMES = {"backend", "route", "kernel"}
_FLAGS = {"coarse", "graphs", "graph_shared_pool"}
_NON_NEGATIVE = {"coarse_margin_min", "coarse_margin_share", "rescue_cells", "plan_cache", "graph_cache",
                 "graph_bytes", "graph_capture_at_once", "graph_shapes_seen", "items_cache_max_batch",
                 "items_cache_small", "items_cache_large", "items_cache_large_bytes", "rank_max_b", "rank_max_k",
                 "graph_max_batch", "candidate_budget"}


@functools.lru_cache(maxsize=256)
def _for_batch(cfg: SearchConfig, wide: bool, sparse_sample: bool) -> SearchConfig:
    """Cached: ``dataclasses.replace`` costs more than the rest of a cached plan lookup."""
    fill = {"rows": 32 if wide else 8, "num_warps": 8 if wide else 4, "per_sm": 2 if wide else 8,
            "coarse_sample_every": 64 if sparse_sample else 32}
    changes = {name: value for name, value in fill.items() if getattr(cfg, name) is None}
    return dataclasses.replace(cfg, **changes) if changes else cfg
