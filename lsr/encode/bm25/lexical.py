"""BM25 as sparse vectors: the offline baseline encoder (no weights to download).

Documents get BM25 term weights and queries get term counts, so the inner product of a query and a
document vector is the BM25 score of Lucene's ``BM25Similarity`` (times the constant k1 + 1, which
Lucene >= 8 drops; rankings are unchanged). Text is analysed like Lucene's ``EnglishAnalyzer`` (see
:mod:`lsr.encode.bm25.analyzer`), so results track Anserini / Pyserini BM25.

The collection statistics are Lucene's too: the N of the idf and the denominator of the average length
are ``docCount``, the documents with at least one analysed term, and avgdl = sumTotalTermFreq / docCount.
Empty and stop-word-only documents have no postings in Lucene and count nowhere; counting them (as
``lexical.json`` format 1 did) lowers every idf's N-dependence and avgdl and ranks differently from Pyserini
on collections with many such documents. A format-1 file still loads with its statistics as saved, so
vectors it made are reproduced.

    enc = LexicalEncoder()                       # k1=0.9, b=0.4 (Pyserini defaults)
    docs = enc.fit_encode_document(texts, ids)  # vocabulary, document frequencies, weights
    queries = enc.encode_query(query_texts, query_ids)
    enc.save("bm25/")                            # JSON; LexicalEncoder.load("bm25/") encodes queries later
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lsr.encode.base import sparse_output
from lsr.encode.bm25.analyzer import EnglishAnalyzer
from lsr.sparse import SparseVectors
from lsr.storage.files import atomic_write_text
from lsr.storage.formats import check_format_version

__all__ = ["LexicalEncoder", "decode_rows", "lucene_norm_lengths", "vocab_hash"]

_FORMAT, _FORMAT_VERSION, _FILE = "lsr-lexical", 2, "lexical.json"
_READABLE_VERSIONS = (1, 2)  # 1: no doc_count; its N was every fitted document
_LUCENE_FREE_LENGTHS = 24  # SmallFloat.intToByte4 stores lengths below this exactly


def vocab_hash(vocab: Sequence[str]) -> str:
    """sha256 (hex) of the vocabulary in id order, one token per line."""
    return hashlib.sha256("\n".join(vocab).encode("utf-8")).hexdigest()


def lucene_norm_lengths(lengths: np.ndarray) -> np.ndarray:
    """Document lengths as Lucene's one-byte norms decode them (``SmallFloat.byte4ToInt(intToByte4(n))``):
    exact below 24, above that 24 + (n - 24) truncated to its 4 most significant bits."""
    n = np.asarray(lengths, dtype=np.int64)
    rest = np.maximum(n - _LUCENE_FREE_LENGTHS, 0)
    bits = np.frexp(rest.astype(np.float64))[1].astype(np.int64)  # bit length (exact below 2**53)
    shift = np.maximum(bits - 4, 0)
    return np.where(n < _LUCENE_FREE_LENGTHS, n, _LUCENE_FREE_LENGTHS + ((rest >> shift) << shift))


def decode_rows(vectors: SparseVectors, vocab: Sequence[str],
                top_k: int | None = None) -> list[list[tuple[str, float]]]:
    """Each row as [(token, weight)] by decreasing weight (ties: lower term id), at most ``top_k``."""
    ip, ix, val = (t.cpu().numpy() for t in (vectors.indptr, vectors.indices, vectors.values))
    out = []
    for a, b in itertools.pairwise(ip.tolist()):
        order = np.argsort(-val[a:b], kind="stable")[:top_k]
        out.append([(vocab[t], float(w)) for t, w in zip(ix[a:b][order].tolist(), val[a:b][order], strict=True)])
    return out


class _Lookup(dict):
    """term -> id; unknown terms map to -1 (dropped) instead of raising."""

    def __missing__(self, key: str) -> int:
        return -1


class _Growing(dict):
    """term -> id; unknown terms get the next id (first-occurrence order while fitting)."""

    def __missing__(self, key: str) -> int:
        value = self[key] = len(self)
        return value


@dataclass
class _Counts:
    """Term counts of a batch of texts in COO form, sorted by (row, term)."""

    rows: np.ndarray  # int64 [nnz]
    terms: np.ndarray  # int64 [nnz]
    tf: np.ndarray  # int64 [nnz]
    lengths: np.ndarray  # int64 [n] analysed tokens per text, out-of-vocabulary ones included


def _count(term_lists: list[list[str]], term_ids: dict[str, int]) -> _Counts:
    """Vectorised bag of words: one dict lookup per token in Python, the rest in numpy."""
    n = len(term_lists)
    lengths = np.fromiter(map(len, term_lists), dtype=np.int64, count=n)
    total = int(lengths.sum())
    tids = np.fromiter(map(term_ids.__getitem__, itertools.chain.from_iterable(term_lists)),
                       dtype=np.int64, count=total)
    rows = np.repeat(np.arange(n, dtype=np.int64), lengths)
    keep = tids >= 0
    keys, tf = np.unique((rows[keep] << 32) | tids[keep], return_counts=True)  # sorted by (row, term)
    return _Counts(keys >> 32, keys & 0xFFFFFFFF, tf, lengths)


def _batches(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(texts)
    while batch := list(itertools.islice(it, size)):
        yield batch


class LexicalEncoder:
    """BM25 sparse encoder.

    Args:
        k1: term-frequency saturation (>= 0).
        b: length normalisation in [0, 1].
        analyzer: text -> terms (default :class:`EnglishAnalyzer`, Lucene's EnglishAnalyzer chain).
        lucene_lengths: use document lengths as Lucene stores them (lossy one-byte norms, see
            :func:`lucene_norm_lengths`), which reproduces Pyserini's BEIR SciFact BM25 to four decimals
            (nDCG@10 0.6789 vs 0.6777 with exact lengths); False uses exact lengths.
        batch_size: texts analysed per batch (bounds the memory of intermediate Python lists).
    """

    def __init__(self, k1: float = 0.9, b: float = 0.4, analyzer: EnglishAnalyzer | None = None, *,
                 lucene_lengths: bool = True, batch_size: int = 8192) -> None:
        if not (k1 >= 0 and math.isfinite(k1)):
            raise ValueError(f"k1 must be finite and >= 0, got {k1}")
        if not 0 <= b <= 1:
            raise ValueError(f"b must lie in [0, 1], got {b}")
        self.k1, self.b = float(k1), float(b)
        self.analyzer = analyzer if analyzer is not None else EnglishAnalyzer()
        self.lucene_lengths = bool(lucene_lengths)
        self.batch_size = int(batch_size)
        self._vocab: list[str] = []
        self._term_ids: _Lookup = _Lookup()
        self.df = np.zeros(0, dtype=np.int64)
        self.n_docs = 0  # documents fitted on
        self.doc_count = 0  # of those, documents with at least one analysed term (Lucene's docCount)
        self.total_length = 0
        self._idf = np.zeros(0)
        self._stats_version = _FORMAT_VERSION  # the lexical.json format whose statistics these are

    # ------------------------------------------------------------------ state
    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def vocab(self) -> list[str]:
        """Term id -> term (sorted by code point, so ids do not depend on document order)."""
        return self._vocab

    @property
    def fitted(self) -> bool:
        return self.n_docs > 0

    @property
    def avgdl(self) -> float:
        """Average analysed length of the fitted documents that have a term: sumTotalTermFreq / docCount."""
        return self.total_length / self.doc_count if self.doc_count and self.total_length else 1.0

    def idf(self) -> np.ndarray:
        """float64 [V] Lucene BM25 idf: ln(1 + (N - df + 0.5) / (df + 0.5)) with N = ``doc_count``, always > 0."""
        return self._idf

    def _set_stats(self, vocab: list[str], df: np.ndarray, n_docs: int, total_length: int, doc_count: int,
                   version: int = _FORMAT_VERSION) -> None:
        self._stats_version = version
        self._vocab = vocab
        self._term_ids = _Lookup((t, i) for i, t in enumerate(vocab))
        self.df = np.asarray(df, dtype=np.int64)
        self.n_docs, self.total_length, self.doc_count = int(n_docs), int(total_length), int(doc_count)
        self._idf = np.log1p((self.doc_count - self.df + 0.5) / (self.df + 0.5))

    def _require_fitted(self, what: str) -> None:
        if not self.fitted:
            raise RuntimeError(f"LexicalEncoder.{what} needs corpus statistics: call fit(texts) or "
                               "fit_encode_document(texts) first, or LexicalEncoder.load(dir)")

    # ------------------------------------------------------------------ fitting
    def _analyze(self, batch: list[str]) -> list[list[str]]:
        return [self.analyzer(t) for t in batch]

    def _fit_counts(self, texts: Iterable[str], keep: bool) -> tuple[np.ndarray, list[_Counts]]:
        """Collect document frequencies in first-occurrence ids; returns old id -> sorted id and,
        with ``keep``, every batch's counts (in first-occurrence ids) for fit_encode_document."""
        growing = _Growing()
        df = np.zeros(1024, dtype=np.int64)
        kept: list[_Counts] = []
        n_docs = total = with_terms = 0
        for batch in _batches(texts, self.batch_size):
            c = _count(self._analyze(batch), growing)
            if len(growing) > df.size:
                df = np.concatenate([df, np.zeros(max(df.size, len(growing) - df.size), np.int64)])
            uniq, n_with = np.unique(c.terms, return_counts=True)  # rows are unique per (row, term)
            df[uniq] += n_with
            n_docs += len(batch)
            with_terms += int(np.count_nonzero(c.lengths))
            total += int(c.lengths.sum())
            if keep:
                kept.append(c)
        if n_docs == 0:
            raise ValueError("cannot fit BM25 statistics on an empty corpus")
        terms = list(growing)
        order = sorted(range(len(terms)), key=terms.__getitem__)
        new_id = np.empty(len(terms), dtype=np.int64)
        new_id[order] = np.arange(len(terms))
        self._set_stats([terms[i] for i in order], df[: len(terms)][order], n_docs, total, with_terms)
        return new_id, kept

    def fit(self, texts: Iterable[str]) -> LexicalEncoder:
        """Build the vocabulary, document frequencies, docCount and average length from a corpus; returns self."""
        self._fit_counts(texts, keep=False)
        return self

    def fit_encode_document(self, texts: Iterable[str], ids: Sequence[str] | None = None) -> SparseVectors:
        """``fit(texts)`` then ``encode_document(texts, ids)``, analysing every text once."""
        new_id, kept = self._fit_counts(texts, keep=True)
        for c in kept:  # renumber into sorted ids, then restore (row, term) order
            c.terms = new_id[c.terms]
            order = np.lexsort((c.terms, c.rows))
            c.rows, c.terms, c.tf = c.rows[order], c.terms[order], c.tf[order]
        return self._assemble(kept, ids, self._bm25)

    def fit_encode_documents(self, texts: Iterable[str], ids: Sequence[str] | None = None) -> SparseVectors:
        """Deprecated name of ``fit_encode_document`` (kept for one release)."""
        warnings.warn("fit_encode_documents() is deprecated; use fit_encode_document()", DeprecationWarning, stacklevel=2)
        return self.fit_encode_document(texts, ids)

    # ------------------------------------------------------------------ encoding
    def _bm25(self, c: _Counts) -> np.ndarray:
        dl = lucene_norm_lengths(c.lengths) if self.lucene_lengths else c.lengths
        norm = self.k1 * (1.0 - self.b + self.b * dl.astype(np.float64) / self.avgdl)
        tf = c.tf.astype(np.float64)
        return self._idf[c.terms] * tf * (self.k1 + 1.0) / (tf + norm[c.rows])

    def _assemble(self, parts: list[_Counts], ids: Sequence[str] | None,
                  weigh: Callable[[_Counts], np.ndarray]) -> SparseVectors:
        """Stack batch counts into one CSR with ``weigh(counts) -> float64 [nnz]`` as values."""
        if not parts:
            return SparseVectors(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32),
                                 ids, self.vocab_size)
        row_counts = np.concatenate([np.bincount(c.rows, minlength=len(c.lengths)) for c in parts])
        indptr = np.zeros(row_counts.size + 1, dtype=np.int64)
        np.cumsum(row_counts, out=indptr[1:])
        indices = np.concatenate([c.terms for c in parts]).astype(np.int32)
        values = np.concatenate([weigh(c) for c in parts]).astype(np.float32)
        return SparseVectors(indptr, indices, values, ids, self.vocab_size)

    def encode_document(self, texts: Iterable[str], ids: Sequence[str] | None = None, *,
                        convert_to_sparse_tensor: bool = False) -> Any:
        """BM25 document vectors: idf(t) · tf·(k1+1) / (tf + k1·(1 - b + b·dl/avgdl)).

        ``dl`` counts every analysed token of the text; terms outside the fitted vocabulary are
        dropped (they have no document frequency). ``convert_to_sparse_tensor``: a torch sparse COO
        tensor instead of SparseVectors."""
        self._require_fitted("encode_document")
        parts = [_count(self._analyze(batch), self._term_ids) for batch in _batches(texts, self.batch_size)]
        return sparse_output(self._assemble(parts, ids, self._bm25), convert_to_sparse_tensor)

    def encode_query(self, texts: Iterable[str], ids: Sequence[str] | None = None, *,
                     convert_to_sparse_tensor: bool = False) -> Any:
        """Query vectors: weight = how often the term occurs in the query (Anserini's bag of words).
        Terms outside the vocabulary are dropped; a query left with no term gives an empty row."""
        self._require_fitted("encode_query")
        parts = [_count(self._analyze(batch), self._term_ids) for batch in _batches(texts, self.batch_size)]
        return sparse_output(self._assemble(parts, ids, lambda c: c.tf), convert_to_sparse_tensor)

    def decode(self, vectors: SparseVectors, top_k: int | None = None) -> list[list[tuple[str, float]]]:
        """Each row as [(term, weight)] by decreasing weight (ties: lower term id), at most ``top_k``."""
        return decode_rows(vectors, self._vocab, top_k)

    # ------------------------------------------------------------------ description and persistence
    def describe(self) -> dict[str, Any]:
        """JSON-able description stored with the vectors (checked when queries meet an index, and
        compared whole when an encode resumes: a format-1 fit describes itself as it always did)."""
        described = {"kind": "bm25", "k1": self.k1, "b": self.b, "lucene_lengths": self.lucene_lengths,
                     "n_docs": self.n_docs, "total_length": self.total_length, "avgdl": self.avgdl,
                     "vocab_size": self.vocab_size, "vocab_hash": vocab_hash(self._vocab),
                     "analyzer": self.analyzer.describe(), "query_weights": "count"}
        if self._stats_version >= 2:
            described["doc_count"] = self.doc_count
        return described

    def save(self, path: str | os.PathLike) -> None:
        """Write ``<path>/lexical.json`` (description + vocabulary + document frequencies), atomically."""
        self._require_fitted("save")
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        state = {"format": _FORMAT, "format_version": self._stats_version, **self.describe(),
                 "vocab": self._vocab, "df": self.df.tolist()}
        atomic_write_text(directory / _FILE, json.dumps(state, ensure_ascii=False))

    @classmethod
    def load(cls, path: str | os.PathLike) -> LexicalEncoder:
        """Read an encoder written by :meth:`save` (``path`` is the directory or the JSON file)."""
        file = Path(path)
        if file.is_dir():
            file = file / _FILE
        if not file.is_file():
            raise FileNotFoundError(f"no saved LexicalEncoder at {file}")
        try:
            state = json.loads(file.read_text(encoding="utf-8-sig"))
        except ValueError as e:   # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"{file} is not valid JSON ({e}); it is corrupt: refit the encoder (lsr encode)") from None
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            found = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{file} is not an {_FORMAT} file (format={found!r}): refit the encoder with this lsr")
        version = check_format_version(file, state.get("format_version"), max(_READABLE_VERSIONS),
                                       min(_READABLE_VERSIONS), rebuild="refit the encoder (lsr encode)")
        vocab, df = state["vocab"], np.asarray(state["df"], dtype=np.int64)
        if len(vocab) != len(df) or len(vocab) != state["vocab_size"] or vocab_hash(vocab) != state["vocab_hash"]:
            raise ValueError(f"{file} is corrupt: vocabulary, document frequencies and hash disagree")
        # format 1 counted every fitted document as N; its vectors were weighted so, and are reproduced so
        doc_count = state["n_docs"] if version == 1 else state["doc_count"]
        if not (0 <= doc_count <= state["n_docs"] and (df.size == 0 or 0 < df.max() <= doc_count)):
            raise ValueError(f"{file} is corrupt: doc_count {doc_count} does not fit n_docs {state['n_docs']} and "
                             f"the largest document frequency {int(df.max()) if df.size else 0}")
        enc = cls(state["k1"], state["b"], EnglishAnalyzer.from_description(state["analyzer"]),
                  lucene_lengths=state["lucene_lengths"])
        enc._set_stats(list(vocab), df, state["n_docs"], state["total_length"], doc_count, version)
        return enc
