"""Search kernels, each a Triton (or CUDA C++) kernel with its launcher and torch twin in one module.

* ``fixed``: fixed-point score accumulation (exact, order-independent sums).
* ``scatter``: term-parallel scatter-add over postings into a dense [B, N] score matrix.
* ``csr``: doc-parallel scoring over the doc-major CSR.
* ``topk``: packed (score, doc) keys and the exact top-k selection.
* ``block``: the span scorer of the block path (Triton) and its torch twin.
* ``bucket_select``: bucket selection (histogram levels, gather, rank) of the block path's key rows (the public
  entry point of the selection family is ``lsr.search.select``).
* ``block_cuda`` / ``rescore_cuda``: the CUDA versions of the span scorer and the exact rescoring, compiled
  from ``cuda/*.cu`` at first use by NVRTC; ``row_topk_cuda`` (the top k of short key rows, one CTA a row) and
  ``select_cuda`` (the selection's histograms) likewise.

The CUDA C++ sources are package resources (``cuda_source``), plain ``.cu`` files so that editors,
formatters and readers see them as C++.
"""

import functools
from importlib import resources
from typing import Any

__all__ = ["cuda_source", "nvrtc_available", "nvrtc_kernel", "terms_bucket"]


def terms_bucket(max_terms: int) -> int:
    """Query-length bucket (power of two >= 64): one Triton compile and one CUDA graph serve most queries."""
    return max(64, 1 << max(0, max_terms - 1).bit_length())


def cuda_source(name: str) -> str:
    """The text of ``lsr/search/kernels/cuda/<name>`` (a package resource, so installed wheels have it)."""
    return resources.files(__name__).joinpath("cuda", name).read_text(encoding="utf-8")


@functools.cache
def nvrtc_kernel(source: str, name: str, device_index: int) -> Any:
    """Kernel ``name`` of ``cuda/<source>`` compiled by NVRTC on one device (a module belongs to the device it was
    loaded on), once per process."""
    import torch

    with torch.cuda.device(device_index):
        return torch.cuda._compile_kernel(cuda_source(source), name)


@functools.cache
def _compiles(source: str, name: str, device_index: int) -> bool:
    try:
        nvrtc_kernel(source, name, device_index)
        return True
    except Exception:  # noqa: BLE001 - no NVRTC / a driver too old: the caller's fallback takes over
        return False


def nvrtc_available(source: str, name: str, device: Any) -> bool:
    """Whether ``nvrtc_kernel(source, name, ...)`` compiles and runs on ``device`` (a CUDA device with NVRTC)."""
    import torch

    return device.type == "cuda" and hasattr(torch.cuda, "_compile_kernel") and _compiles(source, name,
                                                                                         device.index or 0)
