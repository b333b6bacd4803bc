"""Filtered search: the exact top-k among the documents a filter allows (``lsr.search.filters``).

The answer is the top-k of an index built from the allowed documents only: the same documents, in the same order
(score descending, ties by ascending document index), with their indices in the index searched. ``plan_filter``
picks one route by the filter's selectivity and ``SearchConfig.filters``; ``Searcher.explain(filter=...)`` prints it.

* ``subset`` (narrow filters: at most ``filters.subset_docs`` documents or ``filters.subset_fraction`` of them): an
  index of the allowed documents is built from the doc-major CSR on the search device (kept per index for a
  repeated filter) and searched; its document indices are mapped back. It *is* the index of the allowed documents.
* ``mask`` (broad filters, torch backend): each document chunk's scores of the other documents are set to 0 (no
  match) before the chunk's top-k.
* ``widen`` (broad filters, gpu backend): the top-k' of the whole index, k' = min(k + denied, k / allowed fraction *
  ``filters.widen_margin``); the other documents are dropped and the first k kept. Exact: a document outside the
  top-k' ranks after every document inside it, so the allowed top-k lies inside whenever k of it are allowed;
  a query whose top-k' holds fewer (and was not cut by its last positive score) is searched again 4x deeper.

The torch backend scores a document by its own terms alone, so every route gives the bits of the index of the
allowed documents. The gpu backend's fixed-point scale comes from the index's per-term maxima (``kernels.fixed``):
``mask`` / ``widen`` scores are the whole index's, which equal the subset index's except where a score lies within
one float64 rounding of a float32 rounding boundary (rare; the order then still follows the float64 reference).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from lsr.search.config import FilterTuning
from lsr.search.filters import DocFilter, as_filter, mask_key
from lsr.search.index_cache import index_cache
from lsr.utils.plans import Step

__all__ = ["FilterPlan", "cached_subset", "explain_filtered", "no_hits", "plan_filter", "resolve_filter", "search_subset",
           "search_widened", "search_with_filters"]

Search = Callable[..., tuple[torch.Tensor, torch.Tensor]]   # (queries, k[, allowed]) -> (scores, doc_idx)


@dataclass(frozen=True)
class FilterPlan:
    """The route of one filtered search and why (``step()`` is its row in ``--explain``)."""

    route: str           # "all" (nothing filtered out) | "none" (nothing allowed) | "subset" | "mask" | "widen"
    n_allowed: int
    n_docs: int
    k_search: int        # widen: the first depth searched
    filter: str          # the filter, as ``str(DocFilter)`` writes it
    why: str

    def step(self) -> Step:
        share = f"{self.n_allowed:,} of {self.n_docs:,} documents allowed"
        depth = f", first top-{self.k_search:,}" if self.route == "widen" else ""
        return Step("filter", f"{self.route}{depth}", f"{self.filter}: {share}; {self.why}")


def plan_filter(mask: np.ndarray, k: int, backend: str, cfg: FilterTuning, described: str = "") -> FilterPlan:
    """The route of a search of ``mask``'s allowed documents (bool [n_docs]) for top-``k`` on ``backend``."""
    n, allowed = len(mask), int(np.count_nonzero(mask))

    def plan(route: str, why: str, k_search: int = k) -> FilterPlan:
        return FilterPlan(route, allowed, n, k_search, described, why)

    if allowed == n:
        return plan("all", "every document is allowed: the search is not filtered")
    if allowed == 0:
        return plan("none", "no document is allowed: every result is padding")
    route, why = cfg.route, "filters.route"
    if route == "auto":
        narrow = allowed <= max(cfg.subset_docs, cfg.subset_fraction * n)
        if narrow:
            route, why = "subset", (f"auto: at most {cfg.subset_docs:,} documents or {cfg.subset_fraction:g} of them "
                                    "(filters.subset_docs / subset_fraction)")
        else:
            route = "mask" if backend == "torch" else "widen"
            why = f"auto: a broad filter on the {backend} backend"
    if route == "mask" and backend != "torch":
        raise ValueError("filters.route=mask needs the torch backend (search.backend=torch); the gpu backend's routes "
                         "are subset and widen")
    return plan(route, why, widened_depth(k, n, allowed, cfg.widen_margin) if route == "widen" else k)


def widened_depth(k: int, n: int, allowed: int, margin: float) -> int:
    """The first depth of the widen route: enough for k allowed documents when they are spread like the rest."""
    return max(1, min(n, k + (n - allowed), math.ceil(k * margin * n / allowed)))


def search_subset(index: object, mask: np.ndarray, queries: object, k: int, cfg: FilterTuning,
                  searcher_of: Callable[[object], Search]) -> tuple[torch.Tensor, torch.Tensor]:
    """The subset route: search an index of the allowed documents (built once per filter and index) and map its
    document indices back to ``index``'s."""
    rows, sub = cached_subset(index, mask, cfg)
    scores, idx = searcher_of(sub)(queries, k)
    return scores, torch.where(idx >= 0, rows[idx.clamp_min(0)], idx)


def cached_subset(index: object, mask: np.ndarray, cfg: FilterTuning) -> tuple[torch.Tensor, object]:
    """(the allowed documents' indices on the index's device, an index of them in their order, layout and block
    size), built at a filter's first search and kept per index (``filters.subset_cache``)."""
    from lsr.index.inverted import InvertedIndex

    def build() -> tuple[torch.Tensor, InvertedIndex]:
        rows = torch.from_numpy(np.flatnonzero(mask)).to(index.device)
        return rows, InvertedIndex.build(index.docs[rows], index.device, block_size=index.block_size,
                                         metadata=dict(index.metadata), postings=index.postings)

    return index_cache(index).subset(mask_key(mask), build, max(cfg.subset_cache, 1))


def no_hits(n_queries: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Padding only: scores 0.0 and doc indices -1, [n_queries, k]."""
    return (torch.zeros(n_queries, k, dtype=torch.float32, device=device),
            torch.full((n_queries, k), -1, dtype=torch.int64, device=device))


def search_widened(allowed: torch.Tensor, queries: object, k: int, k_search: int, n_docs: int,
                   search: Search) -> tuple[torch.Tensor, torch.Tensor]:
    """The widen route: top-``k_search`` of the whole index, the documents ``allowed`` (bool [n_docs] on the search
    device) does not hold dropped, the first ``k`` kept; queries left short are searched again 4x deeper."""
    n_q = len(queries)
    out_s, out_i = no_hits(n_q, k, allowed.device)
    todo = torch.arange(n_q, device=allowed.device)
    depth = k_search
    while todo.numel():
        part = queries if todo.numel() == n_q else queries[todo]
        scores, idx = search(part, depth)
        keep = (idx >= 0) & allowed[idx.clamp_min(0)]
        # allowed hits first, each row's order kept (a stable sort of "not kept")
        order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :k]
        got = torch.gather(keep, 1, order)
        s = torch.where(got, torch.gather(scores, 1, order), 0.0)
        i = torch.where(got, torch.gather(idx, 1, order), -1)
        if s.shape[1] < k:   # depth < k: pad
            s = torch.nn.functional.pad(s, (0, k - s.shape[1]))
            i = torch.nn.functional.pad(i, (0, k - i.shape[1]), value=-1)
        out_s[todo], out_i[todo] = s, i
        # a row is complete with k allowed hits, or when its top-depth ended in padding (every match was seen)
        short = (keep.sum(1) < k) & (idx[:, -1] >= 0)
        if depth >= n_docs or not bool(short.any()):
            break
        todo, depth = todo[short], min(n_docs, depth * 4)
    return out_s, out_i


def resolve_filter(searcher: object, value: object) -> tuple[np.ndarray, str]:
    """(mask bool [n_docs], description) of a filter input against ``searcher``'s index and metadata."""
    flt = as_filter(value)
    docnos = index_cache(searcher.index).docno_array(searcher.index.docnos)
    return flt.resolve(docnos, searcher.metadata), str(flt)


def per_query_filters(value: object, n_queries: int) -> list[object] | None:
    """The list of per-query filters when ``value`` is one (a list of DocFilter / str / None, one per query),
    else None (one filter for every query: a DocFilter, an expression or a boolean mask)."""
    if not isinstance(value, (list, tuple)) or not any(
            isinstance(v, (DocFilter, str, np.ndarray, torch.Tensor)) or v is None for v in value):
        return None   # (a list of bools is one mask)
    if len(value) != n_queries:
        raise ValueError(f"{len(value)} filters for {n_queries} queries: give one per query, or one for all")
    return list(value)


def search_with_filters(searcher: object, queries: object, k: int, value: object,
                        search: Search) -> tuple[torch.Tensor, torch.Tensor]:
    """``Searcher.search`` with a filter, one for all queries or one per query; ``search(queries, k[, allowed])``
    is the searcher's unfiltered search."""
    per_query = per_query_filters(value, len(queries))
    if per_query is None:
        mask, described = resolve_filter(searcher, value)
        return search_filtered(searcher, queries, k, mask, described, search)
    if all(v is None for v in per_query):
        return search(queries, k)
    groups: dict[bytes | None, list[int]] = {}
    masks: dict[bytes | None, tuple[np.ndarray, str]] = {}
    resolved: dict[int, bytes] = {}   # the same filter object given to many queries is resolved once
    for q, v in enumerate(per_query):
        key = None
        if v is not None:
            if id(v) not in resolved:
                mask, described = resolve_filter(searcher, v)
                resolved[id(v)] = mask_key(mask)
                masks.setdefault(resolved[id(v)], (mask, described))
            key = resolved[id(v)]
        groups.setdefault(key, []).append(q)
    dev = searcher.device
    out_s, out_i = no_hits(len(queries), k, dev)
    for key, rows in groups.items():
        part = queries[torch.tensor(rows, device=dev)]
        s, i = search(part, k) if key is None else search_filtered(searcher, part, k, *masks[key], search)
        out_s[rows], out_i[rows] = s, i
    return out_s, out_i


def search_filtered(searcher: object, queries: object, k: int, mask: np.ndarray, described: str,
                    search: Search) -> tuple[torch.Tensor, torch.Tensor]:
    """One filter's search, by the route ``plan_filter`` gives."""
    index = searcher.index
    plan = plan_filter(mask, k, searcher.backend, searcher.config.filters, described)
    index_cache(index).ran.note("filter", plan.route)
    if plan.route == "all":
        return search(queries, k)
    if plan.route == "none":
        return no_hits(len(queries), k, searcher.device)
    if plan.route == "subset":
        def searcher_of(sub: object) -> Search:
            return type(searcher)(sub, searcher.device, config=searcher.config).search
        return search_subset(index, mask, queries, k, searcher.config.filters, searcher_of)
    allowed = torch.from_numpy(mask).to(searcher.device)
    if plan.route == "mask":
        return search(queries, k, allowed)
    return search_widened(allowed, queries, k, plan.k_search, index.n_docs, search)


def explain_filtered(searcher: object, queries: object, k: int, query_batch: int | None, value: object) -> object:
    """``Searcher.explain`` with a filter: the filter's route, then the plan of the search it runs (the subset
    route's on the index of the allowed documents, built and kept for the search)."""
    per_query = per_query_filters(value, len(queries))
    first = per_query[0] if per_query is not None else value
    if first is None:
        return searcher.explain(queries, k, query_batch)
    mask, described = resolve_filter(searcher, first)
    plan = plan_filter(mask, k, searcher.backend, searcher.config.filters, described)
    target, depth = searcher, plan.k_search
    if plan.route == "subset":
        sub = cached_subset(searcher.index, mask, searcher.config.filters)[1]
        target = type(searcher)(sub, searcher.device, config=searcher.config)
    inner = target.explain(queries, depth, query_batch)
    return inner.with_steps((plan.step(),))
