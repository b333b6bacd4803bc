"""The checks of the ``SparseVectors`` contract: conversions that refuse to change a value, and validation.

Inputs are range-checked before they are narrowed (int64 term ids to int32, float64 weights to
float32), so an out-of-range value raises instead of wrapping. Weights are bounded by
:func:`weight_limit` so that no dot product of two vectors can overflow float32, and ids must be
ids a run file can hold (:func:`lsr.utils.ids.check_id`). Validation runs on the tensors' device
without Python loops over rows; every error names the first offending row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lsr.utils.ids import check_id, first_bad_id

__all__ = ["MAX_VOCAB_SIZE", "TensorLike", "as_tensor", "check_fits", "check_vocab_size", "range_error",
           "validate_csr", "weight_limit"]

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


def range_error(name: str, value: float, dtype: torch.dtype) -> ValueError:
    """The one-line error for a value of ``name`` that ``dtype`` cannot hold."""
    return ValueError(f"{name}: value {value} does not fit {str(dtype).removeprefix('torch.')} (a cast would "
                      f"silently change it); {_FIX[dtype]}")


def check_fits(name: str, t: torch.Tensor, dtype: torch.dtype) -> None:
    """Raise when narrowing ``t`` to ``dtype`` would change a value (wrap an integer, turn a float into
    inf); NaN / inf are left to :meth:`SparseVectors.validate`, which names their row."""
    if t.dtype in (dtype, torch.bool) or t.numel() == 0 or t.dtype.is_floating_point != dtype.is_floating_point:
        return
    if dtype.is_floating_point:
        if torch.finfo(t.dtype).max > _FLOAT32_MAX:
            high = float(t.abs().max())
            if np.isfinite(high) and high > _FLOAT32_MAX:
                raise range_error(name, high, dtype)
        return
    info = torch.iinfo(dtype)
    if torch.iinfo(t.dtype).bits > info.bits:
        low, high = int(t.min()), int(t.max())
        if low < info.min or high > info.max:
            raise range_error(name, low if low < info.min else high, dtype)


def as_tensor(x: TensorLike, dtype: torch.dtype, device: torch.device | None, name: str) -> torch.Tensor:
    """``x`` as a contiguous ``dtype`` tensor on ``device`` (default: where it is), range-checked before narrowing."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        arr = np.asarray(x)
        if arr.dtype == np.uint64 and arr.size:  # torch has no min / max for uint64: check it here
            if int(arr.max()) > np.iinfo(np.int64).max:
                raise range_error(name, int(arr.max()), dtype)
            arr = arr.astype(np.int64)
        t = torch.as_tensor(arr)
    if t.dtype.is_floating_point != dtype.is_floating_point and t.numel() > 0:
        raise ValueError(f"{name}: expected a {'floating' if dtype.is_floating_point else 'integer'} array, "
                         f"got {t.dtype}")
    check_fits(name, t, dtype)
    return t.to(device=device if device is not None else t.device, dtype=dtype).contiguous()


def check_vocab_size(vocab_size: int) -> None:
    """Term ids are int32: a vocabulary of at most 2**31 terms."""
    if not 0 <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size {vocab_size} must lie in [0, 2**31]: term ids are stored as int32")


def validate_csr(ip: torch.Tensor, ix: torch.Tensor, val: torch.Tensor, ids: Sequence[str], vocab_size: int) -> None:
    """Check the CSR contract of (indptr, indices, values, ids, vocab_size); raise ValueError describing the
    first violation."""
    _check_structure(ip, ix, val, ids, vocab_size)
    if ix.numel():
        _check_entries(ip, ix, val, ids, vocab_size)


def _check_structure(ip: torch.Tensor, ix: torch.Tensor, val: torch.Tensor, ids: Sequence[str],
                     vocab_size: int) -> None:
    """Shapes, offsets, ids and the vocabulary size."""
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
    if len(ids) != n:
        raise ValueError(f"got {len(ids)} ids for {n} rows")
    bad_id = first_bad_id(ids)
    if bad_id is not None:
        check_id(ids[bad_id], "id", f"row {bad_id}")
    check_vocab_size(vocab_size)
    if len(set(ids)) != n:
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate id {dup!r}")


def _check_entries(ip: torch.Tensor, ix: torch.Tensor, val: torch.Tensor, ids: Sequence[str], vocab_size: int) -> None:
    """Weights finite, positive and below ``weight_limit``; term ids in the vocabulary, unique and ascending
    within each row."""
    lengths = ip[1:] - ip[:-1]
    bad = ~torch.isfinite(val)
    if bool(bad.any()):
        raise ValueError(f"non-finite weight (NaN/Inf) in row {_row_of(ip, ids, bad)}")
    limit = weight_limit(vocab_size)
    bad = val > limit
    if bool(bad.any()):
        raise ValueError(f"weight {float(val[bad][0]):.4g} in row {_row_of(ip, ids, bad)} is above {limit:.4g} = "
                         f"sqrt(float32 max / (2 x vocab_size {vocab_size})): a dot product of such weights "
                         "could overflow float32 to inf; rescale the weights")
    bad = val <= 0
    if bool(bad.any()):
        raise ValueError(f"weights must be > 0; row {_row_of(ip, ids, bad)} has {float(val[bad][0])}"
                         " (drop zeros; negative weights are not supported)")
    bad = (ix < 0) | (ix >= vocab_size)
    if bool(bad.any()):
        raise ValueError(f"term id {int(ix[bad][0])} in row {_row_of(ip, ids, bad)} is outside the vocabulary"
                         f" [0, {vocab_size})")
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
        raise ValueError(f"term ids in row {_row_of(ip, ids, mask)} are not unique and ascending"
                         " (use SparseVectors.from_coo to sort and merge)")


def _row_of(ip: torch.Tensor, ids: Sequence[str], mask: torch.Tensor) -> str:
    """The row (and its id) of the first non-zero flagged in ``mask``."""
    pos = int(torch.nonzero(mask)[0])
    row = int(torch.searchsorted(ip, torch.tensor([pos], device=ip.device), right=True)[0]) - 1
    return f"{row} (id {ids[row]!r})"
