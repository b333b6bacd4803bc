"""The vectorised top-k metrics agree with ir_measures (trec_eval definitions)."""

from __future__ import annotations

import ir_measures
import numpy as np
import pytest

from lsr.evaluation.topk import evaluate_topk

METRICS = ["RR@10", "nDCG@10", "nDCG@5", "nDCG", "R@20", "R(rel=2)@20", "P@5", "P(rel=2)@3", "AP",
           "AP(rel=2)", "AP@7", "RR(rel=2)", "Judged@10"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_ir_measures(seed):
    rng = np.random.default_rng(seed)
    n_docs, n_q, k = 60, 25, 20
    docnos = [f"doc{i}" for i in rng.permutation(n_docs)]
    qids = [f"q{i}" for i in range(n_q)]
    qrels = {}
    for q in qids[:-3]:  # the last queries have no qrels: they must be ignored
        judged = rng.choice(n_docs + 10, size=int(rng.integers(1, 15)), replace=False)
        # some judged documents are not in the collection ("missing" names)
        qrels[q] = {(docnos[d] if d < n_docs else f"gone{d}"): int(rng.integers(0, 4)) for d in judged}
    qrels["q0"] = {docnos[0]: 0}  # judged, nothing relevant
    doc_idx = np.full((n_q, k), -1, dtype=np.int64)
    for i in range(n_q):
        m = int(rng.integers(0, k + 1)) if i % 5 else k
        doc_idx[i, :m] = rng.choice(n_docs, size=m, replace=False)
    run = {q: {docnos[d]: float(k - r) for r, d in enumerate(row) if d >= 0} for q, row in zip(qids, doc_idx)}
    run = {q: v for q, v in run.items() if v}
    ref = ir_measures.calc_aggregate([ir_measures.parse_measure(m) for m in METRICS], qrels, run)
    got = evaluate_topk(qids, doc_idx, docnos, qrels, METRICS)
    assert list(got) == METRICS
    for m in METRICS:
        assert got[m] == pytest.approx(float(ref[ir_measures.parse_measure(m)]), abs=1e-9), m


def test_no_judged_document_in_the_collection():
    got = evaluate_topk(["q1", "q2"], np.array([[0, 1], [1, -1]]), ["a", "b"], {"q1": {"zz": 1}, "q2": {"yy": 2}},
                        ["RR@10", "nDCG@10", "R@1000"])
    assert got == {"RR@10": 0.0, "nDCG@10": 0.0, "R@1000": 0.0}
