"""Reading a CIFF file into document vectors, trusting nothing the file says about itself.

A CIFF file states its own sizes (message lengths, the header's counts, df, doc ids, term ids); a hostile
or broken file can make a naive reader allocate gigabytes, invent documents or sum two lists of one
term. Every such value is checked before it is used: message lengths against the bytes left in the
file, the header's counts against those bytes (every message takes at least one), doc ids against the
header's ``num_doc_records`` (and each must have exactly one doc record), df against the postings that
follow, decimal term ids against the vocabulary size the file may declare, and one postings list per
term. Memory therefore follows the real size of the file. Errors name the record and the value
(``postings list 3 (term 'foo'): ...``); :func:`lsr.interop.ciff.read_ciff` prefixes the file.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from lsr.interop.ciff_postings import decode_postings, split_postings_field
from lsr.interop.ciff_wire import lsr_description, messages, parse_message, read_frame
from lsr.sparse import SparseVectors
from lsr.utils.ids import check_id, first_bad_id

__all__ = ["read_checked"]

_DECODE_BATCH_BYTES = 1 << 25  # postings bytes decoded together: big enough to amortise NumPy calls
_INT32_MAX = 2**31 - 1
# Decimal term ids (lsr exports without a vocabulary) size the index's per-term arrays by the largest
# id, which the file chooses. Allow every tokenizer vocabulary (XLM-R 250002, Gemma 262144) and, beyond
# that, no more terms than the file has bytes: a real export that large holds a list for most of them.
_DECIMAL_VOCAB_FLOOR = 1 << 18


@dataclass
class _Stream:
    """The open file and the bytes it holds from the current position."""

    fh: IO[bytes]
    left: int

    def frame(self, what: str) -> bytes:
        data, used = read_frame(self.fh, what, self.left)
        self.left -= used
        return data


@dataclass
class _Lists:
    """Postings lists decoded together: (index, term, df) of each, their concatenated gaps and tfs,
    and how many postings each holds."""

    heads: list[tuple[int, str, int]]
    gaps: np.ndarray
    tfs: np.ndarray
    counts: np.ndarray


def _check_counts(header: Any, left: int) -> None:
    for field in ("num_postings_lists", "num_doc_records"):
        if getattr(header, field) < 0:
            raise ValueError(f"header: {field} is {getattr(header, field)}, a count must be >= 0")
    if header.num_postings_lists + header.num_doc_records > left:
        raise ValueError(f"header: num_postings_lists {header.num_postings_lists} + num_doc_records "
                         f"{header.num_doc_records} messages cannot fit in the {left} bytes after the header")


def _slow_lists(index: int, data: bytes) -> _Lists:
    """One PostingsList through protobuf's parser (a layout the bulk decoder does not take)."""
    what = f"postings list {index}"
    plist = parse_message(messages()["PostingsList"], data, what)
    gaps = np.fromiter((p.docid for p in plist.postings), np.int64, len(plist.postings))
    tfs = np.fromiter((p.tf for p in plist.postings), np.int64, len(plist.postings))
    return _Lists([(index, plist.term, plist.df)], gaps, tfs, np.array([gaps.size], np.int64))


def _bulk_lists(batch: list[tuple[int, bytes, int]]) -> _Lists:
    """Frames whose postings field comes last, (index, data, field start) each, decoded together."""
    regions = [data[start:] for _, data, start in batch]
    region_starts = np.r_[0, np.cumsum([len(r) for r in regions])[:-1]].astype(np.int64)
    decoded = decode_postings(np.frombuffer(b"".join(regions), np.uint8), region_starts)
    if decoded is None:
        parts = [_slow_lists(i, data) for i, data, _ in batch]
        return _Lists([h for p in parts for h in p.heads], np.concatenate([p.gaps for p in parts]),
                      np.concatenate([p.tfs for p in parts]), np.concatenate([p.counts for p in parts]))
    gaps, tfs, counts = decoded
    cls = messages()["PostingsList"]
    heads = []
    for i, data, start in batch:
        head = parse_message(cls, data[:start], f"postings list {i}")
        heads.append((i, head.term, head.df))
    return _Lists(heads, gaps, tfs, counts)


def _raw_lists(stream: _Stream, n_lists: int) -> Iterator[_Lists]:
    batch: list[tuple[int, bytes, int]] = []
    size = 0
    for i in range(n_lists):
        data = stream.frame(f"postings list {i}")
        region = split_postings_field(data)
        if region is None:
            if batch:
                yield _bulk_lists(batch)
            batch, size = [], 0
            yield _slow_lists(i, data)
            continue
        batch.append((i, data, region[0]))
        size += len(data) - region[0]
        if size >= _DECODE_BATCH_BYTES:
            yield _bulk_lists(batch)
            batch, size = [], 0
    if batch:
        yield _bulk_lists(batch)


def _first_bad(lists: _Lists, bounds: np.ndarray, masks: list[tuple[np.ndarray, str]]) -> None:
    """Raise for the earliest posting any mask flags (message templates get list, posting, docid, gap, tf)."""
    hits = [(int(np.flatnonzero(mask)[0]), text) for mask, text in masks if mask.any()]
    if not hits:
        return
    j, text = min(hits)
    k = int(np.searchsorted(bounds, j, side="right")) - 1
    i, term, _ = lists.heads[k]
    start = int(bounds[k])
    docid = int(lists.gaps[start:j + 1].astype(object).sum())  # exact, whatever the gaps are
    raise ValueError(f"postings list {i} (term {term!r}): posting {j - start} " + text.format(
        docid=docid, gap=int(lists.gaps[j]), tf=int(lists.tfs[j])))


def _check_postings(lists: _Lists, n_docs: int) -> np.ndarray:
    """The absolute doc ids of ``lists`` after checking df, gaps, doc ids and tfs."""
    for (i, term, df), count in zip(lists.heads, lists.counts.tolist()):
        if df != count:
            raise ValueError(f"postings list {i} (term {term!r}): df is {df} but {count} postings follow")
    bounds = np.r_[0, np.cumsum(lists.counts)]
    gaps = lists.gaps
    first = np.zeros(gaps.size, bool)
    first[bounds[:-1][lists.counts > 0]] = True
    where = f"(the header's num_doc_records is {n_docs})"
    _first_bad(lists, bounds, [
        (first & ((gaps < 0) | (gaps >= n_docs)), f"names doc id {{docid}}, outside 0..{n_docs - 1} {where}"),
        (~first & (gaps < 1), "has doc id gap {gap}: doc ids must increase within a list (CIFF gap encoding)"),
        (~first & (gaps >= n_docs), f"names doc id {{docid}}, not below {n_docs} {where}"),
        ((lists.tfs < 1) | (lists.tfs > _INT32_MAX), "has tf {tf}: a tf must be a positive int32")])
    sums = np.cumsum(gaps)  # no overflow: every gap is now below n_docs < 2**31
    nonempty = lists.counts > 0
    starts = bounds[:-1][nonempty]
    docids = sums - np.repeat(sums[starts] - gaps[starts], lists.counts[nonempty])
    _first_bad(lists, bounds, [(docids >= n_docs, f"names doc id {{docid}}, not below {n_docs} {where}")])
    return docids


def _term_resolver(tok2id: Mapping[str, int] | None, limit: int, why: str) -> Callable[[int, str], int]:
    """(list index, term) -> term id: through the vocabulary, else a decimal id below ``limit``."""
    def resolve(index: int, term: str) -> int:
        if tok2id is not None:
            tid = tok2id.get(term)
            if tid is None:
                raise ValueError(f"postings list {index}: term {term!r} is not in the vocabulary (--vocab)")
            return tid
        if not (term.isascii() and term.isdigit()):
            raise ValueError(f"postings list {index}: term {term!r} is not a term id: pass the vocabulary (--vocab)")
        if int(term) >= limit:
            raise ValueError(f"postings list {index}: term id {int(term)} is not below {limit} ({why}): pass "
                             "the vocabulary (--vocab)")
        return int(term)
    return resolve


def _read_postings(stream: _Stream, n_lists: int, n_docs: int, resolve: Callable[[int, str], int],
                   scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All postings lists as (doc ids, term ids, weights), one list per term."""
    rows, cols, vals = [], [], []
    list_of_term: dict[int, tuple[int, str]] = {}
    for lists in _raw_lists(stream, n_lists):
        docids = _check_postings(lists, n_docs)
        tids = []
        for i, term, _ in lists.heads:
            tid = resolve(i, term)
            if tid in list_of_term:
                j, other = list_of_term[tid]
                raise ValueError(f"postings list {i} (term {term!r}): term id {tid} already has postings list "
                                 f"{j} (term {other!r}); a term has one postings list")
            list_of_term[tid] = (i, term)
            tids.append(tid)
        rows.append(docids)
        cols.append(np.repeat(np.asarray(tids, np.int64), lists.counts))
        vals.append(lists.tfs / scale)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals).astype(np.float32)


def _doc_ids(stream: _Stream, n_docs: int) -> list[str]:
    """The collection docid of every doc id: each of 0..n_docs-1 has exactly one doc record."""
    cls = messages()["DocRecord"]
    docids, lengths, names = np.zeros(n_docs, np.int64), np.zeros(n_docs, np.int64), []
    for r in range(n_docs):
        rec = parse_message(cls, stream.frame(f"doc record {r}"), f"doc record {r}")
        docids[r], lengths[r] = rec.docid, rec.doclength
        names.append(rec.collection_docid)
    bad = np.flatnonzero((docids < 0) | (docids >= n_docs))
    if bad.size:
        r = int(bad[0])
        raise ValueError(f"doc record {r} ({names[r]!r}): docid {docids[r]} is outside 0..{n_docs - 1} (the "
                         f"header's num_doc_records is {n_docs})")
    if (lengths < 0).any():
        r = int(np.flatnonzero(lengths < 0)[0])
        raise ValueError(f"doc record {r} ({names[r]!r}): doclength {lengths[r]} is negative")
    order = np.argsort(docids, kind="stable")
    repeated = np.flatnonzero(np.diff(docids[order]) == 0)
    if repeated.size:
        r0, r = int(order[repeated[0]]), int(order[repeated[0] + 1])
        missing = int(np.flatnonzero(np.bincount(docids, minlength=n_docs) == 0)[0])
        raise ValueError(f"doc record {r} ({names[r]!r}): docid {docids[r]} already has doc record {r0}, so "
                         f"docid {missing} has none")
    ids = [names[r] for r in order.tolist()]
    bad_id = first_bad_id(ids)
    if bad_id is not None:
        check_id(ids[bad_id], "collection_docid", f"doc record {int(order[bad_id])}")
    if len(set(ids)) != n_docs:
        first_record: dict[str, int] = {}
        for r, name in enumerate(names):
            if first_record.setdefault(name, r) != r:
                raise ValueError(f"doc record {r}: collection_docid {name!r} repeats doc record {first_record[name]}")
    return ids


def _scale(given: float | None, info: Mapping[str, Any]) -> float:
    scale = given if given is not None else info.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not (math.isfinite(scale) and scale > 0):
        where = "--scale" if given is not None else "the scale in the header's lsr description"
        raise ValueError(f"{where} is {scale!r}; it must be a finite number > 0 (pass --scale)")
    return float(scale)


def _decimal_limit(info: Mapping[str, Any], file_size: int) -> tuple[int, str]:
    """The bound on decimal term ids: the vocab_size an lsr export records, within what the file may claim."""
    limit = max(_DECIMAL_VOCAB_FLOOR, file_size)
    declared = info.get("vocab_size")
    if declared is None:
        return limit, f"the most a {file_size}-byte file without a recorded vocab_size may use"
    if isinstance(declared, bool) or not isinstance(declared, int) or not 0 <= declared <= limit:
        raise ValueError(f"header: vocab_size {declared!r} in the lsr description is not an integer in 0..{limit} "
                         f"(the most a {file_size}-byte file may declare): pass the vocabulary (--vocab)")
    return declared, "the vocab_size the lsr description records"


def read_checked(path: str | os.PathLike, *, tok2id: Mapping[str, int] | None, n_tokens: int | None,
                 scale: float | None) -> tuple[SparseVectors, dict[str, Any]]:
    """A CIFF file as document vectors (weight = tf / scale) and its info (header, scale, lsr metadata).

    ``tok2id``/``n_tokens``: the vocabulary mapping terms to ids and its size; None reads the terms as
    decimal term ids. ValueError (naming the record and the value) for anything inconsistent."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        stream = _Stream(fh, size)
        header = parse_message(messages()["Header"], stream.frame("the header"), "the header")
        info = lsr_description(header)
        metadata = info.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValueError(f"header: the metadata in the lsr description is {type(metadata).__name__}, not an object")
        scale = _scale(scale, info)
        _check_counts(header, stream.left)
        limit, why = _decimal_limit(info, size) if tok2id is None else (n_tokens or 0, "the vocabulary size")
        resolve = _term_resolver(tok2id, limit, why)
        n_docs = header.num_doc_records
        rows, cols, vals = _read_postings(stream, header.num_postings_lists, n_docs, resolve, scale)
        ids = _doc_ids(stream, n_docs)
        if stream.left:
            raise ValueError(f"{stream.left} bytes follow the last doc record: the header's num_postings_lists "
                             f"{header.num_postings_lists} / num_doc_records {n_docs} do not describe the whole file")
    if tok2id is not None:
        vocab_size = n_tokens or 0
    else:
        vocab_size = info.get("vocab_size", int(cols.max()) + 1 if cols.size else 0)
    vectors = SparseVectors.from_coo(rows, cols, vals, n_docs, ids, vocab_size)
    return vectors, {"header": {f.name: v for f, v in header.ListFields()}, "scale": scale, "metadata": metadata}
