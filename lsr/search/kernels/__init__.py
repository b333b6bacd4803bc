"""Search kernels, each a Triton (or CUDA C++) kernel with its launcher and torch twin in one module.

* ``fixed``: fixed-point score accumulation (exact, order-independent sums).
* ``scatter``: term-parallel scatter-add over postings into a dense [B, N] score matrix.
* ``csr``: doc-parallel scoring over the doc-major CSR.
* ``topk``: packed (score, doc) keys and the exact top-k selection.
* ``block``: the span scorer of the block path (Triton) and its torch twin.
* ``block_cuda`` / ``rescore_cuda``: the CUDA versions of the span scorer and the exact rescoring, compiled
  from ``cuda/*.cu`` at first use by NVRTC.
"""
