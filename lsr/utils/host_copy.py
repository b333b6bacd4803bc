"""Large device -> host copies (search results of whole query sets) at the bus's speed.

``tensor.cpu()`` into ordinary (pageable) memory goes through the driver's own staging and runs at a few GB/s, so
bringing the [n, 1000] top-k of 28,000 queries (336 MB) to the host cost rank 0 of a distributed batch search
about as long as a quarter of the search itself. ``copy_to_host`` copies row chunks into two reused pinned
buffers (asynchronous DMA at the bus's rate) and from them into the pageable result with several threads (numpy
copies release the GIL), the next chunk's DMA overlapping the current chunk's host copy. Small tensors and
CPU tensors (and bfloat16, which numpy lacks) take the plain path. Bytes are copied unchanged. docs/performance/scaling.md has the measurement.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

__all__ = ["STAGED_MIN_BYTES", "copy_to_host"]

STAGED_MIN_BYTES = 8 << 20   # below this the plain copy is as fast
CHUNK_BYTES = 32 << 20       # per pinned buffer (two are reused: one filling while the other is read)
HOST_THREADS = 8             # host copy threads per chunk (page faults of a fresh result scale with threads)


def copy_to_host(src: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src`` (any device) copied into ``out`` (a contiguous CPU tensor of src's shape and dtype; a new one by
    default), which is returned. Blocks until the copy is done."""
    if out is None:
        out = torch.empty(src.shape, dtype=src.dtype)
    elif out.shape != src.shape or out.dtype != src.dtype or out.device.type != "cpu" or not out.is_contiguous():
        raise ValueError(f"copy_to_host: out must be a contiguous CPU {src.dtype} tensor of shape {tuple(src.shape)}, "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    nbytes = src.numel() * src.element_size()
    if src.device.type != "cuda" or nbytes < STAGED_MIN_BYTES or src.dim() == 0 or src.dtype == torch.bfloat16:
        return out.copy_(src)
    _staged_copy(src, out)
    return out


def _staged_copy(src: torch.Tensor, out: torch.Tensor) -> None:
    """Row chunks of ``src`` through two pinned buffers into ``out`` (see the module doc)."""
    rows = src.shape[0]
    row_bytes = max(1, src[0].numel() * src.element_size())
    step = max(1, CHUNK_BYTES // row_bytes)
    stages = [torch.empty((min(step, rows), *src.shape[1:]), dtype=src.dtype, pin_memory=True) for _ in range(2)]
    done = [torch.cuda.Event(), torch.cuda.Event()]
    stream = torch.cuda.current_stream(src.device)
    threads = max(1, min(HOST_THREADS, os.cpu_count() or 1))
    flat = out.view(rows, -1).numpy()
    pending: tuple[int, int, int] | None = None   # (buffer, first row, end row) waiting for its host copy
    with ThreadPoolExecutor(threads) as pool:
        for j, a in enumerate(range(0, rows, step)):
            b, buf = min(rows, a + step), j % 2
            with torch.cuda.device(src.device):
                stages[buf][:b - a].copy_(src[a:b], non_blocking=True)
                done[buf].record(stream)
            if pending is not None:
                _host_copy(pool, threads, stages, done, pending, flat)
            pending = (buf, a, b)
        assert pending is not None
        _host_copy(pool, threads, stages, done, pending, flat)


def _host_copy(pool: ThreadPoolExecutor, threads: int, stages: list[torch.Tensor], done: list[torch.cuda.Event],
               pending: tuple[int, int, int], flat: np.ndarray) -> None:
    """Wait for one chunk's DMA, then copy it from its pinned buffer into ``flat`` in ``threads`` row slices."""
    buf, a, b = pending
    done[buf].synchronize()
    staged = stages[buf].view(stages[buf].shape[0], -1).numpy()
    bounds = [a + (b - a) * t // threads for t in range(threads + 1)]
    list(pool.map(lambda t: np.copyto(flat[bounds[t]:bounds[t + 1]], staged[bounds[t] - a:bounds[t + 1] - a]),
                  range(threads)))
