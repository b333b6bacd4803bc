"""From the head's dense [B, V] weights to CSR rows in the caller's order (``SpladeEncoder.encode_prepared``).

The batches come sorted by length; their rows are gathered back into input order on the device, in one
pass over all batches of a call, and copied to the host once: no Python loop over rows or terms, and the
ids are never permuted (the result is in input order, so it takes the input ids as they are).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lsr.ragged import ragged_positions
from lsr.sparse import SparseVectors

__all__ = ["rows_to_input_order", "to_csr"]


def rows_to_input_order(counts: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, order: torch.Tensor,
                        ids: Sequence[str], vocab_size: int) -> SparseVectors:
    """CSR rows in batch order (``counts`` int64 [n] terms per row, ``indices`` / ``values`` [nnz]; row j is
    text ``order[j]``, a permutation of 0..n-1 on the CPU) -> SparseVectors on the CPU, row i = text i
    with id ``ids[i]``."""
    n = order.numel()
    position = torch.empty_like(order)
    position[order] = torch.arange(n)  # text i is row position[i]
    position = position.to(counts.device)
    lens = counts[position]
    starts = torch.cumsum(counts, 0) - counts
    _, src = ragged_positions(starts[position], lens, total=indices.numel())
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(lens, 0, out=indptr[1:])
    return SparseVectors(indptr.cpu(), indices[src].cpu(), values[src].cpu(), ids, vocab_size, validate=False)


def to_csr(y: torch.Tensor, top_k: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, V] weights -> (row lengths int64 [B], term ids int32 [nnz], weights float32 [nnz]), rows in
    order and terms ascending; with ``top_k`` only each row's k largest (ties: lower term id) survive."""
    B, V = y.shape  # (the caller checks finiteness before pruning, which could drop a NaN unseen)
    if top_k is not None and top_k < V:
        kth = torch.topk(y, top_k, dim=1).values[:, -1:]
        above, tied = y > kth, y == kth
        room = top_k - above.sum(1, keepdim=True)
        y = torch.where(above | (tied & (torch.cumsum(tied, 1) <= room)), y, torch.zeros((), dtype=y.dtype, device=y.device))
    nz = torch.nonzero(y)  # row-major: rows in order, term ids ascending
    values = y[nz[:, 0], nz[:, 1]].float()
    return torch.bincount(nz[:, 0], minlength=B), nz[:, 1].to(torch.int32), values
