"""What every kernel module shares: the optional Triton import, backend choice and launcher argument checks.

Each stage keeps its own kernels (``lsr.encode.kernels``, ``lsr.search.kernels``); this module holds only
the few stage-neutral pieces they all need, so that no kernel module imports another stage's private names.

* ``triton`` / ``tl``: the Triton modules, or ``None`` where Triton is not installed (CPU without the
  ``triton`` extra: the torch twins run instead).
* ``INTERPRET``: whether Triton runs in interpreter mode (``TRITON_INTERPRET=1``, set before import; this
  is how CPU CI runs the kernels).
* ``use_triton(backend, device)``: resolves ``"auto" | "triton" | "torch"`` for one call.
* ``check_tensor(name, t, ...)``: one launcher check of dtype, rank, shape, device and contiguity.
* ``grouped_program_ids`` (Triton): the grouped program-id order that lets GROUP rows share one tile of
  the other operand while it is in L2.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

try:  # triton is optional on CPU (only the interpreter-mode tests need it)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["INTERPRET", "KERNEL_IMPLS", "check_tensor", "fold_row_max", "grouped_program_ids", "triton", "tl", "use_triton"]

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
KERNEL_IMPLS = ("auto", "triton", "torch")   # a kernel call's implementation (not the search backends)


def use_triton(backend: str, device: torch.device) -> bool:
    """True when a kernel call on ``device`` should take the Triton path for ``backend``.

    ``"auto"`` means Triton on CUDA and the torch twin elsewhere; ``"triton"`` insists (CUDA, or the CPU in
    interpreter mode) and raises otherwise; ``"torch"`` always takes the twin.
    """
    if backend not in KERNEL_IMPLS:
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "torch":
        return False
    if backend == "auto":
        return device.type == "cuda" and triton is not None
    if triton is None:
        raise RuntimeError("backend='triton' needs the triton package (pip install 'lsr-gpu[triton]')")
    if device.type != "cuda" and not INTERPRET:
        raise RuntimeError("backend='triton' needs a CUDA tensor, or TRITON_INTERPRET=1 on the CPU "
                           "(interpreter mode, set before lsr is imported)")
    return True


def check_tensor(name: str, t: torch.Tensor | None, *, dtype: torch.dtype | Sequence[torch.dtype] | None = None,
                 shape: Sequence[int | None] | None = None, ndim: int | None = None,
                 device: torch.device | None = None, contiguous: bool = False, rows_contiguous: bool = False) -> None:
    """Raise ValueError naming ``name`` unless ``t`` has the expected dtype / shape / device / layout.

    ``shape`` entries of ``None`` match any size; ``ndim`` alone checks the rank; ``rows_contiguous``
    asks only that the last dimension be dense (stride 1), as row-wise kernels need.
    """
    if t is None:
        raise ValueError(f"{name} is required")
    dtypes = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype or ())
    problems = []
    if dtypes and t.dtype not in dtypes:
        problems.append(f"dtype {' or '.join(str(d) for d in dtypes)} (got {t.dtype})")
    if shape is not None and (t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape))):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        problems.append(f"shape [{want}] (got {list(t.shape)})")
    elif ndim is not None and t.dim() != ndim:
        problems.append(f"{ndim} dimension(s) (got {t.dim()})")
    if device is not None and t.device != torch.device(device):
        problems.append(f"device {device} (got {t.device})")
    if contiguous and not t.is_contiguous():
        problems.append("contiguous memory")
    if rows_contiguous and t.dim() > 0 and t.numel() > 0 and t.stride(-1) != 1:
        problems.append("contiguous rows")
    if problems:
        raise ValueError(f"{name} must have " + ", ".join(problems))


if triton is not None:

    @triton.jit
    def grouped_program_ids(pid, n_rows, n_cols, GROUP: tl.constexpr):
        """Map a flat program id to (row, col) so that GROUP consecutive rows sweep the columns together.

        Programs that run side by side then share each column tile (e.g. a vocabulary tile of E) while it
        is in L2, and each row's operand is reused by all the columns that follow.
        """
        per_group = GROUP * n_cols
        first_row = (pid // per_group) * GROUP
        group_size = tl.minimum(n_rows - first_row, GROUP)
        row = first_row + (pid % per_group) % group_size
        col = (pid % per_group) // group_size
        return row, col

    @triton.jit
    def fold_row_max(acc, keep, run_max, run_arg, col0, STORE_ARGMAX: tl.constexpr):
        """Fold a [rows, cols] tile into each row's running max over columns; columns where ``keep`` is
        False never win. With STORE_ARGMAX also the winning column (tile column + ``col0``; ties keep the
        earliest column, so a scan in column order finds the first maximum)."""
        acc = tl.where(keep[None, :], acc, float("-inf"))
        if STORE_ARGMAX:
            t_max, t_arg = tl.max(acc, axis=1, return_indices=True)
            better = t_max > run_max  # strict
            run_max = tl.where(better, t_max, run_max)
            run_arg = tl.where(better, t_arg + col0, run_arg)
        else:  # inference: the max alone is a cheaper epilogue
            run_max = tl.maximum(run_max, tl.max(acc, axis=1))
        return run_max, run_arg
else:  # pragma: no cover
    grouped_program_ids = fold_row_max = None
