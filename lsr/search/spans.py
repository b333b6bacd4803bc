"""Doc spans of the block path: where each term's postings for a span of doc ids start.

The index stores ``block_offsets`` for its own doc blocks; the block path may score spans that are
multiples of a block (columns of that table) or divisors of it (a binary search inside every (term,
block) segment). ``span_offsets`` builds that table once per (index, span) and caches it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

from lsr.index.compact import is_compact, local_ids
from lsr.search.kernels.topk import ROW

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.inverted import InvertedIndex

__all__ = ["span_limit", "span_offsets"]

_SPAN_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def span_limit(index: InvertedIndex) -> int:
    """The collection size rounded up to a power of two (>= ROW): no span is larger."""
    return max(ROW, 1 << max(0, (index.n_docs - 1).bit_length()))


def span_offsets(index: InvertedIndex, span: int) -> torch.Tensor:
    """int64 [V, ceil(N / span) + 1]: where term t's postings for docs [j * span, (j + 1) * span) start.

    ``span`` a multiple of the index's block size reuses ``block_offsets`` columns; a divisor needs a
    binary search inside every (term, block) segment (docs ascending, then -1 padding). The result is
    cached per index (it is V * n_spans * 8 bytes: build the index with block_size = span to avoid it).
    """
    bs = index.block_size
    cached = _SPAN_CACHE.setdefault(index, {})
    if span in cached:
        return cached[span]
    bo = index.block_offsets
    n_spans = max(1, -(-index.n_docs // span))
    if span % bs == 0:
        cols = torch.arange(0, index.n_blocks, span // bs, device=bo.device)
        out = torch.cat([bo[:, cols], bo[:, -1:]], 1)
    elif bs % span == 0:
        out = _split_blocks(index.doc_ids, bo, bs, span, local=is_compact(index.doc_ids))
    else:
        raise ValueError(f"span {span} must divide or be a multiple of the block size {bs}")
    out = out[:, :n_spans].contiguous() if out.shape[1] > n_spans + 1 else out.contiguous()
    if out.shape[1] == n_spans:  # trimmed: close with the end of every list
        out = torch.cat([out, bo[:, -1:]], 1).contiguous()
    cached[span] = out
    return out


def _split_blocks(doc_ids: torch.Tensor, bo: torch.Tensor, bs: int, span: int, local: bool = False,
                  terms_per_step: int = 2048) -> torch.Tensor:
    """Sub-span starts by a vectorised binary search (torch; chunked over terms to bound memory).

    ``local``: compact postings (block-local ids, padding id block_size - 1: at or past every bound)."""
    V, nb = bo.shape[0], bo.shape[1] - 1
    m = bs // span
    out = torch.empty((V, nb * m + 1), dtype=torch.int64, device=bo.device)
    out[:, -1] = bo[:, -1]
    sub = torch.arange(m, device=bo.device)
    for t0 in range(0, V, terms_per_step):
        t1 = min(V, t0 + terms_per_step)
        lo = bo[t0:t1, :-1].unsqueeze(2).expand(-1, -1, m).clone()          # [T, nb, m]
        hi = bo[t0:t1, 1:].unsqueeze(2).expand(-1, -1, m).clone()
        bound = (torch.arange(nb, device=bo.device).view(1, nb, 1) * (0 if local else bs) + sub.view(1, 1, m) * span)
        for _ in range(max(1, int(bs).bit_length() + 1)):                  # segments hold <= bs postings (+pad)
            active = lo < hi
            if not bool(active.any()):
                break
            mid = (lo + hi) // 2
            d = doc_ids[mid.clamp(max=doc_ids.numel() - 1)]
            d = local_ids(d) if local else d
            right = (d >= bound) | (d < 0)                                # first doc >= bound, or padding
            hi = torch.where(active & right, mid, hi)
            lo = torch.where(active & ~right, mid + 1, lo)
        out[t0:t1, :-1] = lo.view(t1 - t0, nb * m)
    return out
