"""Pre-encoded vectors given by path: the one place that decides what a path holds and reads it.

* a folder with ``manifest.json`` (or one ``.parquet`` shard): lsr vectors, as ``lsr encode`` writes them;
* queries in a file: Anserini ``qid<TAB>tok tok ...`` token queries (``.gz`` ok), weight = count / scale;
* documents in a file, or a folder of ``.json`` / ``.jsonl(.gz)`` files without a manifest: pyserini
  ``JsonVectorCollection`` vectors.

The token formats need their vocabulary (``vocab``: vocab.txt, a tokenizer folder, a token list or mapping;
see :mod:`lsr.interop.anserini`). ``lsr run`` (``inputs.query_vectors`` / ``inputs.doc_vectors``), its torchrun
job and ``lsr search --queries`` read pre-encoded vectors through these functions only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lsr.sparse import SparseVectors
from lsr.storage.vector_format import MANIFEST

__all__ = ["is_vector_folder", "read_doc_vectors", "read_query_vectors", "recorded_encoder"]

_JSON_VECTORS = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


def is_vector_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder of lsr vectors (it holds the manifest ``lsr encode`` writes)."""
    return (Path(path) / MANIFEST).is_file()


def _lsr_vectors(p: Path) -> bool:
    # a folder without a manifest is read as lsr vectors too, so that read_vectors says what is missing
    return p.is_dir() or p.suffix == ".parquet"


def read_query_vectors(path: str | os.PathLike, vocab: Any = None, scale: float | None = None) -> SparseVectors:
    """Pre-encoded queries: lsr vectors, or an Anserini token-query file read with ``vocab`` (``scale``:
    Anserini's quantisation; None: ``lsr.interop.anserini.ANSERINI_QUERY_SCALE``)."""
    p = Path(path)
    if _lsr_vectors(p):
        from lsr.storage.shards import read_vectors

        return read_vectors(p)
    if vocab is None:
        raise ValueError(f"{p} is read as Anserini token queries: give their vocabulary (--vocab / inputs.vocab: "
                         "vocab.txt or a tokenizer folder); for text topics (qid<TAB>text) give the encoder (--model)")
    from lsr.interop.anserini import read_anserini_queries

    return read_anserini_queries(p, vocab, **({} if scale is None else {"scale": scale}))


def read_doc_vectors(path: str | os.PathLike, vocab: Any = None) -> SparseVectors:
    """Pre-encoded documents: lsr vectors, or pyserini JSON vectors (a file or a folder of them) read with
    ``vocab``."""
    p = Path(path)
    pyserini_folder = p.is_dir() and not is_vector_folder(p) and any(f.name.endswith(_JSON_VECTORS) for f in p.iterdir())
    if _lsr_vectors(p) and not pyserini_folder:
        from lsr.storage.shards import read_vectors

        return read_vectors(p)
    if vocab is None:
        raise ValueError(f"{p} is read as pyserini JSON document vectors: give their vocabulary (inputs.vocab: "
                         "vocab.txt or a tokenizer folder)")
    from lsr.interop.anserini import read_anserini_documents

    return read_anserini_documents(p, vocab)


def recorded_encoder(path: str | os.PathLike) -> dict[str, Any] | None:
    """The encoder description an lsr vector folder records (checked against the index's at search time);
    None for Anserini / pyserini files, which record none."""
    if not is_vector_folder(path):
        return None
    from lsr.storage.shards import read_manifest

    return read_manifest(path).get("metadata")
