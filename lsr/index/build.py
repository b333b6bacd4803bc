"""Build the term-major, warp-padded, block-aligned posting arrays from doc-major SparseVectors.

Layout (docs/architecture.md, "Inverted index"): postings are ordered by term, then by doc id; the doc
axis is cut into blocks of ``block_size`` docs and every (term, block) segment is padded to a multiple
of ``PAD`` (32, one warp) with doc id -1 / score 0, so a kernel can give each warp whole, aligned
segments and skip blocks it does not need.

Algorithm (torch only, on the vectors' device, no Python loop over terms, docs or blocks):

1. Every (term, block) pair gets a key ``term * n_blocks + block``. Pass 1 counts postings per key
   (``bincount``) and takes the per-term max weight; the padded counts' exclusive cumsum is where
   every segment starts in the output.
2. Pass 2 stable-sorts each chunk's postings by term. Docs arrive in ascending order (CSR rows), so a
   stable sort by term alone leaves them sorted by (term, block, doc); a posting's destination is its
   segment start + the postings of that key already written by earlier chunks + its rank inside the
   chunk's run of that key.

Chunks are ranges of whole documents holding at most ``max_memory_bytes / BYTES_PER_POSTING`` postings,
so peak temporary memory stays within the budget whatever the collection size; results do not depend
on the chunking. The sort keys are the narrowest integer type that holds a term id (int16 for BERT's
30,522 terms: half the radix passes of int32). Everything is integer arithmetic plus a stable sort,
so the CPU and CUDA builds are identical bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

from lsr.index.compact import AUTO, COMPACT, FLOAT32, choose_layout, encode_docs, is_compact
from lsr.sparse import SparseVectors
from lsr.utils.ragged import segment_ids
from lsr.utils.ranges import BLOCK_SIZES

__all__ = ["DEFAULT_BLOCK_SIZE", "MAX_BLOCK_SIZE", "PAD", "POSTING_TENSORS", "PostingArrays", "build_postings", "check_block_size",
           "default_memory_budget", "n_blocks_for"]

PAD = 32                      # segment padding: one warp
DEFAULT_BLOCK_SIZE = 1 << 16  # docs per block
MAX_BLOCK_SIZE = int(BLOCK_SIZES.high)
# Budgeted temporary bytes per posting of a chunk in pass 2 (int16 sort key and sorted key, int64
# permutation, radix-sort scratch, gathered doc ids / weights, segment key, int64 destination), with
# slack for allocator fragmentation over what docs/performance/index.md ("Index build memory") records.
BYTES_PER_POSTING = 56
_MAX_CHUNK_POSTINGS = (1 << 31) - 1  # keep chunk-local positions and sort sizes within int32
_INT32_MAX = (1 << 31) - 1


@dataclass(eq=False)
class PostingArrays:
    """The posting-side fields of an InvertedIndex, which extends this class (shapes: P padded postings,
    V terms, NB blocks).

    doc_ids int32 [P], scores float32 [P] (compact layout: int16 local ids, bf16 / fp16 weights),
    offsets int64 [V], lengths int32 [V], padded_lengths int32 [V], max_scores float32 [V],
    block_offsets int64 [V, NB + 1].
    """

    doc_ids: torch.Tensor
    scores: torch.Tensor
    offsets: torch.Tensor
    lengths: torch.Tensor
    padded_lengths: torch.Tensor
    max_scores: torch.Tensor
    block_offsets: torch.Tensor
    block_size: int
    n_blocks: int

    @property
    def postings(self) -> str:
        """The posting layout: "float32" or "compact" (``lsr.index.compact``)."""
        return COMPACT if is_compact(self.doc_ids) else FLOAT32


POSTING_TENSORS = tuple(f.name for f in fields(PostingArrays) if f.type == "torch.Tensor")


def check_block_size(block_size: int) -> int:
    """Validate ``block_size`` (a power of two in [1, 2^20]) and return log2 of it (the kernels' shift)."""
    why = BLOCK_SIZES.problem(block_size)
    if why is not None:
        raise ValueError(f"block_size {why}")
    return int(block_size).bit_length() - 1


def n_blocks_for(n_docs: int, block_size: int) -> int:
    """Number of doc blocks; at least 1 so an empty collection still has a well-formed block table."""
    return max(1, -(-n_docs // block_size))


def default_memory_budget(device: torch.device) -> int:
    """Temporary-memory budget for a build on ``device``: min(1 GiB, free / 2) on CUDA, 2 GiB on CPU.

    Bigger chunks do not pay: a 1.1B-posting build was fastest with the 1 GiB budget, slower with 8 GiB and
    slowest in one chunk (the measurements: docs/performance/index.md).
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(min(free // 2, 1 << 30), 1 << 26)
    return 2 << 30


def _sort_key(terms: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, int]:
    """Order-preserving narrowest integer view of term ids (fewer radix passes on CUDA, faster on CPU).

    Returns (key, shift) with term = key + shift.
    """
    if vocab_size <= 1 << 15:
        return terms.to(torch.int16), 0
    if vocab_size <= 1 << 16:
        return (terms - (1 << 15)).to(torch.int16), 1 << 15
    return terms, 0


def _chunks(indptr: torch.Tensor, per_chunk: int) -> list[tuple[int, int, int, int]]:
    """Split rows into runs of whole rows holding about ``per_chunk`` postings each.

    Returns [(row_start, row_end, posting_start, posting_end)] computed with one host sync; a single
    row longer than ``per_chunk`` forms its own chunk.
    """
    n = indptr.numel() - 1
    nnz = int(indptr[-1])
    targets = torch.arange(0, max(nnz, 1), per_chunk, dtype=torch.int64, device=indptr.device)
    rows = torch.searchsorted(indptr, targets)  # first row starting at or after each target
    rows = torch.unique(torch.cat([rows.clamp_(max=n), torch.tensor([0, n], device=indptr.device)]))
    bounds = rows.tolist()
    post = indptr[rows].tolist()
    return [(bounds[i], bounds[i + 1], post[i], post[i + 1]) for i in range(len(bounds) - 1)]


def _chunk_docs(vectors: SparseVectors, r0: int, r1: int, p0: int, p1: int) -> torch.Tensor:
    """int32 [p1 - p0] doc id of every posting of rows [r0, r1) (output_size avoids a device sync)."""
    lens = vectors.indptr[r0 + 1:r1 + 1] - vectors.indptr[r0:r1]
    return segment_ids(lens, p1 - p0, dtype=torch.int32, start=r0)


def _segment_keys(terms: torch.Tensor, docs: torch.Tensor, n_blocks: int, shift: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """Key term * n_blocks + block of every posting, in ``dtype`` (int32 whenever V * n_blocks fits)."""
    return terms.to(dtype) * n_blocks + (docs >> shift).to(dtype)


def build_postings(vectors: SparseVectors, block_size: int = DEFAULT_BLOCK_SIZE,
                   max_memory_bytes: int | None = None, postings: str = AUTO) -> PostingArrays:
    """Build the padded, block-aligned term-major posting arrays on ``vectors.device``.

    Args:
        vectors: n docs, CSR (rows ascending, terms unique and ascending per row).
        block_size: docs per block, a power of two <= 2^20.
        max_memory_bytes: budget for temporaries (default: see ``default_memory_budget``); the
            output arrays (8 bytes per padded posting, 4 when compact) come on top.
        postings: "float32" (int32 doc ids, float32 weights), "compact" (``lsr.index.compact``:
            uint16 block-local ids and the weights as bf16 / fp16, which must hold them exactly) or
            "auto" (compact where it holds them exactly, else float32).

    Returns:
        PostingArrays; see the class docstring for shapes.
    """
    shift = check_block_size(block_size)
    dev = vectors.device
    budget = default_memory_budget(dev) if max_memory_bytes is None else int(max_memory_bytes)
    # refused before any work: a block size or weights the compact layout cannot hold
    layout, w_dtype = choose_layout(postings, vectors.values, block_size, chunk=max(1 << 16, budget // 8))
    compact_block = block_size if layout == COMPACT else 0   # > 0: block-local ids (compact layout)
    n, V = len(vectors), vectors.vocab_size
    if n > _INT32_MAX:
        raise ValueError(f"{n} documents do not fit int32 doc ids")
    nb = n_blocks_for(n, block_size)
    keys = _SegmentKeys(nb, shift, torch.int32 if V * nb <= _INT32_MAX else torch.int64, V * nb)
    per_chunk = min(max(budget // BYTES_PER_POSTING, PAD), _MAX_CHUNK_POSTINGS)
    chunks = [c for c in _chunks(vectors.indptr, per_chunk) if c[3] > c[2]]

    counts, max_scores = _count_segments(vectors, chunks, keys)
    padded = (counts + (PAD - 1)) // PAD * PAD
    seg_start = torch.zeros(keys.n + 1, dtype=torch.int64, device=dev)
    torch.cumsum(padded, 0, out=seg_start[1:])
    # column j < nb: start of segment (t, j); column nb: end of term t = start of segment (t + 1, 0)
    ends = seg_start[nb::nb] if V else seg_start[:0]
    block_offsets = torch.cat([seg_start[:-1].view(V, nb), ends.view(V, 1)], dim=1)
    lengths64 = counts.view(V, nb).sum(1)
    padded64 = padded.view(V, nb).sum(1)
    longest = int(padded64.max()) if V else 0
    if longest > _INT32_MAX:
        raise ValueError(f"a posting list of {longest} entries does not fit int32 lengths")
    doc_ids, scores = _empty_postings(int(seg_start[-1]), compact_block, w_dtype, dev)
    _scatter_postings(vectors, chunks, keys, seg_start, doc_ids, scores, compact_block)
    return PostingArrays(doc_ids=doc_ids, scores=scores, offsets=block_offsets[:, 0].contiguous(),
                         lengths=lengths64.to(torch.int32), padded_lengths=padded64.to(torch.int32),
                         max_scores=max_scores, block_offsets=block_offsets.contiguous(),
                         block_size=int(block_size), n_blocks=nb)


class _SegmentKeys(NamedTuple):
    """Keys of the (term, block) posting segments: term * n_blocks + doc >> shift, in ``dtype``; n of them."""

    n_blocks: int
    shift: int
    dtype: torch.dtype
    n: int


def _count_segments(vectors: SparseVectors, chunks: list[tuple[int, int, int, int]],
                    keys: _SegmentKeys) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 1: postings per (term, block) segment and the max weight of every term."""
    counts = torch.zeros(keys.n, dtype=torch.int64, device=vectors.device)
    max_scores = torch.zeros(vectors.vocab_size, dtype=torch.float32, device=vectors.device)
    for r0, r1, p0, p1 in chunks:
        terms = vectors.indices[p0:p1]
        docs = _chunk_docs(vectors, r0, r1, p0, p1)
        counts += torch.bincount(_segment_keys(terms, docs, keys.n_blocks, keys.shift, keys.dtype), minlength=keys.n)
        # amax is order-independent, hence deterministic even with atomics
        max_scores.scatter_reduce_(0, terms.to(torch.int64), vectors.values[p0:p1], reduce="amax")
    return counts, max_scores


def _empty_postings(total: int, compact_block: int, w_dtype: torch.dtype,
                    dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded posting arrays before the scatter: doc id -1 and weight 0, or for the compact layout
    (``compact_block`` > 0, its block size) local id compact_block - 1 and weight 0 (see lsr.index.compact)."""
    scores = torch.zeros(total, dtype=w_dtype, device=dev)
    if compact_block:
        return encode_docs(torch.full((total,), compact_block - 1, dtype=torch.int32, device=dev), compact_block), scores
    return torch.full((total,), -1, dtype=torch.int32, device=dev), scores


def _scatter_postings(vectors: SparseVectors, chunks: list[tuple[int, int, int, int]], keys: _SegmentKeys,
                      seg_start: torch.Tensor, doc_ids: torch.Tensor, scores: torch.Tensor, compact_block: int) -> None:
    """Pass 2: every posting to its place (segments in term order, docs ascending inside); compact_block > 0
    stores block-local ids of that block size."""
    dev = vectors.device
    written = torch.zeros(keys.n, dtype=torch.int64, device=dev)  # postings per segment placed so far
    for r0, r1, p0, p1 in chunks:
        sort_key, key_shift = _sort_key(vectors.indices[p0:p1], vectors.vocab_size)
        sorted_terms, order = torch.sort(sort_key, stable=True)
        del sort_key
        # index_select, not advanced indexing: the faster gather for these big random permutations on the CPU
        docs = _chunk_docs(vectors, r0, r1, p0, p1).index_select(0, order)
        vals = vectors.values[p0:p1].index_select(0, order)
        del order
        key = _segment_keys(sorted_terms, docs, keys.n_blocks, keys.shift, keys.dtype)
        if key_shift:
            key += key_shift * keys.n_blocks
        del sorted_terms
        chunk_counts = torch.bincount(key, minlength=keys.n)
        first = torch.cumsum(chunk_counts, 0) - chunk_counts  # first sorted position of each key
        dest = (seg_start[:-1] + written - first).index_select(0, key)
        del key, first
        dest += torch.arange(p1 - p0, dtype=torch.int64, device=dev)
        # destinations are unique (and ascending), so the copies are deterministic
        doc_ids.index_copy_(0, dest, encode_docs(docs, compact_block) if compact_block else docs)
        scores.index_copy_(0, dest, vals.to(scores.dtype))
        written += chunk_counts
        del docs, vals, dest
