"""Anserini / Pyserini vector formats.

* **Pre-encoded queries** (``--impact --pretokenized`` topics): ``qid<TAB>tok tok tok ...``, every
  token repeated ``q = round(w * scale)`` times, so ``w = count / scale``.
* **JSON vector collections** (Anserini ``JsonVectorCollection``): one JSON object per line,
  ``{"id": ..., "contents": "...", "vector": {"tok": weight}}`` with integer (quantized) or float
  weights. Seismic's files name the text field ``content``; both are accepted.

The scale of a query file is not stored in it. :data:`ANSERINI_QUERY_SCALE` = 1000 is the one
measured on the shipped SPLADE++ ED topics (Anserini ``splade-pp-ed``): against the float vectors of
the same 5 dev queries (data/splade-samples) the term sets are identical and count / weight has a
median of 999.99 (see data/msmarco-passage/SOURCE.md). Other files differ: the ``splade-v3`` topics
fit ~100, Anserini's on-the-fly ONNX query encoders use 256 / 5 = 51.2 and its SPLADE v2 document
vectors 100. The scale only multiplies every query's scores by one constant, so rankings do not
depend on it; it matters when weights are compared with float vectors.

``vocab`` is everywhere one of: a token -> id mapping, a list of tokens (index = id), a
``vocab.txt`` path (one token per line), a tokenizer folder (``vocab.txt`` or ``tokenizer.json``),
or an object with ``get_vocab()`` (a Hugging Face tokenizer).
"""

from __future__ import annotations

import json
import os
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lsr.data.readers import json_type
from lsr.sparse import SparseVectors
from lsr.storage.files import PathLike, atomic_write, iter_lines, iter_tsv_pairs
from lsr.utils.ids import check_id

__all__ = [
    "ANSERINI_QUERY_SCALE",
    "load_vocab",
    "read_anserini_documents",
    "read_anserini_queries",
    "write_anserini_queries",
    "write_jsonl_vectors",
]

ANSERINI_QUERY_SCALE = 1000.0
CHUNK_ROWS = 65536   # rows collected before they become one CSR part
VocabLike = Mapping[str, int] | Sequence[str] | PathLike | Any


def load_vocab(vocab: VocabLike) -> dict[str, int]:
    """Resolve any accepted vocabulary form (see the module docstring) to {token: id}."""
    if isinstance(vocab, Mapping):
        return {str(t): int(i) for t, i in vocab.items()}
    if hasattr(vocab, "get_vocab"):
        return dict(vocab.get_vocab())
    if isinstance(vocab, (str, os.PathLike)):
        path = Path(vocab)
        if path.is_dir():
            if (path / "vocab.txt").is_file():
                path = path / "vocab.txt"
            elif (path / "tokenizer.json").is_file():
                model = json.loads((path / "tokenizer.json").read_text(encoding="utf-8-sig"))["model"]
                raw = model["vocab"]  # WordPiece / BPE: {token: id}; Unigram: [[token, score], ...]
                return dict(raw) if isinstance(raw, dict) else {tok: i for i, (tok, _) in enumerate(raw)}
            else:
                raise FileNotFoundError(f"{path} has neither vocab.txt nor tokenizer.json")
        tokens = [line for _, line in iter_lines(path)]
    elif isinstance(vocab, Sequence):
        tokens = [str(t) for t in vocab]
    else:
        raise TypeError(f"cannot use {type(vocab).__name__} as a vocabulary")
    out = {tok: i for i, tok in enumerate(tokens)}
    if len(out) != len(tokens):
        dup = next(t for t, c in Counter(tokens).items() if c > 1)
        raise ValueError(f"token {dup!r} appears twice in the vocabulary")
    return out


def _id_to_token(vocab: VocabLike, vocab_size: int) -> list[str]:
    tok2id = load_vocab(vocab)
    tokens = [""] * max(vocab_size, max(tok2id.values(), default=-1) + 1)
    for tok, i in tok2id.items():
        tokens[i] = tok
    return tokens


class _Builder:
    """Collects rows of token -> weight, mapping tokens through the vocabulary.

    Rows are turned into CSR every ``chunk_rows`` rows (compact ``array`` buffers in between), so a
    corpus-sized file (MS MARCO: 8.8M docs x ~130 terms) never sits in Python lists.
    """

    def __init__(self, vocab: VocabLike, unknown: str, scale: float | None, chunk_rows: int = CHUNK_ROWS) -> None:
        if unknown not in ("error", "drop"):
            raise ValueError("unknown must be 'error' or 'drop'")
        if scale is not None and not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.vocab, self.unknown, self.scale, self.chunk_rows = load_vocab(vocab), unknown, scale, chunk_rows
        self.vocab_size = max(self.vocab.values(), default=-1) + 1
        self.parts: list[SparseVectors] = []
        self._reset()

    def _reset(self) -> None:
        self.rows, self.cols, self.vals = array("i"), array("i"), array("d")
        self.ids: list[str] = []

    def add(self, row_id: str, weights: Mapping[str, float], where: str) -> None:
        check_id(row_id, "id", where)
        tokens = list(weights)
        cols = [self.vocab.get(t) for t in tokens]
        vals = list(weights.values())
        if None in cols:
            if self.unknown == "error":
                raise ValueError(f"{where}: token {tokens[cols.index(None)]!r} of {row_id!r} is not in the "
                                 "vocabulary (pass unknown='drop' to skip such tokens)")
            keep = [i for i, c in enumerate(cols) if c is not None]
            cols, vals, tokens = [cols[i] for i in keep], [vals[i] for i in keep], [tokens[i] for i in keep]
        try:
            self.vals.extend(vals)
        except TypeError:
            raise ValueError(f"{where}: weights of {row_id!r} must be numbers") from None
        limit = _F32_MAX * (self.scale or 1.0)   # stored as float32 after the division by scale
        bad = next((i for i, v in enumerate(vals) if not 0 <= v <= limit), None)   # (NaN fails both)
        if bad is not None:
            del self.vals[len(self.vals) - len(vals):]
            raise ValueError(f"{where}: the weight of {tokens[bad]!r} in "
                             f"{row_id!r} is {vals[bad]!r}; weights must be finite, >= 0 and fit a float32")
        self.rows.extend([len(self.ids)] * len(cols))
        self.cols.extend(cols)
        self.ids.append(row_id)
        if len(self.ids) >= self.chunk_rows:
            self._flush()

    def _flush(self) -> None:
        vals = np.frombuffer(self.vals, dtype=np.float64)
        if self.scale is not None:
            vals = vals / self.scale
        # from_coo sorts terms, drops zero weights (quantized to 0) and rejects NaN / negative ones
        self.parts.append(SparseVectors.from_coo(
            np.frombuffer(self.rows, np.int32), np.frombuffer(self.cols, np.int32), vals.astype(np.float32),
            len(self.ids), self.ids, self.vocab_size))
        self._reset()

    def build(self) -> SparseVectors:
        if self.ids or not self.parts:
            self._flush()
        return self.parts[0] if len(self.parts) == 1 else SparseVectors.concat(self.parts)


_F32_MAX = float(np.finfo(np.float32).max)
_OTHER_WS = "\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # ASCII whitespace that str.split() splits on, besides " "


def _count_tokens(text: str) -> dict[str, int]:
    """``Counter(text.split())``, but fast on Anserini query files (1 GB for MS MARCO dev): there a
    token's copies are adjacent, so each run is measured with O(log count) C-level ``startswith``
    calls instead of materialising every copy. Non-adjacent copies are still summed correctly."""
    if not text.isascii() or any(c in text for c in _OTHER_WS):  # other whitespace: the plain way
        return dict(Counter(text.split()))
    s = text + " "  # every token is now followed by a space
    out: dict[str, int] = {}
    p, n = 0, len(s)
    while p < n:
        if s[p] == " ":
            p += 1
            continue
        unit = s[p:s.index(" ", p) + 1]  # token + one space
        lo = 1  # invariant: s holds >= lo copies of unit at p, and fewer than hi
        while s.startswith(unit * (2 * lo), p):
            lo *= 2
        hi = 2 * lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if s.startswith(unit * mid, p) else (lo, mid)
        out[unit[:-1]] = out.get(unit[:-1], 0) + lo
        p += lo * len(unit)
    return out


def read_anserini_queries(path: PathLike, vocab: VocabLike, scale: float | None = ANSERINI_QUERY_SCALE,
                          *, unknown: str = "error", chunk_rows: int = CHUNK_ROWS) -> SparseVectors:
    """Read ``qid<TAB>tok tok ...`` pre-encoded queries (``.gz`` ok): weight = count / scale.

    ``scale=None`` keeps the raw counts. A token outside ``vocab`` raises naming it and its qid,
    unless ``unknown="drop"``. Row order and ids follow the file. ``chunk_rows``: rows read before they
    are packed into one CSR part (bounds the Python-side buffers; the result is the same).
    """
    builder = _Builder(vocab, unknown, scale, chunk_rows)
    for n, qid, tokens in iter_tsv_pairs(path, "qid<TAB>tokens"):
        builder.add(qid, _count_tokens(tokens), f"{path}:{n}")
    return builder.build()


def _vector_files(path_or_paths: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(path_or_paths, (str, os.PathLike)):
        path = Path(path_or_paths)
        if path.is_dir():  # an Anserini collection folder: every .json / .jsonl file, in name order
            files = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz")))
            if not files:
                raise FileNotFoundError(f"{path} holds no .json / .jsonl(.gz) vector files")
            return files
        return [path]
    return [Path(p) for p in path_or_paths]


def read_anserini_documents(path_or_paths: PathLike | Iterable[PathLike], vocab: VocabLike,
                            scale: float | None = None, *, unknown: str = "error", chunk_rows: int = CHUNK_ROWS,
                            ) -> SparseVectors:
    """Read Anserini/Pyserini JSON vector files (JSONL; ``.gz`` ok; a folder = all its files).

    Each line: ``{"id": ..., "contents" or "content": ..., "vector": {token: weight}}``; weights
    are divided by ``scale`` when given (e.g. 100 for integer-quantized vectors). Text is ignored.
    ``chunk_rows``: as ``read_anserini_queries``.
    """
    builder = _Builder(vocab, unknown, scale, chunk_rows)
    for file in _vector_files(path_or_paths):
        for n, line in iter_lines(file):
            if line.strip():
                builder.add(*_vector_line(line, f"{file}:{n}"))
    return builder.build()


_VECTOR_LINE = 'expected an Anserini vector line {"id": "...", "contents": "...", "vector": {"token": weight, ...}}'


def _vector_line(line: str, where: str) -> tuple[str, dict[str, float], str]:
    """(id, {token: weight}, where) of one JSON vector line, its JSON types checked: the id a string or an
    integer (a null id is not the document 'None'), the vector an object of numbers (not booleans)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: invalid JSON ({e}); {_VECTOR_LINE}") from None
    if not isinstance(obj, dict) or "id" not in obj or "vector" not in obj:
        got = json_type(obj) if not isinstance(obj, dict) else f"fields {sorted(obj)[:8]}"
        raise ValueError(f"{where}: {_VECTOR_LINE}, got {got}")
    doc_id, vector = obj["id"], obj["vector"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise ValueError(f"{where}: 'id' must be a string or an integer, got {json.dumps(doc_id)[:40]}")
    if not isinstance(vector, dict):
        raise ValueError(f"{where}: 'vector' must be a JSON object {{token: weight}}, got {json_type(vector)}: "
                         f"{json.dumps(vector)[:40]}")
    bad = next((t for t, w in vector.items() if isinstance(w, bool) or not isinstance(w, (int, float))), None)
    if bad is not None:
        raise ValueError(f"{where}: the weight of {bad!r} in {str(doc_id)!r} must be a number, got "
                         f"{json.dumps(vector[bad])[:40]}")
    return str(doc_id), vector, where


def _rows(vectors: SparseVectors, vocab: VocabLike, scale: float | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, {token: weight}) per row; with ``scale`` the weights become round(w * scale), zeros dropped."""
    tokens = _id_to_token(vocab, vectors.vocab_size)
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    ip = vectors.indptr.cpu().numpy()
    ix = vectors.indices.cpu().numpy()
    val = vectors.values.cpu().numpy().astype(np.float64)
    if scale is not None:
        val = np.rint(val * scale)
    for r, row_id in enumerate(vectors.ids):
        a, b = int(ip[r]), int(ip[r + 1])
        if scale is None:
            row = {tokens[t]: float(np.float32(w)) for t, w in zip(ix[a:b].tolist(), val[a:b].tolist())}
        else:
            row = {tokens[t]: int(w) for t, w in zip(ix[a:b].tolist(), val[a:b].tolist()) if w > 0}
        if "" in row:
            raise ValueError(f"row {row_id!r} uses a term id that has no token in the vocabulary")
        yield row_id, row


def write_jsonl_vectors(vectors: SparseVectors, path: PathLike, vocab: VocabLike, scale: float | None = None,
                        contents: Sequence[str] | None = None) -> None:
    """Write an Anserini ``JsonVectorCollection`` file (``.gz`` ok; atomic).

    Weights are floats, or ``round(w * scale)`` integers when ``scale`` is given (Anserini's
    ``-impact`` indexes need integers; 100 is the usual factor). ``contents`` optionally gives the text.
    """
    if contents is not None and len(contents) != len(vectors):
        raise ValueError(f"got {len(contents)} texts for {len(vectors)} vectors")
    with atomic_write(path) as f:
        for r, (row_id, row) in enumerate(_rows(vectors, vocab, scale)):
            obj = {"id": row_id, "contents": contents[r] if contents is not None else "", "vector": row}
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")


def write_anserini_queries(vectors: SparseVectors, path: PathLike, vocab: VocabLike,
                           scale: float = ANSERINI_QUERY_SCALE) -> None:
    """Write ``qid<TAB>tok tok ...`` pre-encoded queries, each token repeated round(w * scale) times."""
    with atomic_write(path) as f:
        for row_id, row in _rows(vectors, vocab, scale):
            if any(c.isspace() for c in row_id) or any(any(c.isspace() for c in t) for t in row):
                raise ValueError(f"query {row_id!r}: ids and tokens must not contain whitespace in this format")
            f.write(row_id + "\t" + " ".join(" ".join([tok] * q) for tok, q in row.items()) + "\n")
