"""SparseVectors: the CSR container every stage of lsr exchanges.

Contract (docs/architecture.md): ``indptr`` int64 [n+1], ``indices`` int32 [nnz] unique and ascending within a
row, ``values`` float32 [nnz] > 0 and finite, string ``ids`` (unique), and ``vocab_size`` > every
index. Tensors live on one device (CPU or CUDA); validation runs on that device without Python loops.

* ``vectors``: ``SparseVectors`` itself: construction, row selection, concatenation, conversions.
* ``checks``: range checks before narrowing, ``weight_limit``, and the contract's validation.
* ``build``: CSR arrays from unsorted (row, term, weight) triples and from token -> weight dicts.
"""

from __future__ import annotations

from lsr.sparse.checks import MAX_VOCAB_SIZE, weight_limit
from lsr.sparse.vectors import SparseVectors

__all__ = ["MAX_VOCAB_SIZE", "SparseVectors", "weight_limit"]
