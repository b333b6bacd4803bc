"""The ``Encoder`` protocol: what the pipeline, the CLI and the corpus encoder need from an encoder.

Both lsr encoders (``LexicalEncoder`` for BM25, ``SpladeEncoder``) satisfy it; any object with these
members can be handed to ``lsr.pipeline`` or ``encode_corpus``. Method names follow sentence-transformers'
sparse encoders (``encode_query`` / ``encode_document``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from lsr.sparse import SparseVectors

__all__ = ["Encoder", "sparse_output"]


@runtime_checkable
class Encoder(Protocol):
    """Texts to ``SparseVectors`` over a fixed vocabulary."""

    @property
    def vocab_size(self) -> int:
        """Number of term ids (the sparse vectors' dimension)."""
        ...

    @property
    def vocab(self) -> list[str]:
        """Term id -> token."""
        ...

    def encode_query(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> SparseVectors:
        """Query vectors, one row per text."""
        ...

    def encode_document(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> SparseVectors:
        """Document vectors, one row per text."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON description (kind, model, max lengths, vocab hash...) stored with the vectors and checked
        at search time."""
        ...


def sparse_output(vectors: SparseVectors, convert_to_sparse_tensor: bool) -> Any:
    """``vectors`` as they are, or as the [n, vocab_size] float32 torch sparse COO tensor (coalesced) that
    sentence-transformers' ``encode_query`` / ``encode_document`` return."""
    if not convert_to_sparse_tensor:
        return vectors
    import torch

    return vectors.to_torch_sparse(torch.sparse_coo)
