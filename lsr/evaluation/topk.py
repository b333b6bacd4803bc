"""Vectorised IR metrics computed straight from search results ([B, k] doc indices).

``ir_measures`` needs a qid -> docno -> score dict: for thousands of queries x 1,000 hits, building it and
evaluating takes longer than the search itself. Here the common measures (RR, nDCG, R,
P, AP with ``@cutoff`` and ``rel=``) are computed with numpy on the [B, k] arrays, with trec_eval's
definitions (what ir_measures reports). Other measures fall back to ir_measures.
tests/evaluation/test_topk_metrics.py checks equality with ir_measures.

Ties: evaluation tools ignore the rank column of a run file and re-sort each query by score, breaking
ties by docno. trec_eval (ir_measures' ``pytrec_eval`` provider: nDCG, AP, P, R, RR without cutoff)
puts the lexicographically *larger* docno first; ir_measures' ``msmarco`` provider (RR@k) the
*smaller*. Given the scores, :func:`evaluate_topk` applies the rule of the provider ir_measures picks
for each measure, so its values equal ir_measures on the run file lsr writes (float32 scores are
written with enough digits to read back exactly, so ties in the file are exactly the float32 ties).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lsr.evaluation.measures import note_missing_queries, parse_metrics
from lsr.storage.files import arrow_strings, to_numpy

__all__ = ["FAST_MEASURES", "evaluate_topk"]

FAST_MEASURES = {"RR": {"cutoff", "rel"}, "nDCG": {"cutoff"}, "R": {"cutoff", "rel"}, "P": {"cutoff", "rel"},
                 "AP": {"cutoff", "rel"}}


def _grades(query_ids: Sequence[str], doc_idx: np.ndarray, docnos: Sequence[str],
            qrels: Mapping[str, Mapping[str, int]]) -> np.ndarray:
    """int64 [B, k] judged grade of every retrieved document (0 when unjudged or padding)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n_docs = len(docnos)
    rows, names, grades = [], [], []
    for r, q in enumerate(query_ids):
        for d, g in qrels.get(q, {}).items():
            rows.append(r)
            names.append(d)
            grades.append(int(g))
    out = np.zeros(doc_idx.shape, dtype=np.int64)
    if not names:
        return out
    # docno -> index for the judged documents only (hash the few judged names, scan the docnos once)
    judged = pa.array(sorted(set(names)), type=pa.string())
    doc_arr = arrow_strings(docnos)
    hit = pc.index_in(doc_arr, value_set=judged)
    where = np.nonzero(~np.asarray(hit.is_null()))[0]
    idx_of = dict(zip(np.asarray(hit.drop_null()).tolist(), where.tolist()))
    name_pos = {n: i for i, n in enumerate(judged.to_pylist())}
    doc_of_name = np.array([idx_of.get(name_pos[n], -1) for n in names], dtype=np.int64)
    keep = doc_of_name >= 0
    keys = np.asarray(rows, dtype=np.int64)[keep] * (n_docs + 1) + doc_of_name[keep]
    vals = np.asarray(grades, dtype=np.int64)[keep]
    if not keys.size:  # no judged document is in the collection
        return out
    order = np.argsort(keys)
    keys, vals = keys[order], vals[order]
    run_keys = np.arange(doc_idx.shape[0], dtype=np.int64)[:, None] * (n_docs + 1) + doc_idx
    pos = np.clip(np.searchsorted(keys, run_keys), 0, len(keys) - 1)
    found = (keys[pos] == run_keys) & (doc_idx >= 0)
    out[found] = vals[pos[found]]
    return out


def _provider_name(measure: Any) -> str | None:
    """Name of the ir_measures provider that computes ``measure`` (the first available that supports it)."""
    import ir_measures

    for provider in getattr(ir_measures.DefaultPipeline, "providers", []):
        if provider.supports(measure) and provider.is_available():
            return provider.NAME
    return None


# provider -> docno order among tied scores: trec_eval sorts by (score desc, docno desc), MS MARCO's
# script by (score desc, docno asc)
_TIE_DOCNO_DESCENDING = {"pytrec_eval": True, "msmarco": False}


def _sorted_by_score(scores: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by score, descending (padding last); a no-op for Searcher output, which is sorted."""
    if not np.isfinite(scores[idx >= 0]).all():
        raise ValueError("scores must be finite (run files cannot hold NaN / inf)")
    key = np.where(idx >= 0, scores, -np.inf)
    if not (key[:, :-1] < key[:, 1:]).any():
        return scores, idx
    order = np.argsort(-key, axis=1, kind="stable")
    return np.take_along_axis(scores, order, 1), np.take_along_axis(idx, order, 1)


def _tie_permutations(scores: np.ndarray, idx: np.ndarray, docnos: Sequence[str]) -> dict[bool, np.ndarray] | None:
    """Flat permutations of [B, k] positions that reorder tied scores by docno, for docno descending
    (True) and ascending (False); None when no row has a tie. Only tied positions are sorted."""
    import pyarrow as pa
    import pyarrow.compute as pc

    valid = idx >= 0
    tie_next = valid[:, :-1] & valid[:, 1:] & (scores[:, :-1] == scores[:, 1:])
    if not tie_next.any():
        return None
    starts = np.ones(idx.shape, dtype=bool)  # a position starts a new score group unless it ties the one before
    starts[:, 1:] = ~tie_next
    group = np.cumsum(starts.ravel())
    in_tie = np.zeros(idx.shape, dtype=bool)
    in_tie[:, :-1] |= tie_next
    in_tie[:, 1:] |= tie_next
    pos = np.flatnonzero(in_tie)
    docs = idx.ravel()[pos]
    present = np.zeros(len(docnos), dtype=bool)  # unique docs by a mask: O(n), no sort
    present[docs] = True
    uniq = np.flatnonzero(present)
    names = arrow_strings(docnos).take(pa.array(uniq))
    rank = np.zeros(len(docnos), dtype=np.int64)
    rank[uniq[np.asarray(pc.array_sort_indices(names))]] = np.arange(len(uniq))  # byte order = code point order
    doc_rank, group_key = rank[docs], group[pos] * (len(uniq) + 1)
    perms = {}
    for descending in (True, False):
        perm = np.arange(idx.size)
        # one int64 key (group, docno rank): groups are contiguous, so sorting it sorts inside each group
        perm[pos] = pos[np.argsort(group_key + (len(uniq) - doc_rank if descending else doc_rank))]
        perms[descending] = perm
    return perms


def _measure(name: str, params: Mapping[str, Any], grades: np.ndarray, qrel_grades: list[np.ndarray]) -> np.ndarray:
    """Per-query values of one measure. grades: [B, k] judged grade of each retrieved document."""
    k_all = grades.shape[1]
    cutoff = int(params.get("cutoff", k_all))
    g = grades[:, :cutoff]
    rel = int(params.get("rel", 1))
    hits = g >= rel
    ranks = np.arange(1, g.shape[1] + 1)
    n_rel = np.array([(qg >= rel).sum() for qg in qrel_grades], dtype=np.float64)
    if name == "RR":
        first = np.where(hits.any(1), hits.argmax(1) + 1, 0)
        return np.where(first > 0, 1.0 / np.maximum(first, 1), 0.0)
    if name == "P":
        return hits.sum(1) / cutoff
    if name == "R":
        return np.divide(hits.sum(1), n_rel, out=np.zeros(len(n_rel)), where=n_rel > 0)
    if name == "AP":
        prec = np.cumsum(hits, 1) / ranks
        return np.divide((prec * hits).sum(1), n_rel, out=np.zeros(len(n_rel)), where=n_rel > 0)
    if name == "nDCG":
        disc = 1.0 / np.log2(ranks + 1.0)
        dcg = (np.clip(g, 0, None) * disc).sum(1)
        limit = params.get("cutoff")
        ideal = np.zeros(len(qrel_grades))
        for i, qg in enumerate(qrel_grades):
            best = np.sort(qg[qg > 0])[::-1][:limit].astype(np.float64)
            ideal[i] = (best / np.log2(np.arange(2, len(best) + 2))).sum()
        return np.divide(dcg, ideal, out=np.zeros(len(ideal)), where=ideal > 0)
    raise ValueError(name)


def _run_dict(qids: Sequence[str], idx: np.ndarray, docnos: Sequence[str], scores: np.ndarray | None
              ) -> dict[str, dict[str, float]]:
    """The run ir_measures reads: the given scores, or minus the rank when there are none."""
    values = -np.broadcast_to(np.arange(idx.shape[1], dtype=np.float64), idx.shape) if scores is None else scores
    return {q: {docnos[d]: float(v) for d, v in zip(row_d, row_v) if d >= 0}
            for q, row_d, row_v in zip(qids, idx.tolist(), values.tolist())}


def evaluate_topk(query_ids: Sequence[str], doc_idx: Any, docnos: Sequence[str],
                  qrels: Mapping[str, Mapping[str, int]],
                  metrics: Sequence[str] = ("RR@10", "nDCG@10", "R@1000"), *, scores: Any = None) -> dict[str, float]:
    """Mean of each metric over all queries of ``qrels``; a judged query without results counts 0
    (what ir_measures reports).

    Args:
        query_ids: B query ids, row order of ``doc_idx``.
        doc_idx: int [B, k] document indices in rank order, −1 padding at the end of a row.
        docnos: external id of every document index.
        qrels: qid -> {docno: grade}.
        metrics: ir-measures strings; keys of the result are these strings.
        scores: float [B, k] scores of ``doc_idx`` (as written to the run file). With them, tied
            scores are ordered by docno as the evaluation tools do (module docstring), so the values
            equal ir_measures on the run file; without them the array order is the rank order.
    """
    import ir_measures

    idx = to_numpy(doc_idx).astype(np.int64)
    n_ret = (idx >= 0).sum(1)
    keep = np.array([q in qrels for q in query_ids], dtype=bool) & (n_ret > 0)
    qids = [q for q, m in zip(query_ids, keep) if m]
    note_missing_queries(qrels, set(qids), "the search output")
    idx = idx[keep]
    score_arr = None
    if scores is not None:
        score_arr = to_numpy(scores).astype(np.float32)
        if score_arr.shape != keep.shape + idx.shape[1:]:
            raise ValueError(f"scores {score_arr.shape} and doc_idx {to_numpy(doc_idx).shape} must both be [B, k]")
        score_arr, idx = _sorted_by_score(score_arr[keep], idx)
    parsed = parse_metrics(metrics)
    tie_rule = {m: _TIE_DOCNO_DESCENDING.get(_provider_name(p)) for m, p in parsed.items()}
    fast = {m: p for m, p in parsed.items() if p.NAME in FAST_MEASURES and set(p.params) <= FAST_MEASURES[p.NAME]
            and (score_arr is None or tie_rule[m] is not None)}
    out: dict[str, float] = {}
    if fast and qids:
        grades = _grades(qids, idx, docnos, qrels)
        perms = _tie_permutations(score_arr, idx, docnos) if score_arr is not None else None
        qg = [np.fromiter(qrels[q].values(), dtype=np.int64) for q in qids]
        for m, p in fast.items():
            g = grades if perms is None else grades.ravel()[perms[tie_rule[m]]].reshape(grades.shape)
            out[m] = float(_measure(p.NAME, p.params, g, qg).sum() / len(qrels))
    elif fast:
        out.update({m: 0.0 for m in fast})
    slow = [m for m in metrics if m not in fast]
    if slow:
        agg = ir_measures.calc_aggregate([parsed[m] for m in slow], qrels, _run_dict(qids, idx, docnos, score_arr))
        out.update({m: float(agg[parsed[m]]) for m in slow})
    return {m: out[m] for m in metrics}
