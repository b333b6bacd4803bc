"""Building CSR arrays from other forms: unsorted (row, term, weight) triples and token -> weight dicts.

``SparseVectors.from_coo`` / ``from_dicts`` (and through them ``from_dense``, ``from_torch_sparse`` and
``prune_top_k``) are these functions followed by the contract's checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from lsr.sparse.checks import TensorLike, as_tensor, check_vocab_size

__all__ = ["coo_to_csr", "dicts_to_coo"]


def coo_to_csr(rows: TensorLike, cols: TensorLike, vals: TensorLike, n_rows: int, vocab_size: int | None, *,
               reduce: str = "sum", drop_zeros: bool = True, device: str | torch.device | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(indptr int64, indices int32, values float32, vocab_size) of the triples, sorted by (row, term);
    duplicates merged by ``reduce`` ("sum" or "max"), zeros dropped when ``drop_zeros``. Negative or NaN
    weights raise before merging could hide them."""
    dev = torch.device(device) if device is not None else None
    r = as_tensor(rows, torch.int64, dev, "rows")
    c = as_tensor(cols, torch.int64, r.device, "cols")
    v = as_tensor(vals, torch.float32, r.device, "vals")
    if vocab_size is None:
        vocab_size = int(c.max()) + 1 if c.numel() else 0
    check_vocab_size(vocab_size)
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
    return indptr, c_u.to(torch.int32), merged, vocab_size


def dicts_to_coo(rows: Iterable[Mapping[Any, float]], vocab: Mapping[str, int] | None, vocab_size: int | None, *,
                 unknown: str = "error") -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int | None]:
    """(rows, terms, weights, n_rows, vocab_size) of token -> weight (or term id -> weight) dicts; with
    ``vocab`` a token not in it raises (``unknown="error"``) or is skipped (``unknown="drop"``)."""
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
    return np.asarray(rr, np.int64), np.asarray(cc, np.int64), v, n, vocab_size
