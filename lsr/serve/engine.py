"""The search work behind the server: request bodies to queries, a batch of requests to top-k results.

Nothing here knows about HTTP or asyncio: ``SearchEngine.parse`` turns a decoded JSON body into a
``SearchRequest`` (or raises ``RequestError`` with a one-line message), and ``SearchEngine.run_batch``
answers several requests with one encoder call and one ``Searcher.search`` (it is what the batcher's worker
thread runs). Results are exact: the same documents and float32 scores as ``Searcher.search`` (and
``lsr search``) give for the same query vectors, since every top-k keeps the total order score descending,
doc index ascending and a request's k hits are the first k of the batch's larger k. Text queries are encoded
as ``encoder.encode_query`` encodes the batch's texts (bit for bit; short batches of a SPLADE encoder through
``lsr.encode.splade.query_graphs``, replayed as a CUDA graph on CUDA): deterministic for a given batch, while the same
text in a batch of another bucket may differ in the last bits of its weights (the encoder's GEMMs run at the
bucket's token count), as it could with the batch's padding before.

A batch runs in three steps that the batcher may put on two threads: ``prepare_batch`` (host: tokenize),
``search_batch`` (device: encode, stack, search, top-k to the host) and ``answer_batch`` (host: the hits).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lsr.search.filters import DocFilter
from lsr.search.searcher import run_depth
from lsr.serve.body import LongInt, RequestError, show_value
from lsr.serve.filters import parse_filter, row_filters, search_rows
from lsr.sparse import SparseVectors, weight_limit

__all__ = ["MAX_QUERIES_PER_REQUEST", "STAGES", "Batch", "RequestError", "SearchEngine", "SearchRequest", "load_query_encoder"]

MAX_QUERIES_PER_REQUEST = 4096
_FIELDS = ("queries", "query", "vectors")


@dataclass
class SearchRequest:
    """One request's queries: texts to encode or pre-encoded vectors (over the index vocabulary); ``filter``:
    the documents its queries may return (``lsr.serve.filters``), ``mask`` the same resolved against the index
    (``SearchEngine.resolve_filter``)."""

    texts: list[str] | None
    vectors: SparseVectors | None
    k: int
    filter: DocFilter | None = None
    mask: np.ndarray | None = None

    @property
    def n_queries(self) -> int:
        return len(self.texts) if self.texts is not None else len(self.vectors)


def load_query_encoder(model: str | Path, device: str) -> Any:
    """A fitted BM25 encoder folder (``lexical.json``, written by ``lsr encode`` as OUT/encoder) or a SPLADE
    checkpoint (local folder or Hugging Face id)."""
    path = Path(model)
    if (path / "lexical.json").is_file() or path.name == "lexical.json":
        from lsr.encode.bm25.lexical import LexicalEncoder

        return LexicalEncoder.load(path)
    from lsr.encode.splade.encoder import SpladeEncoder

    return SpladeEncoder.from_pretrained(str(model), device=device)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one ("cuda" is the current CUDA device)."""
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    return (a.index if a.index is not None else torch.cuda.current_device()) == \
        (b.index if b.index is not None else torch.cuda.current_device())


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass
class Batch:
    """One batch between ``SearchEngine``'s steps: requests, row layout (``order``: text requests first;
    ``first_row``: each request's first row), texts and their bucketed pack, then the top-k on the host."""

    requests: list[SearchRequest]
    order: list[int]
    texts: list[str]
    packed: Any
    first_row: dict[int, int]
    n_rows: int
    timings: dict[str, float] | None = None
    scores: np.ndarray | None = None
    doc_idx: np.ndarray | None = None


class SearchEngine:
    """An index loaded on ``device`` with its Searcher and, given ``model``, the query encoder.

    Args:
        index: index directory written by ``lsr index``, or an InvertedIndex (moved to ``device``).
        model: query encoder (see ``load_query_encoder``); None: requests must send pre-encoded vectors.
        device: "auto" | "cpu" | "cuda" | "cuda:N".
        k: hits per query when a request does not say; max_k: the largest k a request may ask for
            (default: max(k, 1000)).
        backend: the search backend ("auto", "torch", "gpu"), passed to the Searcher.
        pad_batches: search batches padded to a power of two (copies of the last query, whose hits are
            dropped), so the Triton path's CUDA graphs, cached per batch size, are reused instead of
            captured again for every size; default: on CUDA. The rows of filtered requests are not padded.
        metadata: the index's metadata columns (a pyarrow Table in document order) that ``"where"`` filters
            read (``Searcher(metadata=...)``); None: an index folder's own (``lsr index --metadata``), else a request
            filtering by metadata is refused (422).
    """

    def __init__(self, index: str | Path | Any, model: str | Path | None = None, device: str = "auto", k: int = 1000,
                 max_k: int | None = None, backend: str = "auto", pad_batches: bool | None = None,
                 metadata: Any = None) -> None:
        from lsr.index.inverted import InvertedIndex
        from lsr.search.searcher import Searcher, check_compatible
        from lsr.utils.devices import resolve_device

        max_k = max(k, 1000) if max_k is None else max_k
        if not 1 <= k <= max_k:
            raise ValueError(f"the default k ({k}) must lie in [1, max_k={max_k}]")
        self.device = resolve_device(device)
        self.k, self.max_k = int(k), int(max_k)
        self.index = index if isinstance(index, InvertedIndex) else InvertedIndex.load(index, device=self.device)
        if metadata is None and not isinstance(index, InvertedIndex):   # an index folder's own columns, when needed
            from lsr.search.factory import metadata_loader

            metadata = metadata_loader(index, self.index)
        self.searcher = Searcher(self.index, device=self.device, backend=backend, metadata=metadata)
        self.index = self.searcher.index  # on the search device (an index given on another one is copied)
        self.encoder = load_query_encoder(model, self.device) if model else None
        self.token_ids: dict[str, int] | None = None
        if self.encoder is not None:
            check_compatible(self.encoder.describe(), self.index.metadata)  # once here, not per batch
            if self.encoder.vocab_size != self.index.vocab_size:
                raise ValueError(f"the model's vocabulary has {self.encoder.vocab_size} terms, the index's "
                                 f"{self.index.vocab_size}: serve the index with the encoder that built it")
            self.token_ids = {t: i for i, t in enumerate(self.encoder.vocab)}
        self.pad_batches = self.searcher.device.type == "cuda" if pad_batches is None else bool(pad_batches)
        self._docnos = np.asarray(self.index.docnos, dtype=object)
        self._weight_limit = weight_limit(self.index.vocab_size)
        self._description: dict[str, Any] | None = None

    # ------------------------------------------------------------------ description
    def describe(self) -> dict[str, Any]:
        """What /health reports: sizes, device, backend, encoder and how vector keys are read."""
        if self._description is None:  # once: an encoder's description hashes its vocabulary
            enc = self.encoder.describe() if self.encoder is not None else None
            self._description = {
                "n_docs": self.index.n_docs, "vocab_size": self.index.vocab_size, "device": str(self.searcher.device),
                "backend": self.searcher.backend, "encoder": enc.get("kind") if enc else None,
                "model": (enc.get("model") or enc.get("name_or_path")) if enc else None,
                "vector_keys": "tokens" if self.token_ids is not None else "term_ids",
                "k": self.k, "max_k": self.max_k, "pad_batches": self.pad_batches}
        return dict(self._description)

    # ------------------------------------------------------------------ parsing
    def parse(self, payload: Any) -> SearchRequest:
        """A decoded JSON body -> SearchRequest; RequestError (one line) for anything else."""
        if not isinstance(payload, dict):
            raise RequestError("the body must be a JSON object with 'queries', 'query' or 'vectors'", 400)
        unknown = sorted(set(payload) - {*_FIELDS, "k", "filter"})
        if unknown:
            raise RequestError(f"unknown field {unknown[0]!r}; use 'queries', 'query' or 'vectors', 'k' and 'filter'")
        given = [f for f in _FIELDS if f in payload]
        if len(given) != 1:
            raise RequestError("give exactly one of 'queries' (list of texts), 'query' (a text) or 'vectors' "
                               f"(list of {{term: weight}}); got {given or 'none'}")
        k = self._parse_k(payload.get("k", self.k))
        flt = parse_filter(payload["filter"]) if payload.get("filter") is not None else None   # null: unfiltered
        if given[0] == "vectors":
            return SearchRequest(None, self._parse_vectors(payload["vectors"]), k, flt)
        texts = [payload["query"]] if given[0] == "query" else payload["queries"]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise RequestError("'queries' must be a non-empty list of strings and 'query' a string")
        self._check_count(len(texts))
        if self.encoder is None:
            raise RequestError("this server has no query encoder (start it with --model); send pre-encoded "
                               "'vectors' instead of texts")
        return SearchRequest(texts, None, k, flt)

    def resolve_filter(self, request: SearchRequest) -> None:
        """Resolve the request's filter against the index (``request.mask``), so that a docno the index lacks or
        an expression it cannot evaluate is this request's one-line error (RequestError, 422), never its batch's.
        O(documents): the server runs it off the event loop."""
        from lsr.search.filtered import resolve_filter

        if request.filter is not None and request.mask is None:
            try:
                request.mask = resolve_filter(self.searcher, request.filter)[0]
            except ValueError as e:
                raise RequestError(f"filter: {e}") from None

    def _parse_k(self, k: Any) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.max_k:
            raise RequestError(f"'k' must be an integer in [1, {self.max_k}], got {show_value(k)}")
        return k

    @staticmethod
    def _check_count(n: int) -> None:
        if n > MAX_QUERIES_PER_REQUEST:
            raise RequestError(f"{n} queries in one request; send at most {MAX_QUERIES_PER_REQUEST}", 413)

    def _parse_vectors(self, rows: Any) -> SparseVectors:
        """[{term: weight}] -> SparseVectors, checked here in numpy (SparseVectors.from_dicts and its validation
        cost a millisecond per request, on the event loop)."""
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise RequestError("'vectors' must be a non-empty list of {term: weight} objects")
        self._check_count(len(rows))
        parts = [self._parse_row(i, row) for i, row in enumerate(rows)]
        lengths = np.fromiter((t.size for t, _ in parts), np.int64, len(parts))
        indptr = np.zeros(len(parts) + 1, np.int64)
        np.cumsum(lengths, out=indptr[1:])
        return SparseVectors(indptr, np.concatenate([t for t, _ in parts]), np.concatenate([w for _, w in parts]),
                             None, self.index.vocab_size, validate=False)

    def _parse_row(self, i: int, row: dict) -> tuple[np.ndarray, np.ndarray]:
        """One vector's (term ids int32 ascending, weights float32 > 0), or RequestError naming the problem."""
        weights = list(row.values())
        types = set(map(type, weights))
        if LongInt in types:   # too many digits for int(): beyond float32, refused below as not finite
            weights = [float(w) if type(w) is LongInt else w for w in weights]
            types = set(map(type, weights))
        if not types <= {int, float}:  # bool is not a weight
            bad = next(w for w in weights if type(w) not in (int, float))
            raise RequestError(f"vector {i}: weights must be numbers, got {show_value(bad)}")
        try:
            with np.errstate(over="ignore"):  # beyond float32: inf, refused below
                w = np.asarray(weights, dtype=np.float32) if weights else np.zeros(0, np.float32)
        except OverflowError:  # an int beyond float64
            w = np.full(len(weights), np.inf, np.float32)
        if not (np.isfinite(w).all() and (w >= 0).all() and (w <= self._weight_limit).all()):
            raise RequestError(f"vector {i}: weights must be finite, >= 0 and <= {self._weight_limit:.3g}")
        if self.token_ids is not None:
            try:
                terms = np.array(list(map(self.token_ids.__getitem__, row)), dtype=np.int64)
            except KeyError as e:
                raise RequestError(f"vector {i}: token {e.args[0]!r} is not in the encoder vocabulary") from None
        else:
            in_range = f"vector {i}: term ids must lie in [0, {self.index.vocab_size})"
            try:
                terms = np.array(list(map(_term_id, row)), dtype=np.int64)
            except ValueError:
                raise RequestError(f"vector {i}: keys must be term ids (decimal digits; this server has no encoder "
                                   f"vocabulary), got {next((k for k in row if not _is_term_id(k)), '?')!r}") from None
            except OverflowError:
                raise RequestError(in_range) from None
            if terms.size and not (0 <= terms.min() and terms.max() < self.index.vocab_size):
                raise RequestError(in_range)
        keep = w > 0
        terms, w = terms[keep], w[keep]
        order = np.argsort(terms, kind="stable")
        terms, w = terms[order], w[order]
        if terms.size > 1 and not (np.diff(terms) > 0).all():  # "7" and "07": two keys, one term
            raise RequestError(f"vector {i}: term {int(terms[:-1][np.diff(terms) == 0][0])} is given twice")
        return terms.astype(np.int32), w

    # ------------------------------------------------------------------ searching
    def run_batch(self, requests: Sequence[SearchRequest], timings: dict[str, float] | None = None,
                  ) -> list[dict[str, Any]]:
        """Answer every request with one encoder call and one search: [{"results": [{"docnos", "scores"}]}].
        ``timings``: gets each stage's wall ms added (tokenize, encode, search, answers; see ``STAGES``).
        The three steps (``prepare_batch``, ``search_batch``, ``answer_batch``) may run on different threads."""
        return self.answer_batch(self.search_batch(self.prepare_batch(requests, timings)))

    def prepare_batch(self, requests: Sequence[SearchRequest], timings: dict[str, float] | None = None) -> Batch:
        """Host work before the device: the batch's row layout and its texts tokenized (and packed for the
        encoder's bucketed path where it applies)."""
        clock = _StageClock(timings)
        # rows: every text query first (one encoder call), then the vector queries, each in request order
        order = [i for i, r in enumerate(requests) if r.texts is not None] + \
                [i for i, r in enumerate(requests) if r.vectors is not None]
        texts = [t for i in order if requests[i].texts is not None for t in requests[i].texts]
        runner = self.query_runner() if texts else None
        packed = runner.pack(texts) if runner is not None else None
        first_row, n = {}, 0
        for i in order:
            first_row[i] = n
            n += requests[i].n_queries
        clock.lap("tokenize")
        return Batch(list(requests), order, texts, packed, first_row, n, timings)

    def search_batch(self, batch: Batch) -> Batch:
        """Device work: encode the texts, search every row; the top-k lands on the host (``batch.scores``,
        ``batch.doc_idx``) with the batch's last device sync."""
        clock = _StageClock(batch.timings)
        requests, parts = batch.requests, []
        if batch.packed is not None:
            # views of the graph's outputs: the search reads them before this thread replays the graph again
            parts.append(self.query_runner().encode_packed(batch.packed, device_output=True, copy=False))
        elif batch.texts:
            parts.append((self.encoder.encode_query(batch.texts), None))
        clock.lap("encode")
        parts += [(requests[i].vectors, None) for i in batch.order if requests[i].vectors is not None]
        queries = self._stack(parts, batch.n_rows)
        k, filters = run_depth(max(r.k for r in requests), self.index.n_docs), row_filters(batch)
        if filters is None:   # no request filters: the batch as it always ran
            scores, doc_idx = self.searcher.search(queries, k=k, show_progress_bar=False)
        else:
            scores, doc_idx = search_rows(self.searcher, queries, k, filters, lambda q: self._stack([(q, None)], len(q)))
        batch.scores, batch.doc_idx = scores.cpu().numpy(), doc_idx.cpu().numpy()  # one device sync per batch
        clock.lap("search")
        return batch

    def answer_batch(self, batch: Batch) -> list[dict[str, Any]]:
        """Host work after the device: each request's hits as {"results": [{"docnos", "scores"}]}."""
        clock = _StageClock(batch.timings)
        scores, doc_idx = batch.scores, batch.doc_idx
        answers = [{"results": [self._hits(scores[q], doc_idx[q], r.k)
                                for q in range(batch.first_row[i], batch.first_row[i] + r.n_queries)]}
                   for i, r in enumerate(batch.requests)]
        clock.lap("answers")
        return answers

    def query_runner(self) -> Any:
        """The encoder's bucketed query path (``SpladeEncoder.query_runner``) where it runs on the search's
        device, else None (also without an encoder)."""
        runner = self.encoder.query_runner() if hasattr(self.encoder, "query_runner") else None
        return runner if runner is not None and _same_device(runner.device, self.searcher.device) else None

    def search(self, request: SearchRequest) -> dict[str, Any]:
        """One request on its own (no batching)."""
        return self.run_batch([request])[0]

    def warmup(self, max_batch: int) -> None:
        """Search (and encode) once per batch size the server will use (powers of two when padding), so that
        kernel compilation and CUDA graph capture happen before the first request, not in its latency. The
        query is the first document's first 64 terms: the block path's smallest query-length bucket (with a
        query encoder also a query of 100 terms: its next bucket, which a batch of expanded texts may reach). The
        query encoder's graphs are captured for batches of up to ``max_batch`` texts of 3-24 tokens."""
        if self.encoder is not None:
            runner = self.query_runner()
            if runner is not None:
                runner.warmup(max_batch)
            self.run_batch([SearchRequest(["warm up the query encoder"], None, self.k)])
        if self.index.n_docs == 0:
            return
        first = self.index.docs[0:1].to("cpu")
        m = min(64, first.nnz)
        if m == 0:
            return
        queries = [SparseVectors([0, m], first.indices[:m], first.values[:m], None, self.index.vocab_size,
                                 validate=False)]
        V = self.index.vocab_size
        if self.encoder is not None and V >= 128:  # text batches: a query of 65-128 terms makes the next bucket
            queries.append(SparseVectors([0, 100], torch.arange(100, dtype=torch.int32) * (V // 100),
                                         torch.ones(100), None, V, validate=False))
        sizes = sorted({_next_pow2(b) for b in range(1, max_batch + 1)}) if self.pad_batches else \
            sorted({1, max_batch})
        # the commonest shapes (short queries, small batches) last: the graph cache drops the least recently used
        for query in reversed(queries):
            for b in reversed(sizes):   # a batch above graphs.capture_at_once queries is captured at its second search
                for _ in range(1 + (b > self.searcher.config.graphs.capture_at_once)):
                    self.run_batch([SearchRequest(None, query[[0] * b], self.k)])

    def _stack(self, parts: list[tuple[SparseVectors, np.ndarray | None]], n: int) -> SparseVectors:
        """The batch's n rows as one SparseVectors on the search device (ids 0..), padded to a power of two
        with copies of the last row when ``pad_batches``. Parts are (vectors, their row lengths on the host or
        None). Host parts are stacked on the host and copied once (three transfers per batch instead of three
        per request); where a part is on the device already, the others join it there, without a sync and with
        few calls into torch (each lets the event loop take the GIL: docs/architecture.md, serving)."""
        target = _next_pow2(n) if self.pad_batches else n
        dev = self.searcher.device
        place = "cpu" if dev.type == "cpu" or all(v.device.type == "cpu" for v, _ in parts) else dev.type
        vectors, lengths = [], []
        for v, lens in parts:
            if lens is None:
                lens = v.lengths.cpu().numpy()
            vectors.append(v if v.device.type == place else v.to(dev if place != "cpu" else "cpu"))
            lengths.append(lens)
        lengths = np.concatenate(lengths)
        cat = (lambda ts: ts[0]) if len(vectors) == 1 else torch.cat  # noqa: E731 - one part: read as it is
        indices, values = cat([v.indices for v in vectors]), cat([v.values for v in vectors])
        if target > n:  # copies of the last row: one gather of its terms, where they lie
            nnz, last = int(lengths.sum()), int(lengths[-1])
            src = np.concatenate([np.arange(nnz), np.tile(np.arange(nnz - last, nnz), target - n)])
            src = torch.from_numpy(src).to(indices.device)
            indices, values = indices[src], values[src]
            lengths = np.concatenate([lengths, np.full(target - n, last, dtype=np.int64)])
        indptr = np.zeros(target + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        stacked = SparseVectors(torch.from_numpy(indptr).to(indices.device), indices, values,
                                [str(i) for i in range(target)], self.index.vocab_size, validate=False)
        return stacked if place != "cpu" or dev.type == "cpu" else stacked.to(dev)

    def _hits(self, scores: np.ndarray, doc_idx: np.ndarray, k: int) -> dict[str, list]:
        n = int(np.count_nonzero(doc_idx[:k] >= 0))  # padding (-1) only follows the hits
        return {"docnos": self._docnos[doc_idx[:n]].tolist(), "scores": scores[:n].tolist()}


STAGES = ("tokenize", "encode", "search", "answers")  # the stages of run_batch that ``timings`` gets


class _StageClock:
    """Adds the wall ms since the previous lap to ``timings[stage + "_ms"]`` (nothing when timings is None)."""

    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings = timings
        self.t = time.perf_counter()

    def lap(self, stage: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            key = f"{stage}_ms"
            self.timings[key] = self.timings.get(key, 0.0) + (now - self.t) * 1000
            self.t = now


def _is_term_id(key: str) -> bool:
    # ASCII decimal digits only: int() would also take "+7", " 7", "7_0" and other scripts' digits
    return key.isascii() and key.isdigit()


def _term_id(key: str) -> int:
    if not _is_term_id(key):
        raise ValueError(f"key {key!r} is not a term id (decimal digits)")
    return int(key)
