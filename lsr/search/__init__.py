"""Exact top-k search over an ``InvertedIndex``.

Module map:

* ``searcher``: ``Searcher`` (query batching, memory bounds, docno mapping), ``exact_topk`` and the torch
  backend (a weighted gather-sum per document over the doc CSR).
* ``triton_backend``: ``triton_search``, the dispatch between the dense paths (scatter / CSR kernels) and the
  block path (span scorers, coarse pass, exact rescoring) on CUDA, or the CPU under ``TRITON_INTERPRET=1``.
* ``kernels/``: the Triton and CUDA kernels, each beside its launcher and torch twin; ``kernels/cuda/`` holds
  the CUDA C++ sources compiled at first use by NVRTC.

``import lsr`` stays light because lsr resolves ``lsr.search`` lazily; importing this package loads torch.
"""

from lsr.search.searcher import ENCODER_IDENTITY_KEYS, Searcher, check_compatible, exact_topk

__all__ = ["ENCODER_IDENTITY_KEYS", "Searcher", "check_compatible", "exact_topk"]
