"""Which span scorer the block path runs: the CUDA shared-memory kernel where it serves, else the Triton one.

The choice depends on the device (NVRTC), the index (posting layout, block size, collection size) and the
tuning (``BlockConfig``); ``lsr.search.block_path`` asks once per search.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from lsr.index.compact import COMPACT
from lsr.search.kernels import block_cuda
from lsr.search.kernels.block import default_programs, triton_block_candidates
from lsr.search.spans import span_limit

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.search.block_plan import BlockConfig

__all__ = ["SpanScorer", "coarse_span", "cuda_span", "select_span_scorer"]

SpanScorer = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def select_span_scorer(cfg: BlockConfig, index: InvertedIndex) -> tuple[SpanScorer, int]:
    """(span scorer with its tuning bound, span) for ``cfg.kernel``: "auto" takes the CUDA kernel where
    it serves (CUDA device with NVRTC, group 1, aligned postings, a collection of at least one CUDA
    span), else the Triton one. Spans never exceed the collection rounded up to a power of two."""
    if cfg.kernel not in ("auto", "cuda", "triton"):
        raise ValueError(f"kernel must be 'auto', 'cuda' or 'triton', got {cfg.kernel!r}")
    span = cuda_span(cfg, index) if cfg.kernel != "triton" else None
    if cfg.kernel == "cuda" and span is None:
        raise RuntimeError("kernel='cuda' needs a CUDA device with NVRTC, group=1, 16-byte aligned postings "
                           "and at least cuda_span docs")
    if span is not None:
        return functools.partial(block_cuda.cuda_block_candidates, warps=cfg.cuda_warps), span
    scorer = functools.partial(triton_block_candidates, rows=cfg.rows, chunk=cfg.chunk, readout=cfg.readout,
                               num_warps=cfg.num_warps, n_programs=default_programs(index.device, cfg.per_sm))
    return scorer, min(cfg.span, _max_span(index))


def _max_span(index: InvertedIndex) -> int:
    """The largest span the kernels can read: compact postings hold block-local ids, so spans divide the
    block (lsr.index.compact); float32 postings allow any span."""
    return min(index.block_size, span_limit(index)) if index.postings == COMPACT else span_limit(index)


def cuda_span(cfg: BlockConfig, index: InvertedIndex) -> int | None:
    """cfg.cuda_span where the CUDA kernel serves this index (group 1, a collection of at least one CUDA
    span, a CUDA device with NVRTC, aligned postings), else None."""
    ok = cfg.group == 1 and min(cfg.cuda_span, _max_span(index)) == cfg.cuda_span \
        and block_cuda.usable(index.doc_ids, index.scores, cfg.cuda_span, cfg.cuda_warps)
    return cfg.cuda_span if ok else None


def coarse_span(cfg: BlockConfig, index: InvertedIndex, scorer: SpanScorer) -> int | None:
    """The coarse pass's span where it runs (the CUDA kernel scores, ``cfg.coarse``), else None."""
    if not cfg.coarse or getattr(scorer, "func", None) is not block_cuda.cuda_block_candidates:
        return None
    cspan = max(cfg.span, min(cfg.coarse_span, _max_span(index), block_cuda.MAX_COARSE_SPAN))
    bs = index.block_size
    # pass 1 runs in coarse mode on cfg.span: its read-out rows take COARSE_ROW docs a warp too
    fits = block_cuda.COARSE_ROW * cfg.cuda_warps <= cfg.span and cspan <= block_cuda.max_coarse_span(cfg.cuda_warps)
    return cspan if (cspan % bs == 0 or bs % cspan == 0) and fits else None
