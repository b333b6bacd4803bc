"""Top-k selection: the one entry point of the gpu backend's selection family.

Everything here works on **keys**: a (score, doc) pair packed into one int64, ``bits(score) << 31 | (2**31 - 1 -
doc)`` (``kernels.topk``), so "larger key" means "higher score, then lower doc index" (the contract's ranking with
its tie rule), keys are unique, and any exact top-k of keys is deterministic. Scores <= 0 pack to -1 (padding).

* ``pack`` / ``unpack``: scores and docs <-> keys, one fused launch where the plan says so (CUDA or the
  interpreter), else the torch twins ``pack_keys`` / ``unpack_keys``.
* ``row_topk``: the k largest keys of every row, sorted (a CUDA bitonic sort of short rows, else ``torch.topk``).
* ``bucket_topk``: the k largest keys of long rows (tens of thousands of slots, mostly empty) by a two-level
  histogram, a gather and a rank or a sort; rows whose ties overflow the gather are flagged for ``row_topk``.
* ``bucket_theta`` / ``bucket_edge``: a lower bound of every row's k-th key (pass 1's theta and the coarse floor).
* ``triton_topk`` / ``torch_topk``: the exact top-k of a dense [B, N] score matrix (the dense-scatter route) and
  its torch twin.

The torch backend's reference over float scores (with doc ids, e.g. to merge partitions) is
``lsr.search.searcher.exact_topk``: it needs no triton.
"""

from __future__ import annotations

import torch

from lsr.search.kernels.bucket_select import bucket_edge, bucket_theta, bucket_topk, select_slots
from lsr.search.kernels.row_topk_cuda import row_topk
from lsr.search.kernels.topk import (
    pack_keys,
    torch_topk,
    triton_pack_keys,
    triton_topk,
    triton_unpack_keys,
    unpack_keys,
)

__all__ = ["bucket_edge", "bucket_theta", "bucket_topk", "pack", "pack_keys", "row_topk", "select_slots",
           "torch_topk", "triton_topk", "unpack", "unpack_keys"]


def pack(scores: torch.Tensor, docs: torch.Tensor, fused: bool) -> torch.Tensor:
    """int64 keys of float32 ``scores`` and int64 ``docs`` of one shape: one launch where ``fused`` (a CUDA graph's
    node instead of ~6), else ``pack_keys``. The same bits either way."""
    return triton_pack_keys(scores, docs) if fused else pack_keys(scores, docs)


def unpack(keys: torch.Tensor, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores float32, doc_idx int64) of keys, 0.0 / -1 for -1 keys: one launch where ``fused``, else
    ``unpack_keys``."""
    return triton_unpack_keys(keys) if fused else unpack_keys(keys)
