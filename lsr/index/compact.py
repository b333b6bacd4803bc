"""The compact posting layout: 4 bytes per term-major posting instead of 8, search still exact.

Per posting a block-local doc id (``doc - block * block_size``, uint16 bits kept in an int16 tensor)
and the stored weight as a 16-bit float (bfloat16 or float16). Why it stays exact: the layout is only
chosen when every weight of the collection is exactly representable in that 16-bit type (vectors lsr
encodes in bf16 on CUDA are bf16 values stored as float32), so a kernel's float64 product
``w_query * w_doc * scale`` and hence every fixed-point sum are the same bits as with float32 weights.
Collections whose weights are not 16-bit exact are refused with a one-line error (use the float32
layout); a build's default, "auto", takes this layout where it is exact and float32 elsewhere.
docs/performance/search.md explains why a lossy (quantised + rescored) variant was left out.

Padding (segments are padded to multiples of ``PAD``) holds weight 0 and local id ``block_size - 1``:
stored weights are > 0 (``SparseVectors`` rejects zeros), so kernels skip a posting by its zero
weight, and the id keeps the "first local id >= bound, or padding" binary search of ``lsr.search.spans``
valid. Kernels never need the block of a posting: the block path scores spans that divide the block,
so ``local & (span - 1)`` is the posting's cell in its span (``span <= block_size`` is required).
"""

from __future__ import annotations

import torch

from lsr.utils.ragged import segment_ids

__all__ = ["AUTO", "CHOICES", "COMPACT", "FLOAT32", "LAYOUTS", "MAX_COMPACT_BLOCK", "MIN_COMPACT_BLOCK", "WEIGHT_DTYPES",
           "check_compact_block_size", "check_compact_postings", "choose_layout", "compact_block_size_ok",
           "compact_weight_dtype", "decode_postings",
           "encode_docs", "is_compact", "local_ids", "weight_dtype_name"]

FLOAT32 = "float32"
COMPACT = "compact"
AUTO = "auto"                    # a build's choice: compact where it holds the collection exactly, else float32
LAYOUTS = (FLOAT32, COMPACT)     # what an index stores
CHOICES = (AUTO, FLOAT32, COMPACT)
MAX_COMPACT_BLOCK = 1 << 16      # local ids are uint16
MIN_COMPACT_BLOCK = 32           # the block path's smallest span (one 32-doc row) must fit in a block
WEIGHT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}   # tried in this order
_DOC_DTYPE = torch.int16         # uint16 bits
_CHUNK = 1 << 26                 # weights per exactness check (when the caller gives no budget)


def is_compact(doc_ids: torch.Tensor) -> bool:
    """Whether posting doc ids are the compact layout's block-local ids (int16 holding uint16 bits)."""
    return doc_ids.dtype == _DOC_DTYPE


def weight_dtype_name(dtype: torch.dtype) -> str:
    """"float32", "bfloat16" or "float16" (meta.json's ``weight_dtype``)."""
    return str(dtype).removeprefix("torch.")


def compact_block_size_ok(block_size: int) -> bool:
    """32 <= block_size <= 65536: uint16 local ids, and a 32-doc span fits a block."""
    return MIN_COMPACT_BLOCK <= block_size <= MAX_COMPACT_BLOCK


def check_compact_block_size(block_size: int) -> None:
    """The compact layout needs ``compact_block_size_ok``: else a one-line ValueError."""
    if not compact_block_size_ok(block_size):
        raise ValueError(f"compact postings need a block_size between {MIN_COMPACT_BLOCK} and {MAX_COMPACT_BLOCK} "
                         f"(uint16 local doc ids), got {block_size}; use --block-size 65536 or the float32 layout")


def compact_weight_dtype(values: torch.Tensor, chunk: int = _CHUNK) -> torch.dtype:
    """The first 16-bit float type (bf16, fp16) holding every weight exactly, else a one-line ValueError.

    Checked in chunks of ``chunk`` weights (temporaries stay small next to a build's budget)."""
    dtype, bad = _exact_dtype(values, chunk)
    if dtype is None:
        raise ValueError(f"compact postings need weights exactly representable in bfloat16 or float16 (e.g. vectors "
                         f"encoded in bf16); weight {bad!r} is not: use the float32 posting layout")
    return dtype


def choose_layout(postings: str, values: torch.Tensor, block_size: int,
                  chunk: int = _CHUNK) -> tuple[str, torch.dtype]:
    """(stored layout, posting weight dtype) for a build's ``postings`` choice (``CHOICES``). "auto" takes the
    compact layout where it holds the collection exactly (a block size it allows, every weight a bf16 or
    fp16 value: vectors encoded in bf16), else float32; "compact" refuses what it cannot hold (ValueError).
    The weights are checked ``chunk`` at a time (~7 bytes of temporaries each)."""
    if postings not in CHOICES:
        raise ValueError(f"postings must be one of {CHOICES}, got {postings!r}")
    if postings == FLOAT32:
        return FLOAT32, torch.float32
    if postings == COMPACT:
        check_compact_block_size(block_size)
        return COMPACT, compact_weight_dtype(values, chunk)
    if not compact_block_size_ok(block_size) or values.numel() == 0:
        return FLOAT32, torch.float32
    dtype, _ = _exact_dtype(values, chunk)
    return (FLOAT32, torch.float32) if dtype is None else (COMPACT, dtype)


def _exact_dtype(values: torch.Tensor, chunk: int) -> tuple[torch.dtype | None, float | None]:
    bad = None
    for dtype in WEIGHT_DTYPES.values():
        bad = _first_inexact(values, dtype, chunk)
        if bad is None:
            return dtype, None
    return None, bad


def _first_inexact(values: torch.Tensor, dtype: torch.dtype, chunk: int) -> float | None:
    for i in range(0, values.numel(), chunk):
        v = values[i:i + chunk]
        lost = v.to(dtype).to(torch.float32) != v
        if bool(lost.any()):
            return float(v[lost][0])
    return None


def encode_docs(docs: torch.Tensor, block_size: int) -> torch.Tensor:
    """int16 [n] uint16 bits of the block-local ids of int32/int64 doc ids ``docs`` (>= 0)."""
    local = (docs & (block_size - 1)).to(torch.int32)
    # the int16 with the same low 16 bits, in place (no further temporaries of the build chunk's size)
    return local.add_(1 << 15).bitwise_and_(0xFFFF).sub_(1 << 15).to(_DOC_DTYPE)


def local_ids(doc_ids: torch.Tensor) -> torch.Tensor:
    """int32 block-local ids (0 .. 65535) from the stored int16 bits."""
    return doc_ids.to(torch.int32) & 0xFFFF


def decode_postings(doc_ids: torch.Tensor, scores: torch.Tensor, block_offsets: torch.Tensor,
                    block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 layout's arrays (int32 global doc ids with -1 padding, float32 weights) of compact
    postings; for debugging, tests and benchmarks (P-sized temporaries)."""
    V, nb = block_offsets.shape[0], block_offsets.shape[1] - 1
    seg = segment_ids(block_offsets.diff(dim=1).flatten(), doc_ids.numel())      # (term, block) of each slot
    block = (seg % max(nb, 1)).to(torch.int32) if V else seg.to(torch.int32)
    w = scores.to(torch.float32)
    docs = torch.where(w > 0, block * block_size + local_ids(doc_ids), torch.full_like(block, -1))
    return docs, w


def check_compact_postings(doc_ids: torch.Tensor, scores: torch.Tensor, block_size: int,
                           n_postings: int) -> list[str]:
    """Problems of compact posting arrays (one vectorised pass): dtypes, local ids within the block,
    weights finite and >= 0, exactly ``n_postings`` non-zero weights."""
    if not is_compact(doc_ids) or scores.dtype not in WEIGHT_DTYPES.values():
        return [f"compact postings need int16 local ids and bf16/fp16 weights, got {doc_ids.dtype} / {scores.dtype}"]
    problems = []
    if doc_ids.numel():
        local = local_ids(doc_ids)
        if int(local.max()) >= block_size:
            problems.append(f"local doc ids reach {int(local.max())}, outside [0, {block_size})")
        w = scores.to(torch.float32)
        if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
            problems.append("posting weights must be finite and >= 0")
        elif int((w > 0).sum()) != n_postings:
            problems.append(f"{int((w > 0).sum())} non-zero posting weights, the doc-major CSR has {n_postings}")
    return problems
