"""Searcher: exact top-k retrieval over an InvertedIndex (contract: docs/architecture.md, "Search").

Two backends share query batching, checks and docno mapping (``SearchConfig.backend``; ``lsr.search.plan``
chooses, ``Searcher.explain`` prints the choice, and each backend runs the plan it is given):

* ``"torch"`` (any device, the reference): for each doc chunk, scores = docs CSR chunk @ dense query
  block^T in float32, computed as a weighted ``embedding_bag`` sum (deterministic on CUDA, unlike
  cuSPARSE SpMM), then the chunk's exact top-k is merged into the running top-k. The doc chunks (``torch_plan``)
  follow ``batches.memory``.
* ``"gpu"``: ``lsr.search.gpu_search.gpu_search`` over the term-major postings with the Triton / CUDA kernels
  (CUDA, or CPU under TRITON_INTERPRET=1). ``"auto"`` picks it on CUDA when triton imports, torch otherwise.

Results: scores float32 [B, k] descending, doc_idx int64 [B, k]; ties by ascending doc index; -1 / 0.0
padding when fewer than k docs score > 0; identical on every run.
"""

from __future__ import annotations

import logging
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lsr.index.inverted import InvertedIndex
from lsr.search.config import SearchConfig
from lsr.search.filtered import explain_filtered, search_with_filters
from lsr.search.index_cache import index_cache
from lsr.search.plan import SearchPlan, choose_backend, query_batch, torch_plan
from lsr.sparse import SparseVectors
from lsr.utils.devices import torch_device
from lsr.utils.plans import Step

__all__ = ["ENCODER_IDENTITY_KEYS", "Searcher", "check_compatible", "check_request", "exact_topk", "run_depth"]

log = logging.getLogger(__name__)

# Metadata keys that identify the encoder; query and document vectors must agree on those both carry.
# (Lengths and batch sizes legitimately differ between queries and documents, so they are not compared.)
ENCODER_IDENTITY_KEYS = ("kind", "model", "model_id", "name_or_path", "revision", "vocab_hash", "tokenizer_hash",
                         "vocab_size", "lowercase", "stemmer", "pooling", "attention")
QUERY_LANES = 16       # torch path: query columns padded to whole 512-bit float vectors (_padded_columns)


def check_compatible(query_meta: Mapping[str, Any] | None, index_meta: Mapping[str, Any] | None) -> None:
    """Raise ValueError when query and index metadata describe different encoders.

    Only keys of ``ENCODER_IDENTITY_KEYS`` present in both are compared; missing metadata passes.
    """
    if not query_meta or not index_meta:
        return
    diffs = [f"{k}: queries {query_meta[k]!r} vs index {index_meta[k]!r}" for k in ENCODER_IDENTITY_KEYS
             if k in query_meta and k in index_meta and not _same_identity(query_meta[k], index_meta[k])]
    if diffs:
        raise ValueError("queries and index were encoded differently (" + "; ".join(diffs) + "); "
                         "encode the queries with the index's encoder")


def _same_identity(a: Any, b: Any) -> bool:
    """Equal values, or two spellings of one local model folder (``data/models/x`` and its absolute path)."""
    if a == b:
        return True
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        return os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b)
    except OSError:
        return False


def check_request(queries: SparseVectors, k: int, query_metadata: Mapping[str, Any] | None, index: Any) -> int:
    """k as an int (numpy integers accepted); ValueError unless k is a positive integer and the queries fit
    ``index`` (vocabulary size, encoder metadata); ``index`` is anything with ``vocab_size`` and ``metadata``."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k <= 0:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = int(k)
    if queries.vocab_size != index.vocab_size:
        raise ValueError(f"queries have vocab_size {queries.vocab_size}, the index {index.vocab_size}: "
                         "they must come from the same encoder vocabulary")
    check_compatible(query_metadata, index.metadata)
    return k


def run_depth(k: int, n_docs: int) -> int:
    """A run's depth: k capped at the collection's documents (a run holds each document once; a k far above
    them would only allocate [queries x k] padding). The CLI, the pipelines and the server search this deep."""
    return max(1, min(k, n_docs))


def exact_topk(scores: torch.Tensor, k: int, ids: torch.Tensor | None = None,
               offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k per row with a total order: score descending, then id ascending.

    torch.topk's order among ties is unspecified, so it only supplies the k-th largest value; every
    entry >= it is a candidate, and candidates are ordered with stable sorts. Entries with score <= 0
    are never returned (documents that do not match).

    Args:
        scores: float32 [B, n] (any strides).
        k: results per row (> 0); may exceed n.
        ids: int64 [n] (shared by all rows) or [B, n] ids of the entries; default ``offset`` + the
            column index. Entries with id -1 must have score <= 0 (padding).
        offset: added to the column index when ``ids`` is None (a doc chunk's first doc).

    Returns:
        (scores float32 [B, k], ids int64 [B, k]), padded with 0.0 / -1.
    """
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    B, n = scores.shape
    dev = scores.device
    out_s = torch.zeros(B, k, dtype=torch.float32, device=dev)
    out_i = torch.full((B, k), -1, dtype=torch.int64, device=dev)
    if B == 0 or n == 0:
        return out_s, out_i
    kth = torch.topk(scores, min(k, n), dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    keep = (scores >= kth) & (scores > 0)
    rows, cols = torch.nonzero(keep, as_tuple=True)  # row-major: rows, then columns ascending
    cand_s = scores[rows, cols].to(torch.float32)
    if ids is None:
        cand_i = cols + offset  # ascending within each row already
    else:
        cand_i = (ids[cols] if ids.dim() == 1 else ids[rows, cols]).to(torch.int64)
        order = torch.sort(cand_i, stable=True).indices  # least significant key first
        rows, cand_s, cand_i = rows[order], cand_s[order], cand_i[order]
    order = torch.sort(cand_s, descending=True, stable=True).indices
    order = order[torch.sort(rows[order], stable=True).indices]
    rows, cand_s, cand_i = rows[order], cand_s[order], cand_i[order]
    counts = torch.bincount(rows, minlength=B)
    rank = torch.arange(rows.numel(), device=dev) - (torch.cumsum(counts, 0) - counts)[rows]
    sel = rank < k
    out_s[rows[sel], rank[sel]] = cand_s[sel]
    out_i[rows[sel], rank[sel]] = cand_i[sel]
    return out_s, out_i


def _default_budget(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(min(8 << 30, free // 4))
    return 1 << 30


class Searcher:
    """Exact top-k search over an InvertedIndex (a ``ShardedIndex`` takes ``lsr.search.open_searcher``).

    Args:
        index: the index (moved to ``device`` if it lives elsewhere).
        device: where to search: a torch.device, "cpu", "cuda" or "cuda:N" (default: the index's device).
        backend: shorthand for ``config.backend``: "auto" (gpu on CUDA when triton imports, else torch), "torch"
            or "gpu".
        max_memory_bytes: shorthand for ``config.batches.memory``: the torch backend's working memory (dense
            query block, chunk scores, top-k temporaries); default 1 GiB on CPU, min(8 GiB, free / 4) on CUDA.
        config: every knob of the search (``SearchConfig``); the two shorthands override its fields.
        metadata: the index's metadata columns (a pyarrow Table, one row per document in document order, or a
            function returning it at the first expression that reads it), what ``DocFilter.where`` expressions read;
            ``open_searcher`` gives an index folder's (``lsr index --metadata``), read when first needed.
    """

    def __init__(self, index: InvertedIndex, device: str | torch.device | None = None, backend: str | None = None,
                 max_memory_bytes: int | None = None, *, config: SearchConfig | None = None,
                 metadata: Any = None) -> None:
        if not isinstance(index, InvertedIndex):
            raise TypeError(f"Searcher takes an InvertedIndex, got {type(index).__name__}; "
                            "use lsr.search.open_searcher for a ShardedIndex or an index folder")
        self.device = torch_device(device) if device is not None else index.device
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.index = index if index.device == self.device else index.to(self.device)
        config = config or SearchConfig()
        if backend is not None:
            config = config.replace(backend=backend)
        if max_memory_bytes is not None:
            config = config.replace(batches={"memory": max_memory_bytes})
        self.max_memory_bytes = config.batches.memory or _default_budget(self.device)
        self.backend, self._backend_why = choose_backend(config, self.device)
        self.config = config.replace(backend=self.backend)
        self.metadata = metadata
        if metadata is not None and not callable(metadata) and metadata.num_rows != index.n_docs:
            raise ValueError(f"metadata has {metadata.num_rows:,} rows, the index {index.n_docs:,} documents: give one "
                             "row per document, in document order")
        self._gpu: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
        if self.backend == "gpu":
            from lsr.search.gpu_search import gpu_search

            self._gpu = gpu_search

    # ------------------------------------------------------------------ public
    def search(self, queries: SparseVectors, k: int | None = None, query_batch: int | None = None,
               query_metadata: Mapping[str, Any] | None = None, show_progress_bar: bool | None = None,
               filter: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k documents of every query (among those ``filter`` allows).

        Args:
            queries: B sparse queries over the index vocabulary.
            k: hits per query (> 0; may exceed n_docs, the rest is padding); default ``config.k``.
            query_batch: queries per batch (default ``config.batches.size``, else by backend: ``batches.gpu``, or
                bounded by ``batches.memory`` and at most ``batches.torch``).
            query_metadata: encoder description of the queries, checked against the index's.
            show_progress_bar: tqdm bar over batches (default: when there are several batches and a tty).
            filter: the documents to search (``lsr.search.filters``): a ``DocFilter``, a boolean mask [n_docs], a
                metadata expression (str), or a list of those, one per query (None there: that query unfiltered).
                The result is the top-k of an index of the allowed documents only (``lsr.search.filtered``).

        Returns:
            scores float32 [B, k] descending and doc_idx int64 [B, k] on the searcher's device;
            -1 / 0.0 where fewer than k documents score > 0.
        """
        k = check_request(queries, self.config.k if k is None else k, query_metadata, self.index)
        if filter is not None:
            return search_with_filters(self, queries.to(self.device), k, filter,
                                       lambda q, depth, allowed=None: self._search(q, depth, query_batch,
                                                                                   show_progress_bar, allowed))
        return self._search(queries, k, query_batch, show_progress_bar)

    def _search(self, queries: SparseVectors, k: int, query_batch: int | None, show_progress_bar: bool | None,
                allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``search`` without a filter (``allowed``: the mask route's documents, torch backend)."""
        n_q = len(queries)
        qb = self._query_batch(n_q, query_batch)[0]
        queries = queries.to(self.device)
        if n_q <= qb and queries.nnz > 0:  # one batch (e.g. a single query): no progress bar, no copies
            return self._search_batch(queries, k, allowed)
        out_s = torch.zeros(n_q, k, dtype=torch.float32, device=self.device)
        out_i = torch.full((n_q, k), -1, dtype=torch.int64, device=self.device)
        starts = range(0, n_q, qb)
        if show_progress_bar is None:
            disable = None if len(starts) >= 4 else True  # None: tqdm hides itself when not on a tty
        else:
            disable = not show_progress_bar
        for a in tqdm(starts, desc="search", unit="batch", disable=disable):
            batch = queries[a:a + qb]
            if batch.nnz == 0:
                continue  # nothing matches: keep the padding
            s, i = self._search_batch(batch, k, allowed)
            out_s[a:a + len(batch)] = s
            out_i[a:a + len(batch)] = i
        return out_s, out_i

    def search_run(self, queries: SparseVectors, k: int | None = None, query_batch: int | None = None,
                   query_metadata: Mapping[str, Any] | None = None, show_progress_bar: bool | None = None,
                   filter: Any = None) -> dict[str, dict[str, float]]:
        """Search and return a run: {qid: {docno: score}} with hits ordered best first (at most the index's
        documents per query: a deeper k would only allocate padding, ``run_depth``); ``filter`` as in ``search``."""
        from lsr.data.runs import from_topk

        k = check_request(queries, self.config.k if k is None else k, query_metadata, self.index)
        k = run_depth(k, self.index.n_docs)
        scores, doc_idx = self.search(queries, k, query_batch, query_metadata, show_progress_bar, filter)
        return from_topk(queries.ids, self.index.docnos, scores.cpu(), doc_idx.cpu())

    def explain(self, queries: SparseVectors, k: int | None = None, query_batch: int | None = None,
                filter: Any = None) -> SearchPlan:
        """The plan ``search(queries, k, query_batch)`` follows for its first batch (``str(plan)`` prints it): the
        backend, the route, the kernels, the passes, the fallbacks, graphs and chunks, each with the reason. Plans
        nothing it would not plan for the search (on the gpu backend the plan is cached for it). With a ``filter``
        (one per query: the first query's) its route comes first, then the plan of the search that route runs."""
        k = check_request(queries, self.config.k if k is None else k, None, self.index)
        if filter is not None:
            return explain_filtered(self, queries, k, query_batch, filter)
        n_q = len(queries)
        qb, qb_why = self._query_batch(n_q, query_batch)
        first = queries[:qb].to(self.device)
        if self._gpu is not None and self.index.n_docs and len(first):
            from lsr.search.plan import plan_search

            plan = plan_search(self.index, first, k, self.config)
        else:
            plan = self._torch_plan(max(len(first), 1), k)
        batches = f"{-(-n_q // qb)} of <= {qb}" if n_q else "none"
        return plan.with_steps((Step("backend", self.backend, self._backend_why),
                                Step("query batches", batches, f"{qb_why}; each batch is planned alike")))

    # ------------------------------------------------------------------ internals
    def _query_batch(self, n_queries: int, given: int | None) -> tuple[int, str]:
        return query_batch(self.config, self.backend, n_queries, self.index.vocab_size, self.max_memory_bytes, given)

    def _search_batch(self, queries: SparseVectors, k: int,
                      allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self._gpu is not None:
            assert allowed is None, "the mask route is the torch backend's (lsr.search.filtered.plan_filter)"
            return self._gpu(self.index, queries, k, self.config)
        return self._torch_batch(queries, self._torch_plan(len(queries), k), allowed)

    def _torch_plan(self, n_queries: int, k: int) -> SearchPlan:
        """The torch backend's plan of ``n_queries`` queries: doc chunks sized for the padded query block."""
        return torch_plan(n_queries, k, self._doc_chunks(-(-n_queries // QUERY_LANES) * QUERY_LANES))

    def _doc_chunks(self, n_queries: int) -> list[tuple[int, int, int, int]]:
        """Doc ranges [(row_start, row_end, nnz_start, nnz_end)] whose scores fit the memory budget."""
        n = self.index.n_docs
        dense_bytes = 8 * self.index.vocab_size * n_queries
        # chunk scores [c, b] + their transposed top-k input, mask and values: ~16 bytes per (doc, query)
        per_doc = 16 * n_queries + 16
        rows = max(1, (self.max_memory_bytes - dense_bytes) // per_doc)
        bounds = torch.arange(0, n, rows, dtype=torch.int64)
        bounds = torch.cat([bounds, torch.tensor([n])])
        nnz = self.index.docs.indptr[bounds.to(self.device)].tolist()  # one host sync for all chunks
        b = bounds.tolist()
        return [(b[j], b[j + 1], nnz[j], nnz[j + 1]) for j in range(len(b) - 1)]

    def _torch_batch(self, queries: SparseVectors, plan: SearchPlan,
                     allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference scorer: float32 sparse-dense products per doc chunk of ``plan``, exact top-k merged across
        chunks (``allowed``: bool [n_docs], the documents a filter keeps; the others score 0, no match).

        queries: b sparse queries -> (scores float32 [b, k], doc_idx int64 [b, k]).
        """
        docs, k = self.index.docs, plan.k
        b = len(queries)
        index_cache(self.index).ran.note("route", "torch-reference")
        dense_q = _padded_columns(queries.to_dense().t())  # [V, b rounded up to QUERY_LANES]
        best: tuple[torch.Tensor, torch.Tensor] | None = None
        for r0, r1, p0, p1 in plan.doc_chunks:
            if p1 == p0:
                continue
            # CSR chunk @ dense queries as a weighted embedding-bag sum: one fused kernel that sums each
            # doc's products sequentially in float32, so it is deterministic (cuSPARSE SpMM through
            # torch.sparse.mm is not: two identical calls can differ). int32
            # indices and offsets whenever they fit avoid an int64 copy of the chunk.
            wide = p1 - p0 >= 2**31
            terms = docs.indices[p0:p1].to(torch.int64) if wide else docs.indices[p0:p1]
            bags = (docs.indptr[r0:r1 + 1] - p0).to(terms.dtype)
            chunk_scores = F.embedding_bag(terms, dense_q, bags, mode="sum", per_sample_weights=docs.values[p0:p1],
                                           include_last_offset=True)[:, :b].t()  # [b, c]
            if allowed is not None:
                chunk_scores = chunk_scores.masked_fill(~allowed[r0:r1], 0.0)
            top = exact_topk(chunk_scores, k, offset=r0)
            del chunk_scores
            if best is not None:
                top = exact_topk(torch.cat([best[0], top[0]], 1), k, torch.cat([best[1], top[1]], 1))
            best = top
        if best is None:
            return exact_topk(dense_q.new_zeros(b, 0), k)
        return best


def _padded_columns(dense_t: torch.Tensor) -> torch.Tensor:
    """[V, b] queries as a contiguous [V, b'] block, b' = b rounded up to QUERY_LANES with zero columns. The CPU
    embedding_bag sums a row's full vector lanes with other instructions than its remainder, so a query's
    scores changed bits with the batch width it came in (a served query differed from the same query searched
    alone); with whole lanes only they do not, and one query is no longer the slow remainder-only case."""
    V, b = dense_t.shape
    out = dense_t.new_zeros(V, -(-max(b, 1) // QUERY_LANES) * QUERY_LANES)
    out[:, :b] = dense_t
    return out
