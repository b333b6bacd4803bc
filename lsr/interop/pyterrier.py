"""PyTerrier transformers over lsr: index, retrieve and encode inside ``pt.Experiment`` pipelines.

Nothing here starts Java: the classes are plain ``pt.Transformer`` / ``pt.Indexer`` subclasses that
call lsr's encoders, :class:`~lsr.index.inverted.InvertedIndex` and :class:`~lsr.search.searcher.Searcher`.

    import pyterrier as pt
    from lsr import SpladeEncoder, load_dataset
    from lsr.interop.pyterrier import LsrIndex, get_corpus_iter, get_qrels, get_topics

    ds = load_dataset("data/scifact", "test")
    enc = SpladeEncoder.from_pretrained("data/models/splade-tiny")
    index = LsrIndex("runs/scifact-pt-index")
    index.indexer(enc).index(get_corpus_iter(ds))   # iterable of {"docno", "text"} dicts or a DataFrame
    pt.Experiment([index.retriever(enc, k=1000)], get_topics(ds), get_qrels(ds), [pt.measures.nDCG @ 10])

Results are lsr's exact top-k (ties by ascending doc index), with PyTerrier's columns ``qid, docno,
score, rank`` (rank from 0) plus the query columns. :func:`doc_encoder` / :func:`query_encoder` add
``toks`` / ``query_toks`` columns ({token: weight} dicts, as pyt_splade does); the indexer and the
retriever use such columns when present instead of encoding the text again.

Filters (``lsr.search.filters``): ``index.retriever(enc, filter=DocFilter.allow([...]))`` searches only the
documents a filter allows, for every query; a ``filter`` column of the queries (a ``DocFilter`` or a metadata
expression per query; None / NaN: none) adds one per query (both given: a document must pass both).
"""

from __future__ import annotations

import numbers
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import pyterrier as pt
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("lsr.interop.pyterrier needs PyTerrier: pip install 'lsr-gpu[pyterrier]'") from e

import numpy as np
import pandas as pd

from lsr.search.config import BACKENDS
from lsr.utils.devices import DEVICE_HELP, is_device_name, resolve_device
from lsr.utils.ranges import BLOCK_SIZES, NumberRange

__all__ = ["LsrEncoderTransformer", "LsrIndex", "LsrIndexer", "LsrRetriever", "doc_encoder", "get_corpus_iter",
           "get_qrels", "get_topics", "query_encoder"]


def get_topics(dataset: Any) -> pd.DataFrame:
    """An :class:`lsr.data.sources.Dataset`'s queries as PyTerrier topics (``qid``, ``query``)."""
    return pd.DataFrame({"qid": list(dataset.queries), "query": list(dataset.queries.values())})


def get_qrels(dataset: Any) -> pd.DataFrame:
    """An :class:`lsr.data.sources.Dataset`'s judgements as PyTerrier qrels (``qid``, ``docno``, ``label``)."""
    rows = [(q, d, g) for q, judged in dataset.qrels.items() for d, g in judged.items()]
    return pd.DataFrame(rows, columns=["qid", "docno", "label"])


def get_corpus_iter(dataset: Any) -> Iterator[dict[str, str]]:
    """An :class:`lsr.data.sources.Dataset`'s documents as ``{"docno", "text"}`` dicts (what indexers take)."""
    return ({"docno": doc_id, "text": text} for doc_id, text in dataset.docs_iter())


def _resolve_encoder(encoder: Any, device: str | None) -> Any:
    """An encoder object as is; a SPLADE model path / hub id -> SpladeEncoder (as ``lsr run`` builds it)."""
    if not isinstance(encoder, str):
        return encoder
    from lsr.config import EncoderConfig
    from lsr.encode.factory import build_encoder

    return build_encoder(EncoderConfig(kind="splade", model=encoder), resolve_device(device))


def _token_ids(encoder: Any) -> dict[str, int]:
    cached = getattr(encoder, "_lsr_pt_token_ids", None)
    if cached is None:
        cached = {tok: i for i, tok in enumerate(encoder.vocab)}
        encoder._lsr_pt_token_ids = cached  # the vocabulary of an encoder never changes once fitted
    return cached


def _from_toks(encoder: Any, rows: Iterable[Mapping[str, float]], ids: Sequence[str]) -> Any:
    from lsr.sparse import SparseVectors

    return SparseVectors.from_dicts(rows, vocab=_token_ids(encoder), ids=list(ids), vocab_size=encoder.vocab_size)


def _is_fitted(encoder: Any) -> bool:
    return getattr(encoder, "fitted", True)


def _check_count(name: str, value: Any, allowed: NumberRange = NumberRange(int, 1)) -> None:
    """A constructor's count argument (k, batch_size, ...): refused at construction, not at the first transform."""
    why = allowed.problem(value)
    if why is not None:
        raise ValueError(f"{name} {why}")


def _problem(value: Any) -> str | None:
    """Why a cell cannot be a text or an id (None, NaN, a number, ...), or None when it is a string."""
    if isinstance(value, str):
        return None
    missing = value is None or (isinstance(value, float) and value != value) or value is pd.NA or value is pd.NaT
    return "is missing (None / NaN)" if missing else f"is a {type(value).__name__} ({value!r:.40}), not a string"


def _id_text(value: Any, column: str) -> str:
    """A qid / docno as text: a string or an integer (numpy's too); None, NaN or 1.0 would become "None", "nan"
    or "1.0", matching no judgement."""
    if isinstance(value, str) or (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
        return str(value)
    raise ValueError(f"a {column!r} {_problem(value)}; give every row a string (or integer) {column!r}")


def _column(frame: pd.DataFrame, column: str, id_column: str) -> list[str]:
    """The strings of ``frame[column]``; a ValueError naming the row's id and the column for a cell that is not one
    (``astype(str)`` would search for the text "None" or "nan")."""
    values = frame[column].tolist()
    ids = frame[id_column].tolist() if id_column in frame.columns else list(range(len(values)))
    for row_id, value in zip(ids, values):
        why = _problem(value)
        if why is not None:
            where = f"{id_column} {row_id!r}" if id_column in frame.columns else f"row {row_id}"
            raise ValueError(f"the {column!r} of {where} {why}; give every row a string {column!r}")
    return values


class LsrEncoderTransformer(pt.Transformer):
    """Adds a ``toks`` (documents) or ``query_toks`` (queries) column of {token: weight} dicts."""

    def __init__(self, encoder: Any, side: str, text_field: str | None = None, batch_size: int = 256) -> None:
        if side not in ("doc", "query"):
            raise ValueError(f"side must be 'doc' or 'query', got {side!r}")
        if not _is_fitted(encoder):
            raise ValueError("the BM25 encoder is not fitted: fit it on the corpus first (encoder.fit(texts)) "
                             "or let LsrIndex(...).indexer(encoder) fit it")
        _check_count("batch_size", batch_size)
        self.encoder, self.side, self.batch_size = encoder, side, batch_size
        self.text_field = text_field or ("text" if side == "doc" else "query")

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        if self.text_field not in inp.columns:
            raise ValueError(f"the input has no {self.text_field!r} column (columns: {list(inp.columns)})")
        encode = self.encoder.encode_document if self.side == "doc" else self.encoder.encode_query
        texts = _column(inp, self.text_field, "docno" if self.side == "doc" else "qid")
        toks: list[dict[str, float]] = []
        for a in range(0, len(texts), self.batch_size):
            toks.extend(encode(texts[a:a + self.batch_size]).to_dicts(self.encoder.vocab))
        out = inp.copy()
        out["toks" if self.side == "doc" else "query_toks"] = toks
        return out


def doc_encoder(encoder: Any, text_field: str = "text", batch_size: int = 256) -> LsrEncoderTransformer:
    """Documents DataFrame (``docno``, ``text``) -> the same with a ``toks`` column."""
    return LsrEncoderTransformer(encoder, "doc", text_field, batch_size)


def query_encoder(encoder: Any, batch_size: int = 256) -> LsrEncoderTransformer:
    """Queries DataFrame (``qid``, ``query``) -> the same with a ``query_toks`` column."""
    return LsrEncoderTransformer(encoder, "query", "query", batch_size)


def _doc_rows(docs: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(docs, pd.DataFrame):
        yield from docs.to_dict("records")
    else:
        yield from docs


class LsrIndexer(pt.Indexer):
    """Documents (``docno`` + ``text``, or pre-encoded ``toks``) -> an lsr index directory."""

    def __init__(self, path: Path, encoder: Any, *, device: str | None = None, fields: Sequence[str] = ("text",),
                 block_size: int | None = None, batch_size: int | None = None, overwrite: bool = False) -> None:
        if block_size is not None:
            _check_count("block_size", block_size, BLOCK_SIZES)
        if batch_size is not None:
            _check_count("batch_size", batch_size)
        if isinstance(fields, str) or not fields or not all(isinstance(f, str) for f in fields):
            raise ValueError(f"fields must be a non-empty list of column names, got {fields!r}")
        self.path, self.encoder, self.device, self.fields = path, encoder, device, tuple(fields)
        self.block_size, self.batch_size, self.overwrite = block_size, batch_size, overwrite

    def _text(self, row: Mapping[str, Any]) -> str:
        for f in self.fields:
            if f not in row:
                raise ValueError(f"document {row.get('docno')!r} has no {f!r} field (fields={self.fields})")
            why = _problem(row[f])
            if why is not None:
                raise ValueError(f"the {f!r} of docno {row.get('docno')!r} {why}; give every document a string {f!r}")
        return " ".join(row[f] for f in self.fields).strip()

    def index(self, iter_dict: Iterable[Mapping[str, Any]] | pd.DataFrame) -> Path:
        """Encode and index the documents; the index appears at ``path`` only once complete. A BM25
        encoder that is not fitted yet is fitted on these documents (in place: use it to retrieve)."""
        from lsr.encode.corpus import encode_corpus
        from lsr.index.build import DEFAULT_BLOCK_SIZE
        from lsr.index.inverted import InvertedIndex

        if self.path.exists() and not self.overwrite:
            raise FileExistsError(f"{self.path} exists: choose another path or pass overwrite=True")
        device = resolve_device(self.device)
        rows = _doc_rows(iter_dict)
        first = next(rows, None)
        if first is None:
            raise ValueError("no documents to index")
        rows = _chain(first, rows)
        if "toks" in first:  # pre-encoded by doc_encoder(): no text is read
            docs = list(rows)
            vectors = _from_toks(self.encoder, (d["toks"] for d in docs), [_id_text(d.get("docno"), "docno") for d in docs])
            meta = self.encoder.describe()
        else:
            pairs: Iterable[tuple[str, str]] = ((_id_text(d.get("docno"), "docno"), self._text(d)) for d in rows)
            if not _is_fitted(self.encoder):
                pairs = list(pairs)
                self.encoder.fit(text for _, text in pairs)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".lsr-vectors-", dir=self.path.parent) as tmp:
                manifest = encode_corpus(self.encoder, pairs, Path(tmp) / "vectors", batch_size=self.batch_size,
                                         resume=False, show_progress_bar=False)
                return self._build(InvertedIndex, Path(tmp) / "vectors", device, manifest.get("metadata"),
                                   self.block_size or DEFAULT_BLOCK_SIZE)
        return self._build(InvertedIndex, vectors, device, meta, self.block_size or DEFAULT_BLOCK_SIZE)

    def _build(self, index_cls: Any, vectors: Any, device: str, meta: Any, block_size: int) -> Path:
        index = index_cls.build(vectors, device=device, block_size=block_size, metadata=meta)
        return index.save(self.path, overwrite=self.overwrite)


def _chain(first: Mapping[str, Any], rest: Iterator[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    yield first
    yield from rest


class LsrRetriever(pt.Transformer):
    """Queries (``qid`` + ``query``, or pre-encoded ``query_toks``) -> ``qid, docno, score, rank`` (exact)."""

    def __init__(self, index: LsrIndex, encoder: Any, k: int = 1000, device: str | None = None,
                 backend: str = "auto", filter: Any = None) -> None:
        if not _is_fitted(encoder):
            raise ValueError("the BM25 encoder is not fitted: index with LsrIndex(...).indexer(encoder) first "
                             "(it fits the encoder) or load a fitted one with LexicalEncoder.load(dir)")
        _check_count("k", k)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if device is not None and not (isinstance(device, str) and is_device_name(device)):
            raise ValueError(f"device must be None or {DEVICE_HELP}, got {device!r}")
        self.lsr_index, self.encoder, self.k, self.device, self.backend = index, encoder, k, device, backend
        self.filter = _as_filter(filter, "filter") if filter is not None else None
        self._searcher: Any = None

    def searcher(self) -> Any:
        """The lsr Searcher over the loaded index (loaded on first use, then kept)."""
        if self._searcher is None:
            from lsr.index.inverted import InvertedIndex
            from lsr.search.searcher import Searcher

            device = resolve_device(self.device)
            self._searcher = Searcher(InvertedIndex.load(self.lsr_index.path, device=device), device=device,
                                      backend=self.backend)
        return self._searcher

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        if "qid" not in inp.columns:
            raise ValueError(f"the queries have no 'qid' column (columns: {list(inp.columns)})")
        qids = [_id_text(q, "qid") for q in inp["qid"].tolist()]
        if "query_toks" in inp.columns:
            queries, meta = _from_toks(self.encoder, inp["query_toks"], qids), None
        elif "query" in inp.columns:
            queries = self.encoder.encode_query(_column(inp, "query", "qid"), ids=qids)
            meta = self.encoder.describe()
        else:
            raise ValueError(f"the queries need a 'query' or 'query_toks' column (columns: {list(inp.columns)})")
        searcher = self.searcher()
        scores, doc_idx = searcher.search(queries.to(searcher.device), k=self.k, query_metadata=meta,
                                          filter=self._query_filters(inp, qids))
        return _results_frame(inp, searcher.index.docnos, scores.cpu().numpy(), doc_idx.cpu().numpy())


    def _query_filters(self, inp: pd.DataFrame, qids: Sequence[str]) -> Any:
        """What ``Searcher.search`` gets as ``filter``: the retriever's filter, or one per query where the queries
        have a ``filter`` column (each joined with the retriever's; a value seen again reuses its DocFilter, so
        the search resolves it once)."""
        if "filter" not in inp.columns:
            return self.filter
        seen: dict[Any, Any] = {}
        out = []
        for qid, value in zip(qids, inp["filter"].tolist()):
            if _is_missing(value):
                out.append(self.filter)
                continue
            key = value if isinstance(value, str) else id(value)
            if key not in seen:
                flt = _as_filter(value, f"the 'filter' of qid {qid!r}")
                seen[key] = flt if self.filter is None else self.filter & flt
            out.append(seen[key])
        return out if any(f is not None for f in out) else None


def _is_missing(value: Any) -> bool:
    """None, NaN or pd.NA (a cell of a filter column with no filter); an array is never missing."""
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _as_filter(value: Any, name: str) -> Any:
    """A DocFilter from a DocFilter, a metadata expression (str) or a boolean mask; ValueError naming ``name``."""
    from lsr.search.filters import as_filter

    try:
        return as_filter(value)
    except TypeError:
        raise ValueError(f"{name} is a {type(value).__name__}; give a DocFilter (lsr.search.filters), a metadata "
                         "expression (str), a boolean mask or None") from None


def _results_frame(inp: pd.DataFrame, docnos: Sequence[str], scores: np.ndarray, doc_idx: np.ndarray) -> pd.DataFrame:
    """[B, k] top-k arrays -> one row per hit, best first within each query, with the query's columns."""
    q_rows, ranks = np.nonzero(doc_idx >= 0)  # row-major: queries in input order, hits in rank order
    hits = pd.DataFrame({"docno": np.asarray(docnos, dtype=object)[doc_idx[q_rows, ranks]],
                         "score": scores[q_rows, ranks].astype(np.float64), "rank": ranks.astype(np.int64)})
    query_cols = inp.reset_index(drop=True).iloc[q_rows].reset_index(drop=True)
    query_cols["qid"] = query_cols["qid"].astype(str)
    return pd.concat([query_cols, hits], axis=1)


class LsrIndex:
    """An lsr index directory seen from PyTerrier: ``.indexer(encoder)`` writes it, ``.retriever(encoder)``
    searches it. Use the same encoder for both (queries and documents share its vocabulary)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()

    def indexer(self, encoder: Any, *, device: str | None = None, fields: Sequence[str] = ("text",),
                block_size: int | None = None, batch_size: int | None = None, overwrite: bool = False) -> LsrIndexer:
        """A ``pt.Indexer``; ``encoder`` is an lsr encoder or a SPLADE model path / hub id."""
        return LsrIndexer(self.path, _resolve_encoder(encoder, device), device=device, fields=fields,
                          block_size=block_size, batch_size=batch_size, overwrite=overwrite)

    def retriever(self, encoder: Any, k: int = 1000, device: str | None = None, backend: str = "auto",
                  filter: Any = None) -> LsrRetriever:
        """A ``pt.Transformer`` returning the exact top ``k`` of each query (GPU when available) among the
        documents ``filter`` allows (a DocFilter, a metadata expression or a boolean mask; None: all)."""
        return LsrRetriever(self, _resolve_encoder(encoder, device), k=k, device=device, backend=backend,
                            filter=filter)

    def __repr__(self) -> str:
        return f"LsrIndex({str(self.path)!r})"
