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


def _tied_search_output(rng, n_q: int, n_docs: int, k: int):
    """Searcher-like output with many ties: few distinct float32 scores, sorted descending, ties in
    ascending doc index, -1 padding; docnos in shuffled, mixed-length, non-ASCII order."""
    docnos = [f"{rng.choice(['a', 'Z', 'é', 'b1'])}{i}" for i in rng.permutation(n_docs)]
    levels = np.float32([3.5, 2.25, 2.2500002, 1.0, 0.5])  # 2.25 and its float32 neighbour: distinct scores
    scores = np.zeros((n_q, k), np.float32)
    doc_idx = np.full((n_q, k), -1, np.int64)
    for i in range(n_q):
        m = int(rng.integers(1, k + 1))
        docs = rng.choice(n_docs, size=m, replace=False)
        s = rng.choice(levels, size=m)
        order = np.lexsort((docs, -s))  # score descending, then doc index ascending (the Searcher's rule)
        scores[i, :m], doc_idx[i, :m] = s[order], docs[order]
    return docnos, scores, doc_idx


TIE_METRICS = ["RR@10", "RR@3", "RR(rel=2)@5", "RR", "nDCG@10", "nDCG@3", "nDCG", "R@5", "R(rel=2)@8", "P@3",
               "P(rel=2)@4", "AP", "AP(rel=2)", "AP@5", "Success@3"]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ties_equal_ir_measures_on_the_written_run(tmp_path, seed):
    from lsr import evaluate
    from lsr.data import runs

    rng = np.random.default_rng(seed)
    n_q, n_docs, k = 30, 40, 12
    docnos, scores, doc_idx = _tied_search_output(rng, n_q, n_docs, k)
    qids = [f"q{i}" for i in range(n_q)]
    qrels = {q: {docnos[d]: int(rng.integers(0, 3)) for d in rng.choice(n_docs, size=6, replace=False)}
             for q in qids[:-2]}
    path = tmp_path / "run.trec"
    runs.write_topk(path, qids, docnos, scores, doc_idx)
    ref = evaluate(path, qrels, TIE_METRICS)  # ir_measures on the file, as `lsr evaluate` does
    got = evaluate_topk(qids, doc_idx, docnos, qrels, TIE_METRICS, scores=scores)
    for m in TIE_METRICS:
        assert got[m] == pytest.approx(ref[m], abs=1e-12), m
    # the tie rule matters here: the array order alone gives other values
    plain = evaluate_topk(qids, doc_idx, docnos, qrels, TIE_METRICS)
    assert any(abs(plain[m] - ref[m]) > 1e-9 for m in TIE_METRICS)


def test_ties_on_unsorted_rows_and_the_two_docno_rules():
    # one query, three docs with equal scores, one relevant: trec_eval ranks docno descending (z9, m5, a1),
    # ir_measures' RR@k (MS MARCO script) ascending (a1, m5, z9); the row comes unsorted
    scores = np.float32([[1.0, 2.0, 1.0, 1.0]])
    doc_idx = np.array([[0, 3, 1, 2]])
    docnos = ["a1", "z9", "m5", "b"]
    qrels = {"q": {"a1": 1}}
    run = {"q": {"a1": 1.0, "z9": 1.0, "m5": 1.0, "b": 2.0}}
    metrics = ["RR@10", "RR", "nDCG@10", "P@2", "AP"]
    ref = ir_measures.calc_aggregate([ir_measures.parse_measure(m) for m in metrics], qrels, run)
    got = evaluate_topk(["q"], doc_idx, docnos, qrels, metrics, scores=scores)
    assert got == pytest.approx({m: float(ref[ir_measures.parse_measure(m)]) for m in metrics}, abs=1e-12)
    assert got["RR@10"] == 0.5 and got["RR"] == 0.25


def test_scores_must_be_finite_and_shaped_like_doc_idx():
    with pytest.raises(ValueError, match="finite"):
        evaluate_topk(["q"], np.array([[0, 1]]), ["a", "b"], {"q": {"a": 1}}, ["RR@10"],
                      scores=np.float32([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match=r"\[B, k\]"):
        evaluate_topk(["q"], np.array([[0, 1]]), ["a", "b"], {"q": {"a": 1}}, ["RR@10"], scores=np.zeros((1, 3)))
