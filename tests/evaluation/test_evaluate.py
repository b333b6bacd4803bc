from __future__ import annotations

import pytest

from lsr.data import runs
from lsr.evaluation.measures import DL_METRICS, MSMARCO_METRICS, evaluate, per_query

# Pyserini 2CR published nDCG@10 (data/msmarco-passage/SOURCE.md)
PUBLISHED = [
    ("run.dl19-passage.splade-pp-ed.top100.trec", "qrels.dl19-passage.txt", 0.7308),
    ("run.dl19-passage.bm25.top100.trec", "qrels.dl19-passage.txt", 0.5058),
    ("run.dl20-passage.splade-pp-ed.top100.trec", "qrels.dl20-passage.txt", 0.7197),
    ("run.dl20-passage.bm25.top100.trec", "qrels.dl20-passage.txt", 0.4796),
]


@pytest.mark.parametrize("run_name,qrels_name,expected", PUBLISHED)
def test_reproduces_published_ndcg(data_dir, run_name, qrels_name, expected):
    msm = data_dir / "msmarco-passage"
    result = evaluate(msm / "reference-runs" / run_name, msm / qrels_name, DL_METRICS)
    assert list(result) == list(DL_METRICS)  # keys exactly as passed, in order
    assert round(result["nDCG@10"], 4) == expected
    # graded-recall and MAP at rel=2 are stricter than their rel=1 versions on graded qrels
    loose = evaluate(msm / "reference-runs" / run_name, msm / qrels_name, ("R@1000", "AP"))
    assert result["R(rel=2)@1000"] != loose["R@1000"] and result["AP(rel=2)"] != loose["AP"]


def test_run_and_qrels_forms_agree(data_dir, tmp_path):
    msm = data_dir / "msmarco-passage"
    run_path = msm / "reference-runs/run.dl19-passage.splade-pp-ed.top100.trec"
    metrics = ("nDCG@10", "RR(rel=2)@10", "R(rel=2)@100")
    from_paths = evaluate(run_path, msm / "qrels.dl19-passage.txt", metrics)
    run = runs.read_trec(run_path)
    from_dataset = evaluate(run, "msmarco-passage/trec-dl-2019/judged", metrics)
    assert from_dataset == from_paths
    # an MS MARCO run (3 columns, no scores) of the same ranking evaluates the same
    runs.write_msmarco(run, tmp_path / "run.tsv.gz")
    assert evaluate(tmp_path / "run.tsv.gz", msm / "qrels.dl19-passage.txt", metrics) == pytest.approx(from_paths)


def test_beir_qrels_file_and_folder(data_dir):
    qrels_tsv = data_dir / "scifact/qrels/test.tsv"
    trec = data_dir / "scifact/qrels.beir-v1.0.0-scifact.test.txt"
    # a run that ranks exactly the relevant docs first scores nDCG@10 = 1 on every query
    from lsr.data.sources import read_beir_qrels

    qrels = read_beir_qrels(qrels_tsv)
    perfect = {q: {d: 1.0 / (i + 1) for i, d in enumerate(docs)} for q, docs in qrels.items()}
    for source in (qrels_tsv, trec, str(data_dir / "scifact"), "beir/scifact/test"):
        assert evaluate(perfect, source, ["nDCG@10"]) == {"nDCG@10": 1.0}


def test_hand_computed_values():
    qrels = {"1": {"a": 1, "b": 0}, "2": {"c": 1}, "3": {"d": 2, "e": 1}}
    run = {"1": {"b": 2.0, "a": 1.0}, "3": {"x": 3.0, "e": 2.0, "d": 1.0}, "unjudged": {"a": 1.0}}
    # q1: first relevant at rank 2; q2 judged but missing from the run -> 0; q3: rank 2 (rel=1) / rank 3 (rel=2)
    result = evaluate(run, qrels, ["RR@10", "RR(rel=2)@10", "R@2"])
    assert result["RR@10"] == pytest.approx((1 / 2 + 0 + 1 / 2) / 3)
    assert result["RR(rel=2)@10"] == pytest.approx((0 + 0 + 1 / 3) / 3)  # q1, q2: no rel>=2 doc -> 0
    assert result["R@2"] == pytest.approx((1 + 0 + 1 / 2) / 3)


def test_per_query_matches_aggregate(data_dir):
    msm = data_dir / "msmarco-passage"
    run_path = msm / "reference-runs/run.dl20-passage.bm25.top100.trec"
    pq = per_query(run_path, msm / "qrels.dl20-passage.txt", MSMARCO_METRICS)
    agg = evaluate(run_path, msm / "qrels.dl20-passage.txt", MSMARCO_METRICS)
    assert set(pq) == set(MSMARCO_METRICS)
    for metric, values in pq.items():
        assert len(values) == 54  # the judged DL20 queries
        assert sum(values.values()) / len(values) == pytest.approx(agg[metric])


def test_unknown_metric_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown metric 'MRRR@10'"):
        evaluate({"1": {"a": 1.0}}, {"1": {"a": 1}}, ["nDCG@10", "MRRR@10"])
    with pytest.raises(ValueError, match=r"unknown metric 'nDCG@ten'"):
        evaluate({"1": {"a": 1.0}}, {"1": {"a": 1}}, "nDCG@ten")


def test_empty_qrels_rejected(tmp_path):
    (tmp_path / "q.txt").write_text("")
    with pytest.raises(ValueError, match="no relevance judgements"):
        evaluate({"1": {"a": 1.0}}, tmp_path / "q.txt")


def test_pipeline_metrics_equal_evaluate_on_its_run_file_with_ties(tmp_path):
    # two identical documents tie; trec_eval ranks the larger docno (z9) first, so a1 sits at rank 2
    import json

    from lsr.config import config_from_dict
    from lsr.pipeline import run_pipeline

    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    docs = [("a1", "apple pie"), ("z9", "apple pie"), ("m3", "banana bread")]
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n"
                                                 for i, t in docs))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "apple"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\ta1\t1\n")
    metrics = ["RR@10", "RR", "nDCG@10", "P@1", "AP"]
    cfg = config_from_dict({"data": {"dataset": str(folder)}, "output": str(tmp_path / "out"), "device": "cpu",
                            "evaluation": {"metrics": metrics}})
    result = run_pipeline(cfg)
    on_file = evaluate(result["files"]["run_trec"], folder / "qrels" / "test.tsv", metrics)
    assert result["metrics"] == pytest.approx(on_file, abs=1e-12)
    assert on_file["nDCG@10"] == pytest.approx(0.6309, abs=1e-4)  # the red-team case: 1.0 before
