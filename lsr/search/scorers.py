"""The span scorers of the block route, one record each: what a scorer can do, what it reads, and its launcher.

A span scorer scores one (query group, span of docs) work item into row maxima (pass 1) or candidate keys (pass 2)
(``lsr.search.kernels.block`` has the contract). The search plan (``lsr.search.block_planner``) chooses one from
``SCORERS`` and asks only its record: whether it can serve the index here (``why_not``), whether it has the coarse
modes, takes query groups, reads compact postings, may be held by a CUDA graph, reads queries of any length, beats
the dense scatter; ``bind`` gives its launcher with its tuning bound, the callable the executor runs. Adding a
scorer is one ``Scorer`` entry here plus its kernel (with its torch twin): docs/contributing.md, "Add a search
scorer".

This module imports no kernel: a scorer's kernel module is imported when the plan binds it (the torch backend
runs without triton).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from lsr.index.inverted import InvertedIndex

__all__ = ["SCORERS", "SCORER_NAMES", "Scorer", "SpanScorer", "scorer", "why_not"]

# a lsr.search.config.SearchConfig: that module imports this one (the scorer names are its ``scorer`` choices), so
# this one names it only here
SearchConfig = Any
# a span scorer's launcher with its tuning bound: (doc_ids, scores, span_off, indptr, terms, weights, scale,
# inv_scale, span, items, out_size, **pass keywords) -> (keys, counts or None), as
# lsr.search.kernels.block.triton_block_candidates
SpanScorer = Callable[..., "tuple[torch.Tensor, torch.Tensor | None]"]


@dataclass(frozen=True)
class Scorer:
    """One span scorer: its abilities (the plan's only source of them), the knobs it reads and its launcher."""

    name: str
    """``SearchConfig.scorer`` selects it by this name; ``--explain`` prints it."""
    summary: str
    """One line: what it is and where its kernel lives."""
    runs_on: tuple[str, ...]
    """Where it runs: "cuda", "interpreter" (the CPU under TRITON_INTERPRET=1), "cpu"."""
    reads: tuple[str, ...]
    """The ``SearchConfig`` keys it reads (dotted, as ``--set search.<key>`` takes them)."""
    span: Callable[[SearchConfig], int]
    """The span (docs per work item) it asks for."""
    bind: Callable[[SearchConfig, InvertedIndex, int], SpanScorer]
    """(config, index, batch size) -> its launcher with its tuning bound."""
    check: Callable[[SearchConfig, InvertedIndex, int], str | None] | None = None
    """(config, index, span) -> why it cannot serve them here, or None: its own limits beyond the abilities."""
    coarse_span: Callable[[SearchConfig, int, int], tuple[int | None, str]] | None = None
    """The coarse modes (16-bit sums in both passes, ``lsr.search.kernels.coarse``): (config, span, wanted coarse
    span) -> (the coarse pass 2's span, or None and why not). None: it has no coarse mode."""
    groups: bool = False
    """It takes several queries per work item (``triton.group`` > 1)."""
    compact: bool = True
    """It reads compact postings (``lsr.index.compact``)."""
    graph_safe: bool = True
    """Its launch needs no host sync, so a CUDA graph can hold it."""
    any_length: bool = False
    """It reads queries of any length: the plan's term bound may be the batch's mean length (no host sync), else
    the longest query."""
    beats_scatter: bool = False
    """As fast as the dense scatter at any collection size: where it runs, route "auto" takes the block route."""
    auto: bool = True
    """``scorer="auto"`` may choose it (the first in ``SCORERS`` that can serve)."""

    @property
    def coarse(self) -> bool:
        """Whether it has the coarse modes."""
        return self.coarse_span is not None


def why_not(sc: Scorer, cfg: SearchConfig, index: InvertedIndex, span: int, group: int) -> str | None:
    """Why ``sc`` cannot serve ``index`` with ``cfg`` (the batch's query ``group``), or None when it can."""
    from lsr.index.compact import COMPACT
    from lsr.utils.kernels import INTERPRET

    if group > 1 and not sc.groups:
        return f"group {group} (it takes one query per work item)"
    if index.postings == COMPACT and not sc.compact:
        return "compact postings"
    own = sc.check(cfg, index, span) if sc.check is not None else None
    if own is not None:
        return own
    dev = index.device.type
    where = "cuda" if dev == "cuda" else "interpreter" if INTERPRET and "interpreter" in sc.runs_on else dev
    return None if where in sc.runs_on else f"{dev} device"


# ------------------------------------------------------------------ cuda: shared-memory tiles (NVRTC)
def _cuda_check(cfg: SearchConfig, index: InvertedIndex, span: int) -> str | None:
    from lsr.search.kernels import block_cuda

    if span != cfg.cuda.span:
        return f"fewer docs than cuda.span {cfg.cuda.span} (or compact blocks smaller)"
    if block_cuda.usable(index.doc_ids, index.scores, cfg.cuda.span, cfg.cuda.warps):
        return None
    if index.device.type != "cuda":
        return f"{index.device.type} device"
    return "no NVRTC, or postings not 16-byte aligned, or a cuda.span outside the kernel's range"


def _cuda_coarse_span(cfg: SearchConfig, span: int, wanted: int) -> tuple[int | None, str]:
    from lsr.search.kernels import block_cuda

    cspan = min(wanted, block_cuda.MAX_COARSE_SPAN)
    warps = cfg.cuda.warps
    # pass 1 runs in coarse mode on the scorer's span: its read-out rows take COARSE_ROW docs a warp too
    if block_cuda.COARSE_ROW * warps > span or cspan > block_cuda.max_coarse_span(warps):
        return None, f"{warps} warps"
    return cspan, ""


def _bind_cuda(cfg: SearchConfig, index: InvertedIndex, n_queries: int) -> SpanScorer:
    from lsr.search.kernels.block_cuda import cuda_block_candidates

    return functools.partial(cuda_block_candidates, warps=cfg.cuda.warps)


# ------------------------------------------------------------------ triton: L2 scratch tiles
def _bind_triton(cfg: SearchConfig, index: InvertedIndex, n_queries: int) -> SpanScorer:
    """Batches of ``batches.wide`` queries and more take wide steps with fewer, larger programs (the tuning left at
    None)."""
    from lsr.search.kernels.block import default_programs, triton_block_candidates

    t, wide = cfg.triton, n_queries >= cfg.batches.wide
    return functools.partial(triton_block_candidates, rows=t.rows or (32 if wide else 8), chunk=t.chunk,
                             readout=t.readout, num_warps=t.num_warps or (8 if wide else 4),
                             n_programs=default_programs(index.device, t.per_sm or (2 if wide else 8)))


# ------------------------------------------------------------------ torch: the twin of both kernels
def _torch_coarse_span(cfg: SearchConfig, span: int, wanted: int) -> tuple[int | None, str]:
    return wanted, ""


def _bind_torch(cfg: SearchConfig, index: InvertedIndex, n_queries: int) -> SpanScorer:
    from lsr.search.kernels.block import torch_block_candidates

    return torch_block_candidates


def _cuda_span(cfg: SearchConfig) -> int:
    return cfg.cuda.span


def _triton_span(cfg: SearchConfig) -> int:
    return cfg.triton.span


_TRITON_KNOBS = ("triton.span", "triton.group", "triton.rows", "triton.chunk", "triton.readout", "triton.per_sm",
                 "triton.num_warps", "batches.wide")

SCORERS: tuple[Scorer, ...] = (
    Scorer("cuda", "shared-memory tiles, NVRTC-compiled (lsr.search.kernels.block_cuda)", ("cuda",),
           ("cuda.span", "cuda.warps"), _cuda_span, _bind_cuda, check=_cuda_check, coarse_span=_cuda_coarse_span,
           any_length=True, beats_scatter=True),
    Scorer("triton", "scratch tiles in L2, Triton (lsr.search.kernels.block)", ("cuda", "interpreter"),
           _TRITON_KNOBS, _triton_span, _bind_triton, groups=True),
    Scorer("torch", "the kernels' torch twin, coarse modes too (lsr.search.kernels.block; slow: tests)",
           ("cuda", "cpu"), ("triton.span", "triton.group"), _triton_span, _bind_torch,
           coarse_span=_torch_coarse_span, groups=True, graph_safe=False, any_length=True, auto=False),
)
"""Every span scorer, in the order ``scorer="auto"`` tries them."""

SCORER_NAMES: tuple[str, ...] = tuple(s.name for s in SCORERS)


def scorer(name: str) -> Scorer:
    """The registry entry called ``name``."""
    for sc in SCORERS:
        if sc.name == name:
            return sc
    raise ValueError(f"no span scorer {name!r}; the scorers: {', '.join(SCORER_NAMES)}")
