"""The block path's configuration and the records its helpers pass around (``lsr.search.block_path``).

``BlockConfig`` is the user-facing tuning; ``BlockPlan`` holds what every query chunk of one search shares;
``ScoreArgs``, ``ChunkResult`` and ``Settled`` are the stages of one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from lsr.search.kernels import block_cuda
from lsr.utils.ragged import ragged_positions

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex
    from lsr.search.span_scorer import SpanScorer

__all__ = ["SMALL_BATCH_SAMPLE_B", "BlockConfig", "BlockPlan", "ChunkResult", "CoarseSpans", "QueryCSR", "ScoreArgs", "Settled",
           "default_config"]


@dataclass(frozen=True)
class BlockConfig:
    """Tuning of the block path (defaults and the sweeps behind them: docs/benchmarks-search.md)."""

    span: int = 2048          # Triton kernel: docs per work item (power of two dividing or multiple of the index block)
    group: int = 1            # queries per work item
    rows: int = 8             # chunks per step: the step's posting tile is [rows, chunk]
    chunk: int = 32           # postings per chunk
    readout: int = 1024       # Triton kernel: cells per read-out tile (CPU only: on CUDA one 32-doc row, see kernels.block)
    per_sm: int = 8           # resident programs per SM (persistent grid)
    num_warps: int = 4
    sample_every: int = 16    # pass 1 scores about 1/sample_every of the spans (at least enough rows)
    coarse_sample_every: int = 32   # the same for batches on the coarse route (their floor is checked)
    kernel: str = "auto"      # "cuda" (shared-memory tiles, kernels.block_cuda) | "triton" | "auto"
    cuda_span: int = block_cuda.SPAN    # CUDA kernel: docs per work item (one shared-memory tile per CTA)
    cuda_warps: int = block_cuda.WARPS  # CUDA kernel: warps per CTA
    graphs: bool = True       # CUDA: replay a captured graph for batches <= GRAPH_MAX_B (no per-kernel host cost)
    coarse: bool = True       # CUDA: both passes on coarse 16-bit sums, then the exact rescoring of the best k + margin
    coarse_span: int = 32768  # CUDA coarse pass: docs per work item (2 bytes of shared memory each)
    coarse_min_batch: int = 17  # smaller batches take the exact pass 2: for them the selection of the best
                                # k + margin coarse keys costs more than the coarse sums save


SMALL_BATCH_SAMPLE_B = 128     # coarse batches up to this size sample 1/64 of the spans in pass 1, larger ones 1/32


def default_config(n_queries: int) -> BlockConfig:
    """Block-path tuning by batch size: wide [32, 32] steps with 8 warps for batches, more and smaller
    programs for a few queries (more items in flight). The sweep is in docs/notes-search.md. Batches up to
    SMALL_BATCH_SAMPLE_B queries run pass 1 on half the spans larger ones do: 1-2% faster at 17-128 queries, 14%
    slower at 500, where the looser floor's extra candidates cost more than the pass saves (session 23)."""
    if n_queries >= 16:
        every = 64 if n_queries <= SMALL_BATCH_SAMPLE_B else 32
        return BlockConfig(rows=32, num_warps=8, per_sm=2, coarse_sample_every=every)
    return BlockConfig()


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


class CoarseSpans(NamedTuple):
    """The coarse pass 2's span and its span offsets."""

    span: int
    offsets: torch.Tensor


@dataclass(frozen=True, eq=False)
class BlockPlan:
    """What every query chunk of one block-path search shares."""

    index: InvertedIndex
    cfg: BlockConfig           # group and span resolved for this search
    scorer: SpanScorer         # the span scorer with its tuning bound
    span_off: torch.Tensor     # int64 [V, n_spans + 1] span offsets for cfg.span
    k: int
    n_sample: int              # spans scored by pass 1
    cap: int                   # candidate slots per (query, span) in pass 2
    max_terms: int             # query-length bucket (``triton_backend.terms_bound``): one compile and one CUDA
                               # graph per bucket; a graph's term buffer holds n_queries x it
    coarse: CoarseSpans | None  # the coarse passes (pass 1 on coarse sums too), where they run

    @property
    def n_spans(self) -> int:
        return self.span_off.shape[1] - 1

    def graph_key(self, n_queries: int) -> tuple:
        return (n_queries, self.max_terms, self.k, self.cfg, self.n_sample, self.cap)


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
    """Both passes of one chunk, before the host-side repairs of ``_settle``."""

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
    """A chunk after ``_settle``: copies that outlive the next graph replay."""

    best: torch.Tensor                 # int64 [B, k]; with ``unpacked``: the chunk's own (a graph's: no copy)
    redo: torch.Tensor | None          # int64 [n] queries for the exact pass 2, None if none
    rescue: tuple[torch.Tensor, ...] | None  # (int64 [n] queries, their coarse candidates [n, C], scale, inv_scale)
    unpacked: tuple[torch.Tensor, torch.Tensor] | None = None   # (scores, doc_idx) when nothing was repaired
