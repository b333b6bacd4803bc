"""SparseVectors: the CSR container every stage of lsr exchanges.

Contract (docs/architecture.md): ``indptr`` int64 [n+1], ``indices`` int32 [nnz] unique and ascending within a
row, ``values`` float32 [nnz] > 0 and finite, string ``ids`` (unique), and ``vocab_size`` > every
index. Tensors live on one device (CPU or CUDA); validation runs on that device without Python loops.

Inputs are range-checked before they are narrowed (int64 term ids to int32, float64 weights to
float32), so an out-of-range value raises instead of wrapping. Weights are bounded by
:func:`weight_limit` so that no dot product of two vectors can overflow float32, and ids must be
ids a run file can hold (:func:`lsr.storage.files.check_id`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lsr.storage.files import check_id, first_bad_id
from lsr.utils.ragged import ragged_positions, segment_ids

__all__ = ["SparseVectors", "weight_limit"]

TensorLike = Any  # torch.Tensor | np.ndarray | Sequence
_FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_VOCAB_SIZE = 2**31  # term ids are int32


def weight_limit(vocab_size: int) -> float:
    """Largest weight a vector may hold: ``sqrt(float32 max / (2 * vocab_size))``.

    A dot product sums at most ``vocab_size`` products of two weights, so with both below this limit
    it stays below half the float32 maximum (the other half is headroom for rounding) and a search
    score can never become ``inf`` (for a 30,522-term vocabulary the limit is about 7.5e16).
    """
    return float(np.sqrt(_FLOAT32_MAX / (2.0 * max(int(vocab_size), 1))))


_FIX = {torch.int32: "term ids are stored as int32, so they must be < 2**31",
        torch.int64: "offsets and rows are stored as int64", torch.float32: "rescale the weights"}


def _range_error(name: str, value: float, dtype: torch.dtype) -> ValueError:
    return ValueError(f"{name}: value {value} does not fit {str(dtype).removeprefix('torch.')} (a cast would "
                      f"silently change it); {_FIX[dtype]}")


def _check_fits(name: str, t: torch.Tensor, dtype: torch.dtype) -> None:
    """Raise when narrowing ``t`` to ``dtype`` would change a value (wrap an integer, turn a float into
    inf); NaN / inf are left to :meth:`SparseVectors.validate`, which names their row."""
    if t.dtype in (dtype, torch.bool) or t.numel() == 0 or t.dtype.is_floating_point != dtype.is_floating_point:
        return
    if dtype.is_floating_point:
        if torch.finfo(t.dtype).max > _FLOAT32_MAX:
            high = float(t.abs().max())
            if np.isfinite(high) and high > _FLOAT32_MAX:
                raise _range_error(name, high, dtype)
        return
    info = torch.iinfo(dtype)
    if torch.iinfo(t.dtype).bits > info.bits:
        low, high = int(t.min()), int(t.max())
        if low < info.min or high > info.max:
            raise _range_error(name, low if low < info.min else high, dtype)


def _as_tensor(x: TensorLike, dtype: torch.dtype, device: torch.device | None, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x
    else:
        arr = np.asarray(x)
        if arr.dtype == np.uint64 and arr.size:  # torch has no min / max for uint64: check it here
            if int(arr.max()) > np.iinfo(np.int64).max:
                raise _range_error(name, int(arr.max()), dtype)
            arr = arr.astype(np.int64)
        t = torch.as_tensor(arr)
    if t.dtype.is_floating_point != dtype.is_floating_point and t.numel() > 0:
        raise ValueError(f"{name}: expected a {'floating' if dtype.is_floating_point else 'integer'} array, "
                         f"got {t.dtype}")
    _check_fits(name, t, dtype)
    return t.to(device=device if device is not None else t.device, dtype=dtype).contiguous()


def _check_vocab_size(vocab_size: int) -> None:
    if not 0 <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size {vocab_size} must lie in [0, 2**31]: term ids are stored as int32")


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
        self.indptr = _as_tensor(indptr, torch.int64, dev, "indptr")
        dev = self.indptr.device
        self.indices = _as_tensor(indices, torch.int32, dev, "indices")
        self.values = _as_tensor(values, torch.float32, dev, "values")
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

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check the CSR contract; raise ValueError describing the first violation."""
        ip, ix, val = self.indptr, self.indices, self.values
        if ip.dim() != 1 or ip.numel() < 1:
            raise ValueError("indptr must be a 1-D array of length n_rows + 1 (>= 1)")
        if ix.dim() != 1 or val.dim() != 1 or ix.numel() != val.numel():
            raise ValueError(f"indices ({tuple(ix.shape)}) and values ({tuple(val.shape)}) must be 1-D of equal length")
        n = ip.numel() - 1
        if int(ip[0]) != 0 or int(ip[-1]) != ix.numel():
            raise ValueError(f"indptr must start at 0 and end at nnz={ix.numel()} (got {int(ip[0])}..{int(ip[-1])})")
        lengths = ip[1:] - ip[:-1]
        if n and bool((lengths < 0).any()):
            raise ValueError(f"indptr decreases at row {int(torch.nonzero(lengths < 0)[0])}")
        if len(self.ids) != n:
            raise ValueError(f"got {len(self.ids)} ids for {n} rows")
        bad_id = first_bad_id(self.ids)
        if bad_id is not None:
            check_id(self.ids[bad_id], "id", f"row {bad_id}")
        _check_vocab_size(self.vocab_size)
        if len(set(self.ids)) != n:
            seen: set[str] = set()
            dup = next(i for i in self.ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise ValueError(f"duplicate id {dup!r}")
        if ix.numel() == 0:
            return
        bad = ~torch.isfinite(val)
        if bool(bad.any()):
            raise ValueError(f"non-finite weight (NaN/Inf) in row {self._row_of(bad)}")
        limit = weight_limit(self.vocab_size)
        bad = val > limit
        if bool(bad.any()):
            raise ValueError(f"weight {float(val[bad][0]):.4g} in row {self._row_of(bad)} is above {limit:.4g} = "
                             f"sqrt(float32 max / (2 x vocab_size {self.vocab_size})): a dot product of such weights "
                             "could overflow float32 to inf; rescale the weights")
        bad = val <= 0
        if bool(bad.any()):
            raise ValueError(f"weights must be > 0; row {self._row_of(bad)} has {float(val[bad][0])}"
                             " (drop zeros; negative weights are not supported)")
        bad = (ix < 0) | (ix >= self.vocab_size)
        if bool(bad.any()):
            raise ValueError(f"term id {int(ix[bad][0])} in row {self._row_of(bad)} is outside the vocabulary"
                             f" [0, {self.vocab_size})")
        # ascending and unique within each row: every step that does not start a row must increase
        step_ok = ix[1:] > ix[:-1]
        row_start = torch.zeros(ix.numel(), dtype=torch.bool, device=ix.device)
        starts = ip[:-1][lengths > 0]
        row_start[starts] = True
        bad = ~(step_ok | row_start[1:])
        if bool(bad.any()):
            pos = torch.nonzero(bad)[0] + 1
            mask = torch.zeros_like(row_start)
            mask[pos] = True
            raise ValueError(f"term ids in row {self._row_of(mask)} are not unique and ascending"
                             " (use SparseVectors.from_coo to sort and merge)")

    def _row_of(self, mask: torch.Tensor) -> str:
        pos = int(torch.nonzero(mask)[0])
        row = int(torch.searchsorted(self.indptr, torch.tensor([pos], device=self.indptr.device), right=True)[0]) - 1
        return f"{row} (id {self.ids[row]!r})"

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
        batches out of a query set then costs no device read each (the read took ~50 of a 64-query search's ~140 µs
        of host time before its graph launched; docs/notes-search.md, session 23). Longer ones, and inference tensors
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
            # a weak reference: a replaced indptr is not kept alive; numpy: an element read ~0.1 µs, a tensor's ~2 µs
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
        dev = torch.device(device) if device is not None else None
        r = _as_tensor(rows, torch.int64, dev, "rows")
        c = _as_tensor(cols, torch.int64, r.device, "cols")
        v = _as_tensor(vals, torch.float32, r.device, "vals")
        if vocab_size is None:
            vocab_size = int(c.max()) + 1 if c.numel() else 0
        _check_vocab_size(vocab_size)
        if c.numel() and (int(c.min()) < 0 or int(c.max()) >= vocab_size):
            raise ValueError(f"term ids must lie in [0, {vocab_size})")
        if n_rows < 0:
            raise ValueError(f"n_rows must be >= 0, got {n_rows}")
        if r.numel() and (int(r.min()) < 0 or int(r.max()) >= n_rows):
            raise ValueError(f"row indices must lie in [0, {n_rows}), got {int(r.min())}..{int(r.max())}")
        if v.numel() and not bool(((v >= 0) & torch.isfinite(v)).all()):   # before merging hides one
            raise ValueError("weights must be finite and >= 0 (a negative or NaN triple would be merged away)")
        if n_rows * max(vocab_size, 1) >= 2**63:
            raise ValueError(f"{n_rows} rows x {vocab_size} terms overflow the int64 (row, term) key; split the rows")
        key = r * max(vocab_size, 1) + c
        uniq, inv = torch.unique(key, sorted=True, return_inverse=True)
        merged = torch.zeros(uniq.numel(), dtype=torch.float32, device=r.device)
        if reduce == "sum":
            merged.index_add_(0, inv, v)
        elif reduce == "max":
            merged.fill_(-float("inf")).scatter_reduce_(0, inv, v, reduce="amax")
        else:
            raise ValueError("reduce must be 'sum' or 'max'")
        r_u = uniq // max(vocab_size, 1)
        c_u = uniq % max(vocab_size, 1)
        if drop_zeros:
            keep = merged != 0
            r_u, c_u, merged = r_u[keep], c_u[keep], merged[keep]
        indptr = torch.zeros(n_rows + 1, dtype=torch.int64, device=r.device)
        torch.cumsum(torch.bincount(r_u, minlength=n_rows)[:n_rows], 0, out=indptr[1:])
        return cls(indptr, c_u.to(torch.int32), merged, ids, vocab_size)

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
        rr: list[int] = []
        cc: list[int] = []
        vv: list[float] = []
        n = 0
        for n_i, row in enumerate(rows):
            n = n_i + 1
            for key, w in row.items():
                if vocab is not None:
                    tid = vocab.get(key)
                    if tid is None:
                        if unknown == "drop":
                            continue
                        raise ValueError(f"token {key!r} (row {n_i}) is not in the vocabulary")
                else:
                    tid = int(key)
                rr.append(n_i)
                cc.append(tid)
                vv.append(float(w))
        if vocab_size is None and vocab is not None:
            vocab_size = max(vocab.values()) + 1 if len(vocab) else 0
        v = np.asarray(vv, dtype=np.float32)
        if v.size and (not np.isfinite(v).all() or (v < 0).any()):
            bad = int(np.nonzero(~np.isfinite(v) | (v < 0))[0][0])
            raise ValueError(f"row {rr[bad]} has an invalid weight {vv[bad]!r} (must be finite and >= 0)")
        return cls.from_coo(np.asarray(rr, np.int64), np.asarray(cc, np.int64), v, n, ids, vocab_size)

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
        csr = torch.sparse_csr_tensor(self.indptr, self.indices.to(torch.int64), self.values, size=size,
                                      check_invariants=False)  # validated at construction
        return csr if layout == torch.sparse_csr else csr.to_sparse_coo().coalesce()

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
