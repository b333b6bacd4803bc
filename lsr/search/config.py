"""``SearchConfig``: every knob of a search in one frozen object, grouped by the plan step that reads it.

A ``Searcher`` takes one (``Searcher(index, config=SearchConfig(...))``); ``lsr.search.plan`` reads it, with the index
and the batch of queries, to build the plan a search follows. It is also the ``search:`` section of an ``lsr run``
config and what ``lsr search --set search.<key>=<value>`` changes: ``search.route``, ``search.scorer``,
``search.triton.span``, ``search.coarse.enabled`` ... (each key below, with its default).

The defaults are the tuned behaviour (the sweeps behind them: docs/performance/search.md). A field left at ``None``
is chosen per search (by batch size or backend), as its docstring says; any value set is used as given, which is how
tests and benchmarks force a route, a scorer or a repair. In Python a group may be given as a mapping of its keys:
``SearchConfig(route="block", triton={"span": 64})``, ``cfg.replace(coarse={"min_batch": 1})``.

Facts of a kernel's layout (warp sizes, tile widths, the shared memory a CUDA kernel is compiled for) stay beside
their kernels in ``lsr.search.kernels``; everything that tunes behaviour is here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lsr.search.scorers import SCORER_NAMES
from lsr.utils.ranges import NumberRange
from lsr.utils.schema import at_least, check_fields, choice, within

__all__ = ["BACKENDS", "ROUTES", "SCORER_CHOICES", "BatchTuning", "CacheTuning", "CoarseTuning", "CudaTuning", "DenseTuning",
           "FILTER_ROUTES", "FilterTuning", "GraphTuning", "Pass1Tuning", "Pass2Tuning", "SearchConfig", "SelectionTuning", "TritonTuning"]

BACKENDS = ("auto", "torch", "gpu")
ROUTES = ("auto", "block", "dense-scatter")
FILTER_ROUTES = ("auto", "subset", "mask", "widen")
SCORER_CHOICES = ("auto",) + SCORER_NAMES


def _pow2(low: int, high: int) -> NumberRange:
    return NumberRange(int, low, high, power_of_two=True)


class _Group:
    """A group of knobs: it checks its fields like the YAML loader does (``lsr.utils.schema``)."""

    SECTION: ClassVar[str]

    def __post_init__(self) -> None:
        check_fields(self, f"SearchConfig.{self.SECTION}")


@dataclass(frozen=True)
class BatchTuning(_Group):
    """Step "query batches": how many queries a batch holds (each batch is planned on its own)."""

    SECTION: ClassVar[str] = "batches"
    size: int | None = at_least(None, 1)
    """Queries per batch; None: ``gpu`` on the gpu backend, on the torch backend ``memory``'s bound, at most
    ``torch``."""
    gpu: int = at_least(512, 1)
    """The gpu backend's batch: its working set is ~0.64 GiB at 500 queries and its throughput grows up to there."""
    torch: int = at_least(256, 1)
    """The torch backend's largest batch."""
    memory: int | None = at_least(None, 1)
    """The torch backend's working memory in bytes (dense query block, doc chunk scores); None: 1 GiB on the CPU,
    min(8 GiB, free / 4) on CUDA."""
    wide: int = at_least(16, 1)
    """Batches from this size are wide: the Triton scorer takes wide steps with fewer, larger programs (smaller ones
    more items in flight) and the coarse pass 1 may sample sparser (``coarse.sample_every``)."""


@dataclass(frozen=True)
class DenseTuning(_Group):
    """Step "route": when "auto" takes the dense-scatter route, and its chunks."""

    SECTION: ClassVar[str] = "dense"
    max_docs: int = at_least(1 << 18, 0)
    """auto: the dense scatter up to this many docs, for batches of at least ``min_batch`` queries on the Triton
    span scorer."""
    min_batch: int = at_least(65, 1)
    """See ``max_docs``."""
    budget: int = at_least(1 << 30, 1)
    """Bytes of dense [chunk, N] buffers: the query chunks fit it."""


@dataclass(frozen=True)
class TritonTuning(_Group):
    """Step "span scorer": the Triton scorer's work items and steps (its torch twin reads ``span`` and ``group``)."""

    SECTION: ClassVar[str] = "triton"
    span: int = within(2048, _pow2(32, 1 << 30))
    """Docs per work item (dividing the index block, or a multiple of it); capped at the collection's size."""
    group: int = within(1, _pow2(1, 1024))
    """Queries per work item (capped at the batch size rounded up to a power of two)."""
    rows: int | None = within(None, _pow2(1, 1024))
    """Chunks per step; None: 32 for wide batches, else 8."""
    chunk: int = within(32, _pow2(1, 4096))
    """Postings per chunk: a step's posting tile is [rows, chunk]."""
    readout: int = at_least(1024, 1)
    """Cells per read-out tile (the CPU only: on CUDA one 32-doc row)."""
    per_sm: int | None = at_least(None, 1)
    """Resident programs per SM; None: 2 for wide batches, else 8."""
    num_warps: int | None = within(None, _pow2(1, 32))
    """Warps per program; None: 8 for wide batches, else 4."""


@dataclass(frozen=True)
class CudaTuning(_Group):
    """Step "span scorer": the CUDA scorer (one shared-memory tile per CTA)."""

    SECTION: ClassVar[str] = "cuda"
    span: int = within(8192, _pow2(64, 16384))
    """Docs per work item; auto takes the CUDA scorer only for collections of at least this many docs."""
    warps: int = within(16, _pow2(1, 32))
    """Warps per CTA (a span holds at least 64 docs a warp)."""


@dataclass(frozen=True)
class Pass1Tuning(_Group):
    """Step "pass 1": theta from the row maxima of sampled spans."""

    SECTION: ClassVar[str] = "pass1"
    sample_every: int = at_least(16, 1)
    """Pass 1 scores ~1/sample_every of the spans (at least 4k row maxima); the coarse route: ``coarse.sample_every``."""


@dataclass(frozen=True)
class Pass2Tuning(_Group):
    """Step "pass 2" (exact) and "query chunks": the candidate slots."""

    SECTION: ClassVar[str] = "pass2"
    slots_per_span: int | None = at_least(None, 1)
    """Candidate slots per (query, span); None: 3k / sampled spans + 8 as a power of two >= 8 (fewer force the
    overflow repair)."""
    candidate_budget: int = at_least(1 << 30, 0)
    """Bytes of candidate slots per query chunk: the block route's chunks fit it."""


@dataclass(frozen=True)
class CoarseTuning(_Group):
    """Steps "pass 2", "coarse floor", "rescoring": both passes on 16-bit coarse sums, then the exact rescoring of
    the best k + margin coarse keys (scorers with coarse modes: ``lsr.search.scorers``)."""

    SECTION: ClassVar[str] = "coarse"
    enabled: bool = True
    """Run the coarse passes where the scorer has them and the batch is large enough (``min_batch``)."""
    span: int = within(32768, _pow2(32, 1 << 30))
    """The coarse pass 2's docs per work item (2 bytes of shared memory each)."""
    min_batch: int = at_least(17, 1)
    """Smaller batches take the exact pass 2: for them the selection of the best k + margin coarse keys costs more
    than the coarse sums save."""
    sample_every: int | None = at_least(None, 1)
    """Pass 1's sampling on the coarse route; None: 64 for batches of ``batches.wide`` to ``sample_max_batch``
    queries, 32 otherwise (larger batches pay more for a looser floor's extra candidates than the pass saves)."""
    sample_max_batch: int = at_least(128, 1)
    """See ``sample_every``."""
    margin_min: int = at_least(128, 0)
    """Coarse keys kept beyond k: max(margin_min, k * margin_share). The list is complete when its last coarse sum
    lies a query's term count below the k-th (~1.5% of the score with 16-bit sums)."""
    margin_share: float = at_least(0.5, 0)
    """See ``margin_min`` (a margin of k / 8 left many queries to the rescue: docs/performance/search.md)."""
    sampled_rank_min_k: int = at_least(256, 1)
    """From this k on the coarse floor comes from a sampled pass-1 key above the k-th
    (``lsr.search.kernels.coarse.sampled_rank``), checked afterwards."""
    floor_rank: int | None = at_least(None, 1)
    """The pass-1 key rank behind the coarse floor; None: ``sampled_rank``."""
    rescue_cells: int = at_least(1 << 21, 0)
    """Coarse candidates (B x C) up to which incomplete lists are settled inside the chunk (no host step), else on
    the host side."""


@dataclass(frozen=True)
class SelectionTuning(_Group):
    """Step "selection": the bucket selection of key rows (``lsr.search.kernels.bucket_select``)."""

    SECTION: ClassVar[str] = "selection"
    slots: int | None = at_least(None, 1)
    """Gather slots per row; None: next_power_of_2(2k + 1024). Rows with more keys near the k-th are selected again
    with torch.topk."""
    rank_max_b: int = at_least(16, 0)
    """Rows up to which the gathered keys are ranked by counting (~k^2 compares); more rows sort them, except up to
    ``rank_max_k`` where the CUDA sort is not available."""
    rank_max_k: int = at_least(512, 0)
    """See ``rank_max_b``."""


@dataclass(frozen=True)
class GraphTuning(_Group):
    """Step "cuda graph": the block route's CUDA graphs (``lsr.search.graphs``)."""

    SECTION: ClassVar[str] = "graphs"
    enabled: bool = True
    """Replay a captured graph for chunks of at most ``max_batch`` queries on CUDA."""
    max_batch: int = at_least(512, 0)
    """See ``enabled``."""
    capture_at_once: int = at_least(64, 0)
    """Batches up to this size are captured at their first search, larger ones at their second (a one-off shape
    never pays a capture)."""
    cache: int = at_least(32, 0)
    """Graphs kept per index (a server's warm-up captures up to 20)."""
    bytes: int = at_least(1 << 29, 0)
    """GPU memory the kept graphs of an index hold at most (the newest stays)."""
    shapes_seen: int = at_least(64, 0)
    """Large-batch shapes remembered per index until their second search."""
    shared_pool: bool = True
    """The graphs of an index share one memory pool and one lock."""


@dataclass(frozen=True)
class CacheTuning(_Group):
    """What a search keeps per index besides graphs (``lsr.search.index_cache``)."""

    SECTION: ClassVar[str] = "caches"
    plans: int = at_least(64, 0)
    """Plans kept per index, the least recently used dropped first."""
    items_max_batch: int = at_least(64, 0)
    """Batches up to this size keep their work items per shape (``items_small`` shapes)."""
    items_small: int = at_least(64, 0)
    """See ``items_max_batch``."""
    items_large: int = at_least(8, 0)
    """Larger batches (up to ``graphs.max_batch``): this many item sets ..."""
    items_large_bytes: int = at_least(1 << 23, 0)
    """... of at most this many bytes each."""


@dataclass(frozen=True)
class FilterTuning(_Group):
    """Step "filter": how a filtered search finds the top-k among the allowed documents (``lsr.search.filtered``)."""

    SECTION: ClassVar[str] = "filters"
    route: str = choice("auto", FILTER_ROUTES)
    """auto (subset for narrow filters, else mask on the torch backend and widen on the gpu backend), subset (search an
    index of the allowed documents), mask (the torch scorer drops the others) or widen (a deeper top-k of the whole
    index, the others dropped)."""
    subset_docs: int = at_least(1 << 16, 0)
    """auto: the subset route when a filter allows at most this many documents ..."""
    subset_fraction: float = within(0.001, NumberRange(float, 0.0, 1.0))
    """... or at most this fraction of them."""
    widen_margin: float = within(1.5, NumberRange(float, 1.0, 1e6))
    """widen: the first top-k' is k / (allowed fraction) times this (at most k + the denied documents); a k' that
    still holds fewer than k allowed documents is searched again 4x deeper."""
    subset_cache: int = at_least(4, 0)
    """Indexes of allowed documents kept per index (a filter repeated by a server is not indexed again)."""


_GROUPS: dict[str, type[_Group]] = {g.SECTION: g for g in (
    BatchTuning, DenseTuning, TritonTuning, CudaTuning, Pass1Tuning, Pass2Tuning, CoarseTuning, SelectionTuning,
    GraphTuning, CacheTuning, FilterTuning)}


@dataclass(frozen=True)
class SearchConfig:
    """How to search: the backend, the route, the span scorer and their tuning (module docstring).

    Backends: ``"torch"`` (the reference: a weighted gather-sum per document chunk, any device), ``"gpu"`` (the
    Triton / CUDA kernels, exact in fixed point; CUDA, or the CPU under TRITON_INTERPRET=1), ``"auto"`` (gpu on a
    CUDA device where triton imports, else torch). Routes of the gpu backend: ``"block"`` (span scorers, no dense
    score matrix: the route at scale), ``"dense-scatter"`` (a dense [B, N] fixed-point scatter and an on-chip
    top-k: small collections). Span scorers of the block route: ``lsr.search.scorers.SCORERS``.
    """

    k: int = at_least(1000, 1)
    """Results per query (``Searcher.search``'s default k; ``lsr run`` searches at most the index's documents)."""
    backend: str = choice("auto", BACKENDS)
    """auto (gpu on CUDA where triton imports, else torch), torch (the reference) or gpu (lsr's kernels; on a CPU
    under TRITON_INTERPRET=1)."""
    route: str = choice("auto", ROUTES)
    """The gpu backend's route: auto, block or dense-scatter."""
    scorer: str = choice("auto", SCORER_CHOICES)
    """The block route's span scorer: auto (cuda where it serves, else triton), cuda, triton or torch (the twin)."""
    batches: BatchTuning = field(default_factory=BatchTuning)
    dense: DenseTuning = field(default_factory=DenseTuning)
    triton: TritonTuning = field(default_factory=TritonTuning)
    cuda: CudaTuning = field(default_factory=CudaTuning)
    pass1: Pass1Tuning = field(default_factory=Pass1Tuning)
    pass2: Pass2Tuning = field(default_factory=Pass2Tuning)
    coarse: CoarseTuning = field(default_factory=CoarseTuning)
    selection: SelectionTuning = field(default_factory=SelectionTuning)
    graphs: GraphTuning = field(default_factory=GraphTuning)
    caches: CacheTuning = field(default_factory=CacheTuning)
    filters: FilterTuning = field(default_factory=FilterTuning)

    def __post_init__(self) -> None:
        for name, group in _GROUPS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, _group(group, value))
            elif not isinstance(value, group):
                raise ValueError(f"SearchConfig.{name} must be a {group.__name__} or a mapping of its keys, "
                                 f"got {value!r}")
        check_fields(self, "SearchConfig")
        # a config is a cache key of every search (plans, graphs): hash its fields once
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self))))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def replace(self, **changes: Any) -> SearchConfig:
        """A copy with ``changes``; a group given as a mapping changes only those of its keys
        (``cfg.replace(route="block", triton={"span": 64})``)."""
        for name, value in changes.items():
            if name in _GROUPS and isinstance(value, Mapping):
                changes[name] = _group(_GROUPS[name], value, getattr(self, name))
        return dataclasses.replace(self, **changes)


def _group(group: type[_Group], keys: Mapping[str, Any], base: _Group | None = None) -> _Group:
    known = {f.name for f in dataclasses.fields(group)}   # type: ignore[arg-type]
    unknown = sorted(set(keys) - known)
    if unknown:
        raise ValueError(f"unknown key(s) in SearchConfig.{group.SECTION}: {unknown} (known: {sorted(known)})")
    return dataclasses.replace(base, **keys) if base is not None else group(**keys)   # type: ignore[call-arg]
