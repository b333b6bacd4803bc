"""The bucket selection's histograms (lsr.search.kernels.bucket_select, level 1 and 2) as a CUDA kernel.

Why: a row's keys crowd into a few of the 4,096 bins (the scores near its k-th), so the Triton ``_hist_kernel``'s
one global atomic per key queues on a handful of addresses (docs/performance/search.md). This kernel counts in shared
memory, the lanes of a warp that share a bin adding once, and adds each non-empty bin to the row's histogram once
per CTA. Counts are integers, so the histogram is the Triton kernel's and the twin's (``bucket_select.torch_bucket_levels``)
whatever the order. Compiled at first use with NVRTC, like lsr.search.kernels.rescore_cuda; CPU CI runs the Triton
kernel under the interpreter, the ``gpu`` tests compare this one with it and with the twin.
"""

from __future__ import annotations

import torch

from lsr.search.kernels import nvrtc_available, nvrtc_kernel

__all__ = ["cuda_bucket_hist", "usable"]

_THREADS = 256
_KEYS_PER_CTA = _THREADS * 16     # the source's KEYS_PER_THREAD


def _kernel(device_index: int):
    return nvrtc_kernel("bucket_hist.cu", "lsr_bucket_hist", device_index)


def usable(keys: torch.Tensor) -> bool:
    """Whether ``cuda_bucket_hist`` runs here for these keys (CUDA, NVRTC)."""
    return (keys.dim() == 2 and keys.shape[1] <= 65535 * _KEYS_PER_CTA
            and nvrtc_available("bucket_hist.cu", "lsr_bucket_hist", keys.device))


def cuda_bucket_hist(keys: torch.Tensor, hist: torch.Tensor, pick: torch.Tensor, level2: bool) -> None:
    """Add one level's counts of ``keys`` (int64 [B, C], contiguous, -1 = none) to ``hist`` (int32 [B, 4096], zeroed
    by the caller); level 2 counts only the keys whose bits 61..50 equal ``pick`` (int64 [B]: level 1's bucket)."""
    B, C = keys.shape
    if hist.shape != (B, 4096) or hist.dtype != torch.int32 or not hist.is_contiguous():
        raise ValueError("hist must be a contiguous int32 [B, 4096]")
    if not keys.is_contiguous() or keys.dtype != torch.int64 or C > 65535 * _KEYS_PER_CTA:
        raise ValueError(f"keys must be a contiguous int64 [B, C], C <= {65535 * _KEYS_PER_CTA}")
    if B and C:
        with torch.cuda.device(keys.device):
            _kernel(keys.device.index or 0)(grid=(B, (C + _KEYS_PER_CTA - 1) // _KEYS_PER_CTA, 1),
                                            block=(_THREADS, 1, 1), args=[keys, C, pick, int(level2), hist])
