"""The k largest keys of short rows, sorted, in one CUDA kernel: one CTA per row, a bitonic sort in shared memory.

Why: the block path selects the best k + margin coarse keys of each query from a gather buffer of a few thousand
slots, and the best k of its k + margin rescored keys; ``torch.topk`` does each as a radix select plus a separate sort
(two or more kernels, several times this kernel's time: docs/performance/search.md). A row of
up to ``MAX_ROW`` int64 keys fits one CTA's shared memory. Keys are unique in the block path, and equal keys are
interchangeable anyway, so the output is the twin's bit for bit.

``torch_row_topk`` is the twin (``torch.topk``). Compiled at first use with NVRTC, like
lsr.search.kernels.rescore_cuda; not runnable under TRITON_INTERPRET (CPU CI tests the twin and the callers' torch
paths, the ``gpu`` tests compare the kernel with the twin bit for bit).
"""

from __future__ import annotations

import torch

from lsr.search.kernels import nvrtc_available, nvrtc_kernel

__all__ = ["MAX_ROW", "available", "cuda_row_topk", "row_topk", "torch_row_topk", "usable"]

MAX_ROW = 4096      # keys a row may hold: 32 KB of shared memory, under the 48 KB a launch gets without opting in
_THREADS = 1024     # per CTA: two compare-exchanges a thread and step for a 4,096-key row


def _kernel(device_index: int):
    return nvrtc_kernel("row_topk.cu", "lsr_row_topk", device_index)


def available(device: torch.device) -> bool:
    """Whether the kernel compiles and runs on ``device`` (a CUDA device with NVRTC)."""
    return nvrtc_available("row_topk.cu", "lsr_row_topk", device)


def usable(keys: torch.Tensor) -> bool:
    """Whether ``cuda_row_topk`` takes these keys: a CUDA int64 [B, C] tensor, C <= MAX_ROW, and ``available``."""
    return keys.dtype == torch.int64 and keys.dim() == 2 and keys.shape[1] <= MAX_ROW and available(keys.device)


def cuda_row_topk(keys: torch.Tensor, k: int, count: torch.Tensor | None = None) -> torch.Tensor:
    """The k largest of each row's first ``count[b]`` keys (all C without ``count``), descending, -1 padding.

    Args:
        keys: int64 [B, C] on CUDA, C <= MAX_ROW; keys >= 0, or -1 = none (the padding the result uses).
        k: keys to return a row (may exceed C: -1 padding).
        count: optional int32 [B]: the row's valid prefix (slots past it are not read).
    Returns:
        int64 [B, k].
    """
    if keys.dtype != torch.int64 or keys.dim() != 2 or not keys.is_cuda:
        raise ValueError("keys must be an int64 [B, C] CUDA tensor")
    B, C = keys.shape
    if C > MAX_ROW:
        raise ValueError(f"rows of {C} keys exceed the kernel's {MAX_ROW}; use torch_row_topk")
    if count is not None and (count.shape != (B,) or count.dtype != torch.int32 or count.device != keys.device):
        raise ValueError("count must be int32 [B] on the keys' device")
    out = torch.empty((B, k), dtype=torch.int64, device=keys.device)
    if B and k:
        keys = keys.contiguous()
        n = max(2, 1 << (C - 1).bit_length())   # the padded row length of the longest row: shared memory
        with torch.cuda.device(keys.device):
            _kernel(keys.device.index or 0)(grid=(B, 1, 1), block=(min(_THREADS, max(32, n // 2)), 1, 1),
                                            shared_mem=8 * n,
                                            args=[keys, C, keys if count is None else count.contiguous(),
                                                  int(count is not None), k, out])
    return out


def torch_row_topk(keys: torch.Tensor, k: int, count: torch.Tensor | None = None) -> torch.Tensor:
    """Torch twin of ``cuda_row_topk`` (any device, any row length)."""
    B, C = keys.shape
    if count is not None:
        keys = torch.where(torch.arange(C, device=keys.device) < count.unsqueeze(1).to(torch.int64), keys, -1)
    if C < k:
        keys = torch.cat([keys, torch.full((B, k - C), -1, dtype=torch.int64, device=keys.device)], 1)
    return torch.topk(keys, k, dim=1, largest=True, sorted=True).values


def row_topk(keys: torch.Tensor, k: int, count: torch.Tensor | None = None) -> torch.Tensor:
    """``cuda_row_topk`` where ``usable``, else its twin: the same bits either way."""
    return (cuda_row_topk if usable(keys) else torch_row_topk)(keys, k, count)
