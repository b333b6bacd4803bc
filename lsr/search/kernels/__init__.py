"""Search kernels, each a Triton (or CUDA C++) kernel with its launcher and torch twin in one module.

* ``fixed``: fixed-point score accumulation (exact, order-independent sums).
* ``scatter``: term-parallel scatter-add over postings into a dense [B, N] score matrix.
* ``csr``: doc-parallel scoring over the doc-major CSR.
* ``topk``: packed (score, doc) keys and the exact top-k selection.
* ``block``: the span scorer of the block path (Triton) and its torch twin.
* ``block_cuda`` / ``rescore_cuda``: the CUDA versions of the span scorer and the exact rescoring, compiled
  from ``cuda/*.cu`` at first use by NVRTC.

The CUDA C++ sources are package resources (``cuda_source``), plain ``.cu`` files so that editors,
formatters and readers see them as C++.
"""

from importlib import resources

__all__ = ["cuda_source"]


def cuda_source(name: str) -> str:
    """The text of ``lsr/search/kernels/cuda/<name>`` (a package resource, so installed wheels have it)."""
    return resources.files(__name__).joinpath("cuda", name).read_text(encoding="utf-8")
