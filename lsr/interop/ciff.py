"""CIFF (Common Index File Format) import and export: the index interchange of Anserini, PISA, Terrier, Seismic.

A CIFF file is a sequence of varint-length-prefixed protobuf messages: one ``Header``, then
``num_postings_lists`` ``PostingsList`` messages (term, df, cf, postings of (docid, tf) with the docids
gap-encoded: the first absolute, each next one the difference to the previous), then ``num_doc_records``
``DocRecord`` messages (docid, collection_docid, doclength). The schema (osirrc/ciff
``CommonIndexFileFormat.proto``, package ``io.osirrc.ciff``) is declared here with protobuf's runtime
descriptor API in a private descriptor pool, so no generated code is needed; the postings themselves
are coded in bulk by :mod:`lsr.interop.ciff_postings` (the same bytes protobuf writes).

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
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from lsr.interop.ciff_postings import decode_postings, encode_postings, split_postings_field
from lsr.sparse import SparseVectors
from lsr.storage.files import PathLike, atomic_directory, atomic_write_bytes

__all__ = ["CIFF_VERSION", "DEFAULT_SCALE", "export_ciff", "import_ciff", "messages", "read_ciff", "read_delimited",
           "write_ciff", "write_delimited"]

CIFF_VERSION = 1
DEFAULT_SCALE = 100.0  # Anserini's impact scale for SPLADE document vectors
_LSR_DESCRIPTION = re.compile(r"lsr=(\{.*\})\s*$", re.DOTALL)
_FIELDS = {  # message -> [(name, number, protobuf FieldDescriptorProto type name, repeated message type)]
    "Header": [("version", 1, "INT32"), ("num_postings_lists", 2, "INT32"), ("num_doc_records", 3, "INT32"),
               ("total_postings_lists", 4, "INT32"), ("total_docs", 5, "INT32"),
               ("total_terms_in_collection", 6, "INT64"), ("average_doclength", 7, "DOUBLE"),
               ("description", 8, "STRING")],
    "Posting": [("docid", 1, "INT32"), ("tf", 2, "INT32")],
    "PostingsList": [("term", 1, "STRING"), ("df", 2, "INT64"), ("cf", 3, "INT64"), ("postings", 4, "Posting")],
    "DocRecord": [("docid", 1, "INT32"), ("collection_docid", 2, "STRING"), ("doclength", 3, "INT32")],
}
_messages: dict[str, Any] = {}


def messages() -> dict[str, Any]:
    """The CIFF message classes (Header, Posting, PostingsList, DocRecord), built once."""
    if _messages:
        return _messages
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise ImportError("CIFF needs protobuf: pip install 'lsr-gpu[ciff]'") from None
    proto = descriptor_pb2.FileDescriptorProto(name="lsr_ciff.proto", package="io.osirrc.ciff", syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    for name, fields in _FIELDS.items():
        msg = proto.message_type.add(name=name)
        for field, number, kind in fields:
            if kind in _FIELDS:  # a repeated sub-message
                msg.field.add(name=field, number=number, label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE,
                              type_name=f".io.osirrc.ciff.{kind}")
            else:
                msg.field.add(name=field, number=number, label=F.LABEL_OPTIONAL, type=getattr(F, f"TYPE_{kind}"))
    pool = descriptor_pool.DescriptorPool()  # private: never clashes with another CIFF module's classes
    pool.Add(proto)
    for name in _FIELDS:
        _messages[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"io.osirrc.ciff.{name}"))
    return _messages


# ------------------------------------------------------------------------------------ delimited stream
def write_delimited(fh: IO[bytes], message: Any) -> None:
    """One message (or its serialized bytes) with its varint length prefix."""
    data = message if isinstance(message, bytes) else message.SerializeToString()
    n, prefix = len(data), bytearray()
    while n >= 0x80:
        prefix.append((n & 0x7F) | 0x80)
        n >>= 7
    prefix.append(n)
    fh.write(bytes(prefix))
    fh.write(data)


def _read_frame(fh: IO[bytes], what: str) -> bytes:
    n, shift = 0, 0
    while True:
        b = fh.read(1)
        if not b:
            raise ValueError(f"the CIFF file ends early: {what} is missing (a truncated or not a CIFF file)")
        n |= (b[0] & 0x7F) << shift
        shift += 7
        if not b[0] & 0x80:
            break
        if shift > 63:
            raise ValueError(f"bad length prefix before {what}: not a CIFF file")
    data = fh.read(n)
    if len(data) != n:
        raise ValueError(f"the CIFF file ends inside {what} (truncated)")
    return data


def _parse(cls: Any, data: bytes, what: str) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError type differs between implementations
        raise ValueError(f"{what} is not a valid CIFF message ({e}): not a CIFF file?") from None
    return msg


def read_delimited(fh: IO[bytes], cls: Any, what: str = "a message") -> Any:
    """The next length-prefixed message of class ``cls`` (ValueError naming ``what`` when absent or bad)."""
    return _parse(cls, _read_frame(fh, what), what)


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
_DECODE_BATCH_BYTES = 1 << 25  # postings bytes decoded together: big enough to amortise NumPy calls


def _slow_postings(data: bytes, what: str) -> tuple[str, np.ndarray, np.ndarray]:
    """One PostingsList through protobuf's parser (files whose layout the bulk decoder does not take)."""
    plist = _parse(messages()["PostingsList"], data, what)
    gaps = np.fromiter((p.docid for p in plist.postings), np.int64, len(plist.postings))
    tfs = np.fromiter((p.tf for p in plist.postings), np.int64, len(plist.postings))
    return plist.term, gaps, tfs


def _decode_batch(batch: list[tuple[bytes, int, str]]) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(term, gaps, tfs) of frames whose postings field comes last, decoded together."""
    regions = [data[start:] for data, start, _ in batch]
    region_starts = np.r_[0, np.cumsum([len(r) for r in regions])[:-1]].astype(np.int64)
    decoded = decode_postings(np.frombuffer(b"".join(regions), np.uint8), region_starts)
    if decoded is None:
        yield from (_slow_postings(data, what) for data, _, what in batch)
        return
    gaps, tfs, counts = decoded
    bounds = np.r_[0, np.cumsum(counts)].tolist()
    cls = messages()["PostingsList"]
    for (data, start, what), a, b in zip(batch, bounds[:-1], bounds[1:]):
        yield _parse(cls, data[:start], what).term, gaps[a:b], tfs[a:b]


def _iter_raw_postings(fh: IO[bytes], n_lists: int) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    batch: list[tuple[bytes, int, str]] = []
    size = 0
    for i in range(n_lists):
        what = f"postings list {i}"
        data = _read_frame(fh, what)
        region = split_postings_field(data)
        if region is None:
            yield from _decode_batch(batch)
            batch, size = [], 0
            yield _slow_postings(data, what)
            continue
        batch.append((data, region[0], what))
        size += len(data) - region[0]
        if size >= _DECODE_BATCH_BYTES:
            yield from _decode_batch(batch)
            batch, size = [], 0
    yield from _decode_batch(batch)


def _iter_postings(fh: IO[bytes], n_lists: int) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(term, absolute docids, tfs as float64) of each postings list."""
    for term, gaps, tfs in _iter_raw_postings(fh, n_lists):
        if gaps.size > 1 and (gaps[1:] <= 0).any():
            raise ValueError(f"postings list {term!r}: docid gaps must be positive (CIFF gap encoding)")
        yield term, np.cumsum(gaps), tfs.astype(np.float64)


def _concat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def _read_coo(fh: IO[bytes], n_lists: int, tok2id: dict[str, int] | None,
              scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All postings lists as (doc ids, term ids, weights)."""
    rows, cols, vals = [], [], []
    for term, docids, tfs in _iter_postings(fh, n_lists):
        tid = tok2id.get(term) if tok2id is not None else (int(term) if term.isdigit() else None)
        if tid is None:
            hint = "the vocabulary" if tok2id is not None else "a term id: pass the vocabulary (--vocab)"
            raise ValueError(f"CIFF term {term!r} is not in {hint}")
        rows.append(docids)
        cols.append(np.full(docids.size, tid, np.int64))
        vals.append(tfs / scale)
    return _concat(rows, np.int64), _concat(cols, np.int64), _concat(vals, np.float32)


def read_ciff(path: PathLike, *, vocab: Any = None, scale: float | None = None) -> tuple[SparseVectors, dict]:
    """Read a CIFF file into document vectors (weight = tf / scale); returns (vectors, info) where info
    has the ``header`` fields, the ``scale`` used and the encoder ``metadata`` an lsr export recorded."""
    m = messages()
    tokens = _tokens(vocab, 0)
    tok2id = {t: i for i, t in enumerate(tokens) if t} if tokens is not None else None
    with open(path, "rb") as fh:
        header = read_delimited(fh, m["Header"], "the header")
        found = _LSR_DESCRIPTION.search(header.description)
        lsr_info = json.loads(found.group(1)) if found else {}
        scale = float(scale if scale is not None else lsr_info.get("scale", 1.0))
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        rows, cols, vals = _read_coo(fh, header.num_postings_lists, tok2id, scale)
        records = [read_delimited(fh, m["DocRecord"], f"doc record {i}") for i in range(header.num_doc_records)]
    n_docs = max(header.num_doc_records, int(rows.max()) + 1 if rows.size else 0)
    ids = [str(i) for i in range(n_docs)]
    for r in records:
        if not 0 <= r.docid < n_docs:
            raise ValueError(f"doc record for docid {r.docid} is outside 0..{n_docs - 1}")
        ids[r.docid] = r.collection_docid
    vocab_size = len(tokens) if tokens is not None else int(lsr_info.get("vocab_size") or 0)
    vocab_size = max(vocab_size, int(cols.max()) + 1 if cols.size else 0)
    vectors = SparseVectors.from_coo(rows, cols, vals, n_docs, ids, vocab_size)
    info = {"header": {f.name: v for f, v in header.ListFields()}, "scale": scale,
            "metadata": lsr_info.get("metadata", {})}
    return vectors, info


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
