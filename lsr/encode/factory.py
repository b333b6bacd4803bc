"""The encoder an ``EncoderConfig`` names, and the ``encode_corpus`` settings it carries.

Every job that makes an encoder from configuration takes it from here: ``lsr run`` (``lsr.pipeline``), the
commands (``lsr encode`` / ``lsr search`` through ``lsr.cli.args``), the torchrun encoding job
(``lsr.parallel.encode``) and the PyTerrier adapters (``lsr.interop.pyterrier``), so a model id means the same
encoder everywhere.
"""

from __future__ import annotations

from typing import Any

from lsr.config import EncoderConfig
from lsr.encode.base import Encoder

__all__ = ["build_encoder", "corpus_settings", "open_encoder"]


def build_encoder(cfg: EncoderConfig, device: str) -> Encoder:
    """Instantiate the configured encoder (a BM25 encoder is returned unfitted)."""
    if cfg.kind == "bm25":
        from lsr.encode.bm25.lexical import LexicalEncoder

        return LexicalEncoder(k1=cfg.k1, b=cfg.b)
    if cfg.kind == "splade":
        if not cfg.model:
            raise ValueError("encoder.kind=splade needs encoder.model (a Hugging Face id or a local path)")
        from lsr.encode.splade.encoder import SpladeEncoder

        return SpladeEncoder.from_pretrained(cfg.model, device=device, dtype=cfg.dtype, query_model=cfg.query_model,
                                             max_length_query=cfg.max_length_query,
                                             max_length_doc=cfg.max_length_doc, doc_top_k=cfg.doc_top_k,
                                             backend=cfg.head, compile=cfg.compile, attention=cfg.attention)
    raise ValueError(f"unknown encoder.kind {cfg.kind!r} (use 'bm25' or 'splade')")


def open_encoder(cfg: EncoderConfig, device: str) -> Encoder:
    """The encoder ``lsr encode`` / ``lsr search`` use: for BM25 a ``model`` is the folder of a fitted encoder
    (loaded); anything else as ``build_encoder`` (BM25 unfitted)."""
    if cfg.kind == "bm25" and cfg.model:
        from lsr.encode.bm25.lexical import LexicalEncoder

        return LexicalEncoder.load(cfg.model)
    return build_encoder(cfg, device)


def corpus_settings(cfg: EncoderConfig, origin: dict[str, Any]) -> dict[str, Any]:
    """The ``encode_corpus`` settings of a job's documents (one process or every rank): resumed, and recorded
    with ``origin`` so that the vectors are never reused for other documents."""
    return {"batch_size": cfg.batch_size, "shard_rows": cfg.shard_rows, "resume": True, "doc_top_k": cfg.doc_top_k,
            "tokenize_workers": cfg.tokenize_workers, "origin": origin}
