"""From the head's dense [B, V] weights to CSR rows in the caller's order (``SpladeEncoder.encode_prepared``).

The batches come sorted by length; their rows are gathered back into input order on the device, in one
pass over all batches of a call, and copied to the host once: no Python loop over rows or terms, and the
ids are never permuted (the result is in input order, so it takes the input ids as they are).

No host sync per batch: a batch's non-zeros are counted on the device and the count travels to pinned host
memory behind an event (``CountedRows``); the caller launches the next batch's model before it asks for this
one's CSR parts, so the GPU has work queued while the host waits for the count. The window's result goes to
pinned host buffers on a side stream (``PendingVectors``), overlapping the next window's model, and from there
into pageable memory (a pageable device-to-host copy is slow and blocks the stream; docs/performance/encode.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lsr.sparse import SparseVectors
from lsr.utils.ragged import ragged_positions
from lsr.utils.runtime import failure_memory, per_device

__all__ = ["STATIC_NONZERO_FAILED", "CountedRows", "PendingVectors", "VectorsBuilder", "rows_to_input_order", "to_csr"]

# (silent: expected on torch < 2.6, and the fall-back costs one host sync a batch)
STATIC_NONZERO_FAILED = failure_memory("encode.nonzero_static", "torch.nonzero_static on CUDA",
                                       "torch.nonzero runs (one host sync a batch)", warn=False)
ASYNC_MIN_NNZ = 1 << 18  # smaller results (~700 passages) are copied to the host at once


def _prune(y: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """Zero all but each row's ``top_k`` largest weights (ties: lower term id)."""
    V = y.shape[1]
    if top_k is None or top_k >= V:
        return y
    kth = torch.topk(y, top_k, dim=1).values[:, -1:]
    above, tied = y > kth, y == kth
    room = top_k - above.sum(1, keepdim=True)
    return torch.where(above | (tied & (torch.cumsum(tied, 1) <= room)), y, torch.zeros((), dtype=y.dtype, device=y.device))


def to_csr(y: torch.Tensor, top_k: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, V] weights -> (row lengths int64 [B], term ids int32 [nnz], weights float32 [nnz]), rows in
    order and terms ascending; with ``top_k`` only each row's k largest (ties: lower term id) survive.
    One host sync (the number of non-zeros); ``CountedRows`` splits it around the next batch's launch."""
    return CountedRows(y, top_k).csr()


class CountedRows:
    """``to_csr`` in two steps: construction queues the pruning and the per-row counts and sends their
    total to the host behind an event; ``csr()`` waits for that event only (not for work queued after
    it) and queues the extraction with the count known, so nothing else syncs (``torch.nonzero_static``)."""

    def __init__(self, y: torch.Tensor, top_k: int | None) -> None:
        # (the caller checks finiteness before pruning, which could drop a NaN unseen)
        self.y = _prune(y, top_k)
        self.counts = torch.count_nonzero(self.y, dim=1)  # int64 [B]; NaN counts, as in nonzero
        self._event = None
        if self.y.is_cuda:
            self._total = torch.empty((), dtype=torch.int64, pin_memory=True)
            self._total.copy_(self.counts.sum(), non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._total = self.counts.sum()

    def csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(row lengths int64 [B], term ids int32 [nnz], weights float32 [nnz]), as ``to_csr``."""
        if self._event is not None:
            self._event.synchronize()
        nz = _nonzero(self.y, int(self._total))  # row-major: rows in order, term ids ascending
        values = self.y[nz[:, 0], nz[:, 1]].float()
        return self.counts, nz[:, 1].to(torch.int32), values


def _nonzero(y: torch.Tensor, total: int) -> torch.Tensor:
    """torch.nonzero(y), which has ``total`` rows, without its host sync where torch can (CUDA, torch >= 2.6)."""
    if y.is_cuda and not STATIC_NONZERO_FAILED.failed:
        try:
            return torch.nonzero_static(y, size=total)
        except (NotImplementedError, AttributeError) as e:  # no CUDA kernel (or no such op) in this torch
            STATIC_NONZERO_FAILED.record(e)
    return torch.nonzero(y)


def rows_to_input_order(counts: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, order: torch.Tensor,
                        ids: Sequence[str], vocab_size: int, finite: torch.Tensor | None = None,
                        nan_error: str = "NaN/Inf weights", *, async_min_nnz: int | None = None) -> PendingVectors:
    """CSR rows in batch order (``counts`` int64 [n] terms per row, ``indices`` / ``values`` [nnz]; row j is
    text ``order[j]``, a permutation of 0..n-1 on the CPU) -> the vectors on their way to the host
    (``PendingVectors``: ``result()`` is the SparseVectors, row i = text i with id ``ids[i]``).
    ``finite``: a bool scalar on the device, checked when the result is read (no sync here): False raises
    FloatingPointError(``nan_error``). ``async_min_nnz``: see ``PendingVectors``."""
    n = order.numel()
    position = torch.empty_like(order)
    position[order] = torch.arange(n)  # text i is row position[i]
    if counts.is_cuda:  # from pinned memory: no wait for the queued batches
        position = position.pin_memory().to(counts.device, non_blocking=True)
    lens = counts[position]
    starts = torch.cumsum(counts, 0) - counts
    _, src = ragged_positions(starts[position], lens, total=indices.numel())
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(lens, 0, out=indptr[1:])
    return PendingVectors(indptr, indices[src], values[src], ids, vocab_size, finite, nan_error,
                          async_min_nnz=async_min_nnz)


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return per_device("encode.copy_stream", index, lambda: torch.cuda.Stream(device=index))


class PendingVectors:
    """CSR arrays on their way from the device to the host: copied into pinned buffers on a side stream
    (the compute stream goes on with the next batches); ``wait()`` / ``result()`` block until they are
    there. On the CPU they are simply the arrays. The device arrays are kept until the copy is done, so
    their memory is not reused under it. Device results with fewer than ``async_min_nnz`` terms are copied at
    once instead (a plain copy is quicker for a few queries; None: ``ASYNC_MIN_NNZ``)."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, ids: Sequence[str],
                 vocab_size: int, finite: torch.Tensor | None = None, nan_error: str = "NaN/Inf weights", *,
                 async_min_nnz: int | None = None) -> None:
        self.ids, self.vocab_size, self._nan_error = ids, vocab_size, nan_error
        arrays = (indptr, indices, values) + (() if finite is None else (finite.reshape(1),))
        self._device: tuple[torch.Tensor, ...] | None = arrays
        self._event = None
        if indptr.is_cuda and indices.numel() < (ASYNC_MIN_NNZ if async_min_nnz is None else async_min_nnz):
            self._host = tuple(t.cpu() for t in arrays)
        elif indptr.is_cuda:
            stream = _copy_stream(indptr.device)
            stream.wait_stream(torch.cuda.current_stream(indptr.device))
            with torch.cuda.stream(stream):
                self._host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                                   for t in arrays)
                self._event = torch.cuda.Event()
                self._event.record(stream)
        else:
            self._host = arrays

    @property
    def n(self) -> int:
        return len(self.ids)

    def wait(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indptr, indices, values) on the host (pinned when they came from a GPU: copy them before
        keeping them); raises FloatingPointError if the model produced NaN/Inf."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        self._device = None  # the copy is done: the device memory may be reused
        if len(self._host) == 4 and not bool(self._host[3][0]):
            raise FloatingPointError(self._nan_error)
        return self._host[0], self._host[1], self._host[2]

    def result(self) -> SparseVectors:
        """The SparseVectors, in pageable host memory."""
        arrays = self.wait()
        if arrays[0].is_pinned():  # pinned memory is scarce: hand out ordinary copies
            arrays = tuple(torch.empty(t.shape, dtype=t.dtype).copy_(t) for t in arrays)
        return SparseVectors(*arrays, self.ids, self.vocab_size, validate=False)


class VectorsBuilder:
    """Stacks the windows of one long call (``PendingVectors`` in order) into one SparseVectors without a
    final concatenation: each window is copied once, from its pinned buffers into arrays sized from the
    first window's non-zeros per row (grown by copying when a later window needs more; the slack is never
    written, so it takes no physical memory)."""

    def __init__(self, n: int, ids: Sequence[str], vocab_size: int) -> None:
        self.ids, self.vocab_size = ids, vocab_size
        self._indptr = torch.zeros(n + 1, dtype=torch.int64)
        self._indices = self._values = None
        self._rows = self._nnz = 0

    def append(self, window: PendingVectors) -> None:
        indptr, indices, values = window.wait()
        k, z = window.n, indices.numel()
        if self._indices is None or self._nnz + z > self._indices.numel():
            grown = max(self._nnz + z, -(-z * (self._indptr.numel() - 1) // max(k, 1)) * 9 // 8,
                        0 if self._indices is None else self._indices.numel() * 5 // 4)
            self._indices, self._values = (self._grow(self._indices, grown, torch.int32),
                                           self._grow(self._values, grown, torch.float32))
        self._indices[self._nnz:self._nnz + z].copy_(indices)
        self._values[self._nnz:self._nnz + z].copy_(values)
        torch.add(indptr[1:], self._nnz, out=self._indptr[self._rows + 1:self._rows + k + 1])
        self._rows, self._nnz = self._rows + k, self._nnz + z

    def _grow(self, old: torch.Tensor | None, size: int, dtype: torch.dtype) -> torch.Tensor:
        new = torch.empty(size, dtype=dtype)
        if old is not None:
            new[:self._nnz].copy_(old[:self._nnz])
        return new

    def result(self) -> SparseVectors:
        if self._rows != self._indptr.numel() - 1:
            raise RuntimeError(f"got {self._rows} of {self._indptr.numel() - 1} rows")
        empty = torch.empty(0)
        indices = self._indices[:self._nnz] if self._indices is not None else empty.to(torch.int32)
        values = self._values[:self._nnz] if self._values is not None else empty
        return SparseVectors(self._indptr, indices, values, self.ids, self.vocab_size, validate=False)
