"""A search request's ``"filter"`` field -> an ``lsr.search.filters.DocFilter``, with one-line errors naming the field.

Shapes (one key per object; ``"missing"`` only beside ``allow`` / ``deny``)::

    {"allow": ["doc1", ...], "missing": "ignore"}    only these documents ("missing": "error" by default)
    {"deny": ["doc1", ...]}                           every document but these
    {"where": "year >= 2015 and lang == 'en'"}        metadata columns (DocFilter.where; needs an index with them)
    {"and": [f, f, ...]}, {"or": [f, ...]}, {"not": f}

Bounds keep a request from costing more than it is worth: at most ``MAX_FILTER_DOCNOS`` docnos over the whole
filter, ``MAX_FILTER_NODES`` filter objects and ``MAX_FILTER_DEPTH`` levels of nesting (413 beyond a bound); an
``and`` / ``or`` list is combined as a balanced tree, so resolving it never recurses deeper than its nesting
allows. Which docnos the index holds and what an expression reads is checked when the filter is resolved
against the index (``SearchEngine.resolve_filter``, off the event loop), with the library's one-line errors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lsr.search.filters import DocFilter
from lsr.serve.body import RequestError, show_value

__all__ = ["MAX_FILTER_DEPTH", "MAX_FILTER_DOCNOS", "MAX_FILTER_NODES", "MAX_WHERE_CHARS", "parse_filter",
           "row_filters", "search_rows"]

MAX_FILTER_DOCNOS = 1_000_000
MAX_FILTER_NODES = 1_000
MAX_FILTER_DEPTH = 32
MAX_WHERE_CHARS = 10_000
_KINDS = ("allow", "deny", "where", "and", "or", "not")


@dataclass
class _Budget:
    docnos: int = 0
    nodes: int = 0


def parse_filter(value: Any, field: str = "filter") -> DocFilter:
    """The ``DocFilter`` a request's ``filter`` value describes; RequestError (422, 413 past a bound) naming the
    field (``filter.and[1].allow``) for any other value."""
    return _parse(value, field, 1, _Budget())


def _parse(value: Any, field: str, depth: int, budget: _Budget) -> DocFilter:
    if depth > MAX_FILTER_DEPTH:
        raise RequestError(f"{field} nests filters deeper than {MAX_FILTER_DEPTH} levels; flatten it "
                           "(an 'and' / 'or' list takes many filters)", 413)
    budget.nodes += 1
    if budget.nodes > MAX_FILTER_NODES:
        raise RequestError(f"the filter has more than {MAX_FILTER_NODES:,} filter objects; merge docno lists", 413)
    if not isinstance(value, dict):
        raise RequestError(f"{field} must be an object with one of {_quoted(_KINDS)}, got {show_value(value)}")
    kinds = [key for key in value if key in _KINDS]
    unknown = [key for key in value if key not in _KINDS and key != "missing"]
    if unknown:
        raise RequestError(f"{field} has an unknown key {unknown[0]!r}; use one of {_quoted(_KINDS)} "
                           "(and 'missing' beside 'allow' / 'deny')")
    if len(kinds) != 1:
        raise RequestError(f"{field} must hold exactly one of {_quoted(_KINDS)}, got {kinds or 'none'}")
    kind = kinds[0]
    if "missing" in value and kind not in ("allow", "deny"):
        raise RequestError(f"{field}.missing belongs beside 'allow' or 'deny', not {kind!r}")
    at = f"{field}.{kind}"
    body = value[kind]
    if kind in ("allow", "deny"):
        return _docnos(kind, body, value.get("missing", "error"), at, budget)
    if kind == "where":
        return _where(body, at)
    if kind == "not":
        return ~_parse(body, at, depth + 1, budget)
    if not isinstance(body, list) or not body:
        raise RequestError(f"{at} must be a non-empty list of filters, got {show_value(body)}")
    parts = [_parse(part, f"{at}[{i}]", depth + 1, budget) for i, part in enumerate(body)]
    return _balanced(parts, kind)


def _docnos(kind: str, docnos: Any, missing: Any, at: str, budget: _Budget) -> DocFilter:
    if not isinstance(docnos, list) or not all(isinstance(d, str) for d in docnos):
        raise RequestError(f"{at} must be a list of strings (docnos), got {show_value(docnos)}")
    budget.docnos += len(docnos)
    if budget.docnos > MAX_FILTER_DOCNOS:
        raise RequestError(f"the filter lists more than {MAX_FILTER_DOCNOS:,} docnos; send a shorter list "
                           "(or its complement with 'deny' / 'allow')", 413)
    if missing not in ("error", "ignore"):
        raise RequestError(f"{at.rsplit('.', 1)[0]}.missing must be 'error' or 'ignore', got {show_value(missing)}")
    return DocFilter.allow(docnos, missing) if kind == "allow" else DocFilter.deny(docnos, missing)


def _where(expression: Any, at: str) -> DocFilter:
    if not isinstance(expression, str) or not expression.strip():
        raise RequestError(f"{at} must be a non-empty string (a metadata expression), got {show_value(expression)}")
    if len(expression) > MAX_WHERE_CHARS:
        raise RequestError(f"{at} has {len(expression):,} characters; send at most {MAX_WHERE_CHARS:,}", 413)
    try:
        return DocFilter.where(expression)
    except ImportError:   # an lsr without the expression parser (lsr.index.filter_expr)
        raise RequestError(f"{at}: this lsr has no metadata expressions (lsr.index.filter_expr); filter by docnos "
                           "with 'allow' / 'deny'", 422) from None
    except ValueError as e:   # the parser's one line (a syntax error, an unknown operator)
        raise RequestError(f"{at}: {e}") from None


def _balanced(parts: list[DocFilter], kind: str) -> DocFilter:
    """``parts`` joined by ``&`` / ``|`` as a balanced tree (a left-deep chain of 1,000 would recurse 1,000
    levels when resolved)."""
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    left, right = _balanced(parts[:mid], kind), _balanced(parts[mid:], kind)
    return left & right if kind == "and" else left | right


def _quoted(names: tuple[str, ...]) -> str:
    return ", ".join(repr(n) for n in names)


def search_rows(searcher: Any, queries: Any, k: int, filters: Sequence[DocFilter | None],
                pad: Callable[[Any], Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch whose rows carry filters (``filters``: one per row of ``queries``, None: unfiltered): the unfiltered
    rows searched as a batch of their own, padded by ``pad`` as an unfiltered batch is (the search path and CUDA
    graphs it would take without the filtered rows), the filtered ones through ``Searcher.search``'s per-query
    filters (each request's rows share one filter object: resolved once). (scores, doc_idx) [rows, k]."""
    dev = searcher.device
    plain = [r for r, f in enumerate(filters) if f is None]
    kept = [r for r, f in enumerate(filters) if f is not None]
    scores = torch.zeros(len(filters), k, dtype=torch.float32, device=dev)
    doc_idx = torch.full((len(filters), k), -1, dtype=torch.int64, device=dev)
    if plain:
        s, i = searcher.search(pad(queries[plain]), k=k, show_progress_bar=False)
        scores[plain], doc_idx[plain] = s[:len(plain)], i[:len(plain)]
    s, i = searcher.search(queries[kept], k=k, show_progress_bar=False, filter=[filters[r] for r in kept])
    scores[kept], doc_idx[kept] = s, i
    return scores, doc_idx


def row_filters(batch: Any) -> list[DocFilter | None] | None:
    """One filter per row of an engine ``Batch`` (None: unfiltered; one object per request: its resolved mask
    where ``SearchEngine.resolve_filter`` ran), or None when no request of the batch filters."""
    if all(r.filter is None for r in batch.requests):
        return None
    rows: list[DocFilter | None] = [None] * batch.n_rows
    for i in batch.order:
        r = batch.requests[i]
        flt = r.filter if r.mask is None or r.filter is None else DocFilter.mask(r.mask)
        rows[batch.first_row[i]:batch.first_row[i] + r.n_queries] = [flt] * r.n_queries
    return rows
