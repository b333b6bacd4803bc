"""The command line end to end on the shipped SciFact data (BM25, CPU)."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from lsr.cli import main
from tests.conftest import DATA, REPO


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    out = tmp_path_factory.mktemp("qs")
    rc = main(["run", str(REPO / "configs" / "scifact-bm25.yaml"), "--set", f"output={out}",
               "--json", str(out / "m.json"), "--check"])
    return rc, out


def test_scifact_bm25_reaches_pyserini_bm25(quickstart, capsys):
    rc, out = quickstart
    assert rc == 0
    metrics = json.loads((out / "m.json").read_text())
    assert set(metrics) == {"RR@10", "nDCG@10", "R@1000"}
    assert metrics["nDCG@10"] >= 0.66  # Pyserini BM25 flat: 0.6789
    lines = (out / "run.trec").read_text().splitlines()
    assert len({ln.split()[0] for ln in lines}) == 300
    assert all(len(ln.split()) == 6 for ln in lines[:50])


def test_evaluate_command_matches_the_pipeline(quickstart, capsys):
    _, out = quickstart
    capsys.readouterr()
    assert main(["evaluate", "--run", str(out / "run.trec"), "--qrels", str(DATA / "scifact"),
                 "--metrics", "nDCG@10", "R@1000"]) == 0
    printed = dict(line.split("\t") for line in capsys.readouterr().out.strip().splitlines())
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert float(printed["nDCG@10"]) == pytest.approx(metrics["nDCG@10"], abs=1e-4)
    # the MS MARCO run ranks the same documents
    assert main(["evaluate", "--run", str(out / "run.msmarco.tsv"), "--qrels", str(DATA / "scifact"),
                 "--metrics", "nDCG@10"]) == 0
    assert float(capsys.readouterr().out.split("\t")[1]) == pytest.approx(metrics["nDCG@10"], abs=1e-4)


def test_encode_index_search_commands(tmp_path, capsys):
    vec, idx = tmp_path / "vec", tmp_path / "idx"
    assert main(["encode", "--dataset", str(DATA / "scifact"), "--out", str(vec), "--device", "cpu"]) == 0
    assert main(["index", "--vectors", str(vec), "--out", str(idx), "--device", "cpu"]) == 0
    assert main(["search", "--index", str(idx), "--queries", str(DATA / "scifact"), "--model", str(vec / "encoder"),
                 "--out", str(tmp_path / "run.trec"), "--k", "100", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--run", str(tmp_path / "run.trec"), "--qrels", str(DATA / "scifact"),
                 "--metrics", "nDCG@10"]) == 0
    assert float(capsys.readouterr().out.split("\t")[1]) >= 0.66


def test_bad_input_gives_one_line_error(tmp_path, capsys):
    # missing inputs are runtime errors (exit 1), reported in one line
    assert main(["index", "--vectors", str(tmp_path / "none"), "--out", str(tmp_path / "i"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "error" in err and err.count("\n") == 1
    assert main(["evaluate", "--run", str(tmp_path / "missing.trec"), "--qrels", str(DATA / "scifact")]) == 1


@pytest.mark.slow
def test_run_with_pre_encoded_anserini_queries_and_pyserini_documents(tmp_path):
    """The shipped SPLADE++ ED dev-small queries (Anserini TSV) against the 20 seismic-toy passages (JSON vectors)."""
    out = tmp_path / "pre"
    docs_json = DATA / "splade-samples" / "seismic-toy" / "documents.jsonl"
    assert main(["run", str(REPO / "configs" / "msmarco-passage-dev-anserini-queries.yaml"), "--set", f"output={out}",
                 "--set", "device=cpu", "--set", f"inputs.doc_vectors={docs_json}", "--set", "search.k=5"]) == 0
    run: dict[str, list[tuple[str, float]]] = {}
    for line in (out / "run.trec").read_text().splitlines():
        qid, _, docno, _, score, _ = line.split()
        run.setdefault(qid, []).append((docno, float(score)))
    # scores are the inner products of the stored weights: recompute two queries from the float JSON documents
    # and the Anserini query counts (weight = count / 1000)
    docs = {str(d["id"]): d["vector"] for d in map(json.loads, docs_json.read_text().splitlines())}
    qfile = DATA / "msmarco-passage" / "splade-encoded-queries" / "topics.msmarco-passage.dev-subset.splade-pp-ed.tsv.gz"
    with gzip.open(qfile, "rt", encoding="utf-8") as f:
        queries = {qid: Counter(toks.split()) for qid, toks in (ln.rstrip("\n").split("\t") for ln in f)}
    doc_terms = {t for vec in docs.values() for t, w in vec.items() if w > 0}
    assert set(run) == {q for q, c in queries.items() if doc_terms & set(c)}  # queries with any match
    for qid in ("2", "1048585"):
        expect = sorted(((sum(c / 1000 * vec.get(t, 0.0) for t, c in queries[qid].items()), d)
                         for d, vec in docs.items()), key=lambda x: (-x[0], int(x[1])))
        expect = [(d, s) for s, d in expect if s > 0][:5]
        assert [d for d, _ in run[qid]] == [d for d, _ in expect]
        assert [s for _, s in run[qid]] == pytest.approx([s for _, s in expect], rel=1e-5)
