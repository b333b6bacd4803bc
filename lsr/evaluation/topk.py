"""Vectorised IR metrics computed straight from search results ([B, k] doc indices).

``ir_measures`` needs a qid -> docno -> score dict: for 6,980 queries x 1,000 hits, building it and
evaluating takes ~7 s on a CPU, longer than the search itself. Here the common measures (RR, nDCG, R,
P, AP with ``@cutoff`` and ``rel=``) are computed with numpy on the [B, k] arrays, with trec_eval's
definitions (what ir_measures reports); the run order is the rank order. Other measures fall back to
ir_measures. tests/test_topk_metrics.py checks equality with ir_measures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lsr.evaluation.measures import parse_metrics
from lsr.io import arrow_strings, to_numpy

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


def evaluate_topk(query_ids: Sequence[str], doc_idx: Any, docnos: Sequence[str],
                  qrels: Mapping[str, Mapping[str, int]],
                  metrics: Sequence[str] = ("RR@10", "nDCG@10", "R@1000")) -> dict[str, float]:
    """Mean of each metric over all queries of ``qrels``; a judged query without results counts 0
    (what ir_measures reports).

    Args:
        query_ids: B query ids, row order of ``doc_idx``.
        doc_idx: int [B, k] document indices in rank order, −1 padding at the end of a row.
        docnos: external id of every document index.
        qrels: qid -> {docno: grade}.
        metrics: ir-measures strings; keys of the result are these strings.
    """
    import ir_measures

    idx = to_numpy(doc_idx).astype(np.int64)
    n_ret = (idx >= 0).sum(1)
    keep = np.array([q in qrels for q in query_ids], dtype=bool) & (n_ret > 0)
    qids = [q for q, m in zip(query_ids, keep) if m]
    idx, n_ret = idx[keep], n_ret[keep]
    parsed = parse_metrics(metrics)
    fast = {m: p for m, p in parsed.items() if p.NAME in FAST_MEASURES and set(p.params) <= FAST_MEASURES[p.NAME]}
    out: dict[str, float] = {}
    if fast and qids:
        grades = _grades(qids, idx, docnos, qrels)
        qg = [np.fromiter(qrels[q].values(), dtype=np.int64) for q in qids]
        for m, p in fast.items():
            out[m] = float(_measure(p.NAME, p.params, grades, qg).sum() / len(qrels))
    elif fast:
        out.update({m: 0.0 for m in fast})
    slow = [m for m in metrics if m not in fast]
    if slow:
        run = {q: {docnos[d]: float(-r) for r, d in enumerate(row[row >= 0].tolist())} for q, row in zip(qids, idx)}
        agg = ir_measures.calc_aggregate([parsed[m] for m in slow], qrels, run)
        out.update({m: float(agg[parsed[m]]) for m in slow})
    return {m: out[m] for m in metrics}
