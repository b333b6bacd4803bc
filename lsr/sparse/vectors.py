"""``SparseVectors``: the CSR container every stage of lsr exchanges (the contract: ``lsr.sparse``).

The checks live in ``lsr.sparse.checks`` and the COO / dict builders in ``lsr.sparse.build``; this module
holds the container: construction, row selection, concatenation and the conversions to other forms.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lsr.sparse.build import coo_to_csr, dicts_to_coo
from lsr.sparse.checks import TensorLike, as_tensor, validate_csr
from lsr.utils.ragged import ragged_positions, segment_ids

__all__ = ["SparseVectors"]


class SparseVectors:
    """A batch of sparse vectors in CSR form, with string ids.

    Args:
        indptr: int64 [n+1], indptr[0] == 0, non-decreasing, indptr[-1] == nnz.
        indices: int32 [nnz] term ids, unique and ascending within each row, in [0, vocab_size).
        values: float32 [nnz] weights, finite and > 0.
        ids: n unique strings (default "0".."n-1").
        vocab_size: size of the term space (default max index + 1).
        validate: run the checks (set False only for arrays produced by lsr itself).

    Raises:
        ValueError: for any violation of the contract, naming the first offending row.
    """

    __slots__ = ("indptr", "indices", "values", "ids", "vocab_size", "_host_indptr")

    def __init__(
        self,
        indptr: TensorLike,
        indices: TensorLike,
        values: TensorLike,
        ids: Sequence[str] | None = None,
        vocab_size: int | None = None,
        *,
        device: str | torch.device | None = None,
        validate: bool = True,
    ) -> None:
        dev = torch.device(device) if device is not None else None
        self.indptr = as_tensor(indptr, torch.int64, dev, "indptr")
        dev = self.indptr.device
        self.indices = as_tensor(indices, torch.int32, dev, "indices")
        self.values = as_tensor(values, torch.float32, dev, "values")
        n = self.indptr.numel() - 1
        if ids is None:
            ids = [str(i) for i in range(max(n, 0))]
        if isinstance(ids, (str, bytes)):   # list("ab") would make the ids "a", "b"
            raise TypeError(f"ids must be a sequence of strings, got one {type(ids).__name__}")
        ids = list(ids)
        if None in ids:   # str(None) would pass as the id "None"
            raise ValueError(f"row {ids.index(None)} has no id (None); every vector needs a string id")
        self.ids = [str(i) for i in ids]
        if vocab_size is None:
            vocab_size = int(self.indices.max()) + 1 if self.indices.numel() else 0
        self.vocab_size = int(vocab_size)
        if validate:
            self.validate()

    def validate(self) -> None:
        """Check the CSR contract; raise ValueError describing the first violation."""
        validate_csr(self.indptr, self.indices, self.values, self.ids, self.vocab_size)

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return self.indptr.numel() - 1

    @property
    def n_rows(self) -> int:
        return len(self)

    @property
    def nnz(self) -> int:
        return self.indices.numel()

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def lengths(self) -> torch.Tensor:
        """int64 [n] number of non-zeros per row."""
        return self.indptr[1:] - self.indptr[:-1]

    def row_ids(self) -> torch.Tensor:
        """int64 [nnz] row of every non-zero (COO row index)."""
        return segment_ids(self.lengths)

    def to(self, device: str | torch.device) -> SparseVectors:
        return SparseVectors(self.indptr.to(device), self.indices.to(device), self.values.to(device),
                             self.ids, self.vocab_size, validate=False)

    def __repr__(self) -> str:
        return f"SparseVectors(n={len(self)}, nnz={self.nnz}, vocab_size={self.vocab_size}, device={self.device})"

    def __getitem__(self, rows: int | slice | Sequence[int] | torch.Tensor) -> SparseVectors:
        """Select rows (int, slice, index list/tensor or boolean mask); order follows the selection."""
        n = len(self)
        if isinstance(rows, int):
            rows = [rows]
        if isinstance(rows, slice):
            start, stop, step = rows.indices(n)
            if step == 1:
                stop = max(stop, start)
                a, b = self._row_bounds(start, stop)
                return SparseVectors._of_rows(self.indptr[start:stop + 1] - a, self.indices[a:b], self.values[a:b],
                                              self.ids[start:stop], self.vocab_size)
            rows = range(start, stop, step)
        sel = torch.as_tensor(rows if isinstance(rows, torch.Tensor) else list(rows), device=self.device)
        if sel.dtype == torch.bool:
            sel = torch.nonzero(sel).flatten()
        sel = sel.to(torch.int64)
        sel = torch.where(sel < 0, sel + n, sel)
        lens = self.lengths[sel]
        new_ptr = torch.zeros(sel.numel() + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(lens, 0, out=new_ptr[1:])
        _, src = ragged_positions(self.indptr[sel], lens)
        ids = [self.ids[i] for i in sel.tolist()]
        return SparseVectors(new_ptr, self.indices[src], self.values[src], ids, self.vocab_size, validate=False)

    HOST_INDPTR_MAX = 1 << 20   # rows up to which a CUDA indptr's host copy is kept for slicing (8 MB)

    def _row_bounds(self, start: int, stop: int) -> tuple[int, int]:
        """indptr[start], indptr[stop] as ints. A CUDA indptr of up to HOST_INDPTR_MAX rows is read once and its
        host copy kept while the tensor is the same object, unmodified (its in-place version counter and data pointer;
        writes that bypass the counter, through ``.data`` or a foreign alias, are not seen: vectors are read-only): slicing
        batches out of a query set then costs no device read each, a synchronising read that was a large share of a
        small search's host time (measured on the search performance page). Longer ones, and inference tensors
        (no version counter), read the rows' ends in one copy."""
        ip = self.indptr
        if not ip.is_cuda:
            return int(ip[start]), int(ip[stop])
        if ip.numel() > self.HOST_INDPTR_MAX or ip.is_inference():
            ends = (ip[start:stop + 1] if stop - start <= 4096 else ip[[start, stop]]).cpu()
            return int(ends[0]), int(ends[-1])
        held = getattr(self, "_host_indptr", None)
        key = (ip._version, ip.data_ptr())
        if held is None or held[0]() is not ip or held[1] != key:
            # a weak reference: a replaced indptr is not kept alive; a NumPy element read is far cheaper than a
            # tensor's
            held = (weakref.ref(ip), key, ip.cpu().numpy())
            self._host_indptr = held
        return int(held[2][start]), int(held[2][stop])

    def __getstate__(self) -> dict[str, Any]:
        """The vectors without the host copy of ``_row_bounds``: a rebuilt tensor restarts its version counter, so a
        copy carried through pickle or deepcopy could pass the check with offsets of an earlier state."""
        return {k: getattr(self, k) for k in self.__slots__ if k != "_host_indptr" and hasattr(self, k)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    @classmethod
    def _of_rows(cls, indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, ids: list[str],
                 vocab_size: int) -> SparseVectors:
        """Rows taken from vectors that were checked already (tensors of the right dtypes on one device, ids a list
        of strings): no conversion or check, as slicing a batch out of a query set takes a search's time."""
        out = cls.__new__(cls)
        out.indptr, out.indices, out.values, out.ids, out.vocab_size = indptr, indices, values, ids, vocab_size
        return out

    @staticmethod
    def concat(parts: Sequence[SparseVectors]) -> SparseVectors:
        """Stack rows of several batches of one vocabulary size; ids must stay unique."""
        if not parts:
            raise ValueError("nothing to concatenate")
        sizes = sorted({p.vocab_size for p in parts})
        if len(sizes) > 1:  # rows of different encoders do not share term ids: joining them would mix terms up
            raise ValueError(f"cannot concatenate vectors of vocabulary sizes {' and '.join(map(str, sizes))}; "
                             "encode all of them with one encoder")
        vocab = sizes[0]
        dev = parts[0].device
        offs = np.cumsum([0] + [p.nnz for p in parts])
        indptr = torch.cat([parts[0].indptr[:1].to(dev)] + [p.indptr[1:].to(dev) + int(o) for p, o in zip(parts, offs)])
        ids = [i for p in parts for i in p.ids]
        out = SparseVectors(indptr, torch.cat([p.indices.to(dev) for p in parts]),
                            torch.cat([p.values.to(dev) for p in parts]), ids, vocab, validate=False)
        if len(set(ids)) != len(ids):
            out.validate()  # raises with the duplicate id
        return out

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_coo(
        cls,
        rows: TensorLike,
        cols: TensorLike,
        vals: TensorLike,
        n_rows: int,
        ids: Sequence[str] | None = None,
        vocab_size: int | None = None,
        *,
        reduce: str = "sum",
        drop_zeros: bool = True,
        device: str | torch.device | None = None,
    ) -> SparseVectors:
        """Build from unsorted (row, term, weight) triples; duplicates are merged by ``reduce``
        ("sum" or "max"); zero weights are dropped. Negative or NaN weights still raise."""
        indptr, indices, values, vocab_size = coo_to_csr(rows, cols, vals, n_rows, vocab_size, reduce=reduce,
                                                         drop_zeros=drop_zeros, device=device)
        return cls(indptr, indices, values, ids, vocab_size)

    @classmethod
    def from_dense(cls, dense: torch.Tensor, ids: Sequence[str] | None = None) -> SparseVectors:
        """[n, V] dense weights -> SparseVectors (zeros dropped)."""
        rows, cols = torch.nonzero(dense, as_tuple=True)
        return cls.from_coo(rows, cols, dense[rows, cols].float(), dense.shape[0], ids, dense.shape[1])

    @classmethod
    def from_dicts(
        cls,
        rows: Iterable[Mapping[Any, float]],
        vocab: Mapping[str, int] | None = None,
        ids: Sequence[str] | None = None,
        vocab_size: int | None = None,
        *,
        unknown: str = "error",
    ) -> SparseVectors:
        """Build from token->weight (or term id->weight) dicts.

        With ``vocab`` the keys are tokens mapped through it; a token not in the vocabulary raises
        (``unknown="error"``) or is skipped (``unknown="drop"``)."""
        r, c, v, n, vocab_size = dicts_to_coo(rows, vocab, vocab_size, unknown=unknown)
        return cls.from_coo(r, c, v, n, ids, vocab_size)

    def to_dicts(self, vocab: Sequence[str] | None = None) -> list[dict[Any, float]]:
        """Rows as {token or term id: weight} dicts (``vocab`` maps id -> token)."""
        ip = self.indptr.cpu().numpy()
        ix = self.indices.cpu().numpy()
        val = self.values.cpu().numpy()
        out = []
        for i in range(len(self)):
            a, b = ip[i], ip[i + 1]
            keys = ix[a:b].tolist() if vocab is None else [vocab[t] for t in ix[a:b]]
            out.append(dict(zip(keys, val[a:b].tolist())))
        return out

    # ------------------------------------------------------------------ conversions
    def to_torch_sparse(self, layout: torch.layout = torch.sparse_csr) -> torch.Tensor:
        """[n, vocab_size] float32 torch sparse tensor (CSR by default, or sparse_coo)."""
        size = (len(self), self.vocab_size)
        if layout == torch.sparse_coo:  # rows in order, terms ascending within a row: already coalesced
            coords = torch.stack([self.row_ids(), self.indices.to(torch.int64)])
            return torch.sparse_coo_tensor(coords, self.values, size=size, is_coalesced=True, check_invariants=False)
        with warnings.catch_warnings():  # torch's "CSR support is in beta" notice is not the user's concern
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return torch.sparse_csr_tensor(self.indptr, self.indices.to(torch.int64), self.values, size=size,
                                           check_invariants=False)  # validated at construction

    @classmethod
    def from_torch_sparse(cls, t: torch.Tensor, ids: Sequence[str] | None = None) -> SparseVectors:
        if t.layout == torch.sparse_csr:
            t = t.to_sparse_coo()
        t = t.coalesce()
        rows, cols = t.indices()
        return cls.from_coo(rows, cols, t.values().float(), t.shape[0], ids, t.shape[1])

    def to_dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[n, vocab_size] dense tensor (mind the memory: n * vocab_size * itemsize)."""
        out = torch.zeros(len(self), self.vocab_size, dtype=dtype, device=self.device)
        out[self.row_ids(), self.indices.long()] = self.values.to(dtype)
        return out

    def prune_top_k(self, k: int) -> SparseVectors:
        """Keep the k largest weights of each row (ties: lower term id first)."""
        if k <= 0:
            raise ValueError("k must be positive")
        row = self.row_ids()
        # order by (row, -weight, term): a stable sort on weight, then a stable sort on row
        order = torch.sort(self.values, descending=True, stable=True).indices
        order = order[torch.sort(row[order], stable=True).indices]
        _, rank = ragged_positions(torch.zeros_like(self.lengths), self.lengths, self.nnz)
        keep = order[rank < k]
        return SparseVectors.from_coo(row[keep], self.indices[keep], self.values[keep], len(self), self.ids,
                                      self.vocab_size)

    def equal(self, other: SparseVectors) -> bool:
        """Exact equality of structure, weights, ids and vocabulary size."""
        return (self.ids == other.ids and self.vocab_size == other.vocab_size
                and torch.equal(self.indptr.cpu(), other.indptr.cpu())
                and torch.equal(self.indices.cpu(), other.indices.cpu())
                and torch.equal(self.values.cpu(), other.values.cpu()))
