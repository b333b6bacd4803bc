"""CIFF (Common Index File Format) import and export: the index interchange of Anserini, PISA, Terrier, Seismic.

A CIFF file is a sequence of varint-length-prefixed protobuf messages: one ``Header``, then
``num_postings_lists`` ``PostingsList`` messages (term, df, cf, postings of (docid, tf) with the docids
gap-encoded: the first absolute, each next one the difference to the previous), then ``num_doc_records``
``DocRecord`` messages (docid, collection_docid, doclength). The schema and the message stream are in
:mod:`lsr.interop.ciff_wire`; the postings themselves are coded in bulk by :mod:`lsr.interop.ciff_postings`
(the same bytes protobuf writes); reading checks every size, count and id the file states
(:mod:`lsr.interop.ciff_reader`), so a hostile file is refused with one line instead of exhausting memory.

Learned sparse weights are floats; CIFF stores integer ``tf``. Export writes impacts
``tf = round(weight * scale)`` (postings that round to 0 are dropped), document length = the sum of a
document's impacts, and records the scale in the header's ``description`` (``... lsr={"scale": ...,
"metadata": {...}}``, the metadata being the encoder description the searcher checks). Import divides by
that scale (or the one given; 1 for files without it, e.g. Lucene term-frequency exports). lsr's doc
index is the CIFF docid, so rankings, ties included, survive the round trip up to the quantisation.

Terms are the vocabulary's tokens: ``vocab`` is anything :func:`lsr.interop.anserini.load_vocab` takes
or a folder holding a fitted BM25 encoder (``lexical.json``); without one, export uses the model folder
named in the index metadata when it is local, else the decimal term ids (which import reads back).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from lsr.interop.ciff_postings import encode_postings
from lsr.interop.ciff_reader import read_checked
from lsr.interop.ciff_wire import CIFF_VERSION, messages, read_delimited, write_delimited
from lsr.sparse import SparseVectors
from lsr.storage.files import PathLike, atomic_directory, atomic_write_bytes

__all__ = ["CIFF_VERSION", "DEFAULT_SCALE", "export_ciff", "import_ciff", "messages", "read_ciff", "read_delimited",
           "write_ciff", "write_delimited"]

DEFAULT_SCALE = 100.0  # Anserini's impact scale for SPLADE document vectors


# ------------------------------------------------------------------------------------ vocabularies
def _tokens(vocab: Any, vocab_size: int) -> list[str] | None:
    """id -> token for ``vocab`` (anserini.load_vocab forms, or a folder with a fitted lexical.json)."""
    if vocab is None:
        return None
    if isinstance(vocab, (str, os.PathLike)) and (Path(vocab) / "lexical.json").is_file():
        from lsr.encode.bm25.lexical import LexicalEncoder

        tokens = list(LexicalEncoder.load(vocab).vocab)
        if len(tokens) < vocab_size:
            raise ValueError(f"--vocab {vocab} has {len(tokens)} terms, the vectors {vocab_size}: pass the encoder "
                             "that wrote them")
        return tokens
    from lsr.interop.anserini import load_vocab

    tok2id = load_vocab(vocab)
    tokens = [""] * max(vocab_size, max(tok2id.values(), default=-1) + 1)
    for tok, i in tok2id.items():
        tokens[i] = tok
    return tokens


def _vocab_from_metadata(metadata: dict[str, Any], vocab_size: int) -> list[str] | None:
    """The tokenizer vocabulary of a local model folder named in the encoder metadata (hash-checked)."""
    model = metadata.get("model")
    if not model or not Path(model).is_dir():
        return None
    from lsr.encode.bm25.lexical import vocab_hash

    try:
        tokens = _tokens(model, vocab_size)
    except (FileNotFoundError, ValueError):
        return None
    return tokens if tokens and vocab_hash(tokens) == metadata.get("vocab_hash") else None


# ------------------------------------------------------------------------------------ write
def _term_major(vectors: SparseVectors, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Quantised postings sorted by (term, doc): term ids, doc ids, impacts, and each doc's length."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    rows = vectors.row_ids().cpu().numpy()
    terms = vectors.indices.cpu().numpy()
    impacts = np.rint(vectors.values.cpu().numpy().astype(np.float64) * scale)
    if impacts.size and impacts.max() > np.iinfo(np.int32).max:
        raise ValueError(f"weight {impacts.max() / scale:g} x scale {scale:g} does not fit CIFF's int32 tf: "
                         "lower --scale")
    keep = impacts > 0
    if impacts.size and not keep.any():
        raise ValueError(f"every weight x scale {scale:g} rounds to 0 (the largest weight is "
                         f"{float(vectors.values.max()):g}): raise --scale")
    rows, terms, impacts = rows[keep], terms[keep], impacts[keep].astype(np.int64)
    order = np.argsort(terms, kind="stable")  # rows are ascending within each term
    doclen = np.bincount(rows, weights=impacts, minlength=len(vectors)).astype(np.int64)
    return terms[order], rows[order], impacts[order], doclen


def write_ciff(vectors: SparseVectors, path: PathLike, *, vocab: Any = None, scale: float = DEFAULT_SCALE,
               metadata: dict[str, Any] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write document vectors as a CIFF file (atomically); returns the header as a dict."""
    from lsr import __version__

    path, metadata = Path(path), dict(metadata or {})
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists: choose another path or pass overwrite=True (--overwrite)")
    tokens = _tokens(vocab, vectors.vocab_size) if vocab is not None else _vocab_from_metadata(metadata,
                                                                                                vectors.vocab_size)
    terms, docs, impacts, doclen = _term_major(vectors, scale)
    starts = np.flatnonzero(np.r_[True, terms[1:] != terms[:-1]]) if terms.size else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], terms.size].astype(np.int64)
    names = [tokens[t] if tokens else str(t) for t in terms[starts].tolist()]
    if tokens and "" in names:
        raise ValueError("a term id has no token in the vocabulary: pass the encoder's vocabulary (--vocab)")
    m = messages()
    lsr_info = json.dumps({"scale": scale, "vocab_size": vectors.vocab_size, "metadata": metadata}, sort_keys=True)
    header = m["Header"](version=CIFF_VERSION, num_postings_lists=len(starts), num_doc_records=len(vectors),
                         total_postings_lists=len(starts), total_docs=len(vectors),
                         total_terms_in_collection=int(doclen.sum()),
                         average_doclength=float(doclen.mean()) if len(vectors) else 0.0,
                         description=f"lsr {__version__} export: impacts tf = round(weight * {scale:g}); "
                                     f"lsr={lsr_info}")
    with atomic_write_bytes(path) as fh:
        write_delimited(fh, header)
        gaps = np.diff(docs, prepend=0)
        gaps[starts] = docs[starts]  # each list's first docid is absolute
        buf, offsets = encode_postings(gaps, impacts)
        cf = np.add.reduceat(impacts, starts) if starts.size else impacts[:0]
        for name, a, b, c in sorted(zip(names, starts.tolist(), ends.tolist(), cf.tolist())):  # byte order, as Lucene
            head = m["PostingsList"](term=name, df=b - a, cf=c).SerializeToString()
            write_delimited(fh, head + buf[offsets[a]:offsets[b]].tobytes())
        for i, (docno, length) in enumerate(zip(vectors.ids, doclen.tolist())):
            write_delimited(fh, m["DocRecord"](docid=i, collection_docid=docno, doclength=length))
    return {f.name: v for f, v in header.ListFields()}


# ------------------------------------------------------------------------------------ read
def read_ciff(path: PathLike, *, vocab: Any = None, scale: float | None = None) -> tuple[SparseVectors, dict]:
    """Read a CIFF file into document vectors (weight = tf / scale); returns (vectors, info) where info
    has the ``header`` fields, the ``scale`` used and the encoder ``metadata`` an lsr export recorded.

    Without ``vocab`` the terms must be decimal term ids (what an lsr export without a vocabulary
    writes). A file whose sizes, counts or ids contradict each other or the file's length raises one
    ValueError line naming the file, the record and the value."""
    tokens = _tokens(vocab, 0)
    tok2id = {t: i for i, t in enumerate(tokens) if t} if tokens is not None else None
    try:
        return read_checked(path, tok2id=tok2id, n_tokens=len(tokens) if tokens is not None else None, scale=scale)
    except ValueError as e:
        raise ValueError(f"CIFF file {path}: {e}") from None


# ------------------------------------------------------------------------------------ folders
def export_ciff(source: PathLike, path: PathLike, *, vocab: Any = None, scale: float = DEFAULT_SCALE,
                overwrite: bool = False) -> dict[str, Any]:
    """An lsr index directory (``meta.json``) or vector directory -> a CIFF file; returns the header."""
    from lsr.storage.shards import read_manifest, read_vectors

    source = Path(source)
    if (source / "meta.json").is_file():
        from lsr.index.inverted import InvertedIndex

        index = InvertedIndex.load(source, device="cpu")
        vectors, metadata = index.docs, index.metadata
    else:
        vectors, metadata = read_vectors(source), read_manifest(source).get("metadata", {})
    return write_ciff(vectors, path, vocab=vocab, scale=scale, metadata=metadata, overwrite=overwrite)


def import_ciff(path: PathLike, out: PathLike, *, index: bool = False, vocab: Any = None,
                scale: float | None = None, device: str = "cpu", overwrite: bool = False) -> dict[str, Any]:
    """A CIFF file -> an lsr vector directory (or, with ``index=True``, an index directory); returns info."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: choose another path or pass overwrite=True (--overwrite)")
    vectors, info = read_ciff(path, vocab=vocab, scale=scale)
    metadata = info["metadata"] or {"kind": "ciff", "source": str(path), "scale": info["scale"]}
    if index:
        from lsr.index.inverted import InvertedIndex

        InvertedIndex.build(vectors.to(device), device=device, metadata=metadata).save(out, overwrite=overwrite)
    else:
        from lsr.storage.shards import write_vectors

        if out.exists():
            from lsr.storage.provenance import check_replaceable

            check_replaceable(out, lambda name: name == "manifest.json" or name.startswith("part-"), "vector")
        with atomic_directory(out, overwrite=overwrite) as tmp:
            write_vectors(tmp, vectors, metadata)
    return info
