"""Inputs that used to give silently wrong results: BOMs and CRLF, ids run files cannot hold, narrowing
casts, non-finite scores and weights that overflow a dot product."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from lsr import evaluate
from lsr.data import runs
from lsr.data import sources as data
from lsr.interop.anserini import load_vocab, read_anserini_documents, read_anserini_queries
from lsr.sparse import SparseVectors, weight_limit
from lsr.storage.files import count_lines
from lsr.utils.ids import check_id, first_bad_arrow_id, first_bad_id, id_problem

BOM = "\ufeff"
BAD_IDS = ["", "a b", "a\tb", "a\u00a0b", "a\u2028b", "a\u2029b", "a\x00b", "a\x1fb", "a\x85b", "a\u200bb",
           "a\ufeffb", "a\u3000b"]
GOOD_IDS = ["a", "doc-1_x", "é漢字", "MARCO_0", "x/y:z", "\U0001f600"]


def _write(path, text: str, *, crlf: bool = False):
    text = text.replace("\n", "\r\n") if crlf else text
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


# ---------------------------------------------------------------------------------------- BOM / CRLF
@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_bom_and_crlf_do_not_reach_the_first_id(tmp_path, crlf, suffix):
    def w(name, text):
        return _write(tmp_path / f"{name}{suffix}", BOM + text, crlf=crlf)

    assert data.read_topics_tsv(w("q.tsv", "q1\tapple pie\nq2\tbanana\n")) == {"q1": "apple pie", "q2": "banana"}
    assert data.read_beir_queries(w("q.jsonl", '{"_id": "q1", "text": "apple"}\n')) == {"q1": "apple"}
    assert data.read_qrels(w("qrels.txt", "q1 0 d1 1\nq1 0 d2 0\n")) == {"q1": {"d1": 1, "d2": 0}}
    assert data.read_qrels(w("qrels.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t2\n")) == {"q1": {"d1": 2}}
    trec = w("run.trec", "q1 Q0 d1 1 2.5 t\nq1 Q0 d2 2 1.5 t\n")
    assert runs.read_run(trec) == {"q1": {"d1": 2.5, "d2": 1.5}}
    assert runs.read_run(w("run.tsv", "q1\td1\t1\n")) == {"q1": {"d1": 1.0}}
    assert evaluate(trec, tmp_path / f"qrels.txt{suffix}", ["RR@10"]) == {"RR@10": 1.0}
    assert load_vocab(w("vocab.txt", "[PAD]\napple\npie\n")) == {"[PAD]": 0, "apple": 1, "pie": 2}
    queries = read_anserini_queries(w("aq.tsv", "q1\tapple apple pie\n"), ["[PAD]", "apple", "pie"], scale=None)
    assert queries.ids == ["q1"] and queries.to_dicts() == [{1: 2.0, 2: 1.0}]
    docs = read_anserini_documents(w("ad.jsonl", '{"id": "d1", "contents": "", "vector": {"pie": 3}}\n'),
                                   ["[PAD]", "apple", "pie"])
    assert docs.ids == ["d1"]


@pytest.mark.parametrize("crlf", [False, True])
def test_bom_in_dataset_folders(tmp_path, crlf):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    _write(beir / "corpus.jsonl", BOM + '{"_id": "d1", "title": "", "text": "apple"}\n{"_id": "d2", "text": "x"}\n',
           crlf=crlf)
    _write(beir / "queries.jsonl", BOM + '{"_id": "q1", "text": "apple"}\n', crlf=crlf)
    _write(beir / "qrels" / "test.tsv", BOM + "query-id\tcorpus-id\tscore\nq1\td1\t1\n", crlf=crlf)
    ds = data.load_dataset(beir)
    assert list(ds.docs_iter()) == [("d1", "apple"), ("d2", "x")] and ds.n_docs == 2
    assert ds.queries == {"q1": "apple"} and ds.qrels == {"q1": {"d1": 1}}
    tsv = tmp_path / "tsv"
    tsv.mkdir()
    _write(tsv / "collection.tsv", BOM + "d1\tapple\n", crlf=crlf)
    _write(tsv / "queries.tsv", BOM + "q1\tapple\n", crlf=crlf)
    _write(tsv / "qrels.tsv", BOM + "q1 0 d1 1\n", crlf=crlf)
    ds = data.load_dataset(tsv)
    assert list(ds.docs_iter()) == [("d1", "apple")] and ds.queries == {"q1": "apple"} and ds.qrels == {"q1": {"d1": 1}}


def test_count_lines_ignores_a_bom_only_first_line(tmp_path):
    assert count_lines(_write(tmp_path / "a.tsv", BOM + "\nd1\tx\n\n")) == 1
    assert count_lines(_write(tmp_path / "b.tsv", BOM + "d1\tx\nd2\ty\n")) == 2


# ---------------------------------------------------------------------------------------- ids
@pytest.mark.parametrize("bad", BAD_IDS)
def test_id_rule(bad):
    assert id_problem(bad) is not None
    with pytest.raises(ValueError, match="where: query id .* non-empty and printable"):
        check_id(bad, "query id", "where")
    ids = [*GOOD_IDS, bad, "z"]
    assert first_bad_id(ids) == len(GOOD_IDS)
    import pyarrow as pa

    assert first_bad_arrow_id(pa.array(ids)) == len(GOOD_IDS)
    assert first_bad_arrow_id(pa.array(ids)[len(GOOD_IDS) + 1:]) is None


def test_good_ids_pass_and_round_trip_through_both_writers(tmp_path):
    import pyarrow as pa

    assert all(id_problem(g) is None for g in GOOD_IDS)
    assert first_bad_id(GOOD_IDS) is None and first_bad_arrow_id(pa.array(GOOD_IDS)) is None
    run = {q: {d: float(len(GOOD_IDS) - i) for i, d in enumerate(GOOD_IDS)} for q in GOOD_IDS}
    runs.write_trec(run, tmp_path / "a.trec")
    assert runs.read_trec(tmp_path / "a.trec") == run
    scores = np.tile(np.arange(len(GOOD_IDS), 0, -1, dtype=np.float32), (len(GOOD_IDS), 1))
    doc_idx = np.tile(np.arange(len(GOOD_IDS)), (len(GOOD_IDS), 1))
    runs.write_topk({"trec": tmp_path / "b.trec", "msmarco": tmp_path / "b.tsv"}, GOOD_IDS, GOOD_IDS, scores, doc_idx)
    assert runs.read_trec(tmp_path / "b.trec") == run
    assert list(runs.read_msmarco(tmp_path / "b.tsv")) == GOOD_IDS


@pytest.mark.parametrize("bad", BAD_IDS)
def test_run_writers_refuse_what_readers_refuse(tmp_path, bad):
    with pytest.raises(ValueError, match="query id"):
        runs.write_trec({bad: {"d": 1.0}}, tmp_path / "r.trec")
    with pytest.raises(ValueError, match="docno"):
        runs.write_msmarco({"q": {bad: 1.0}}, tmp_path / "r.tsv")
    with pytest.raises(ValueError, match=r"docno \(doc index 1\)"):
        runs.write_topk(tmp_path / "r2.trec", ["q"], ["d", bad], np.float32([[2.0, 1.0]]), np.array([[0, 1]]))
    with pytest.raises(ValueError, match=r"query id \(row 1\)"):
        runs.write_topk(tmp_path / "r2.trec", ["q", bad], ["d"], np.float32([[1.0], [1.0]]), np.array([[0], [0]]))
    assert not list(tmp_path.iterdir())  # nothing half-written
    if bad and not any(c.isspace() for c in bad):  # a whitespace id would just split into more columns
        path = _write(tmp_path / "x.trec", f"q Q0 d 1 2.0 t\nq Q0 {bad} 2 1.0 t\n")
        with pytest.raises(ValueError, match=r"x\.trec:2: docno"):
            runs.read_trec(path)


@pytest.mark.parametrize("bad", ["", "a b", "a\u00a0b", "a\u2028b", "a\x01b", "a\u200bb"])
def test_dataset_readers_refuse_bad_ids_naming_file_and_line(tmp_path, bad):
    queries = _write(tmp_path / "queries.jsonl", '{"_id": "q1", "text": "x"}\n' + json.dumps({"_id": bad}) + "\n")
    with pytest.raises(ValueError, match=r"queries\.jsonl:2: query id"):
        data.read_beir_queries(queries)
    if "\t" not in bad:
        topics = _write(tmp_path / "topics.tsv", f"q1\tx\n{bad}\ty\n")
        with pytest.raises(ValueError, match=r"topics\.tsv:2: query id"):
            data.read_topics_tsv(topics)
    folder = tmp_path / "beir"
    folder.mkdir()
    _write(folder / "corpus.jsonl", '{"_id": "d1", "text": "x"}\n' + json.dumps({"_id": bad, "text": "y"}) + "\n")
    _write(folder / "queries.jsonl", '{"_id": "q1", "text": "x"}\n')
    with pytest.raises(ValueError, match=r"corpus\.jsonl:2: doc id"):
        list(data.load_dataset(folder).docs_iter())
    if bad and not any(c.isspace() for c in bad):
        qrels = _write(tmp_path / "qrels.txt", f"q1 0 d1 1\nq1 0 {bad} 1\n")
        with pytest.raises(ValueError, match=r"qrels\.txt:2: doc id"):
            data.read_trec_qrels(qrels)


def test_sparse_vectors_and_anserini_readers_refuse_bad_ids(tmp_path):
    with pytest.raises(ValueError, match=r"row 1: id 'b\\xa0c'"):
        SparseVectors([0, 1, 2], [0, 1], [1.0, 1.0], ids=["a", "b\u00a0c"])
    path = _write(tmp_path / "d.jsonl", '{"id": "a\\u2028b", "vector": {"x": 1}}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:1: id"):
        read_anserini_documents(path, ["x"])


# ---------------------------------------------------------------------------------------- narrowing casts
@pytest.mark.parametrize("indices", [np.array([2**32 + 1]), torch.tensor([2**32 + 1]), np.array([-(2**32) + 1]),
                                     np.array([2**64 - 1], dtype=np.uint64)])
def test_term_ids_beyond_int32_raise_instead_of_wrapping(indices):
    with pytest.raises(ValueError, match="indices: value .* does not fit int32"):
        SparseVectors(np.array([0, 1]), indices, np.array([1.0]), vocab_size=4)


def test_other_narrowing_and_range_checks():
    with pytest.raises(ValueError, match="indptr: value .* does not fit int64"):
        SparseVectors(np.array([0, 2**64 - 1], dtype=np.uint64), np.array([1]), np.array([1.0]), vocab_size=4)
    with pytest.raises(ValueError, match="values: value 1e\\+39 does not fit float32"):
        SparseVectors(np.array([0, 1]), np.array([1]), np.array([1e39]), vocab_size=4)
    with pytest.raises(ValueError, match="vocab_size .* int32"):
        SparseVectors(np.array([0, 1]), np.array([1]), np.array([1.0]), vocab_size=2**31 + 1)
    with pytest.raises(ValueError, match="row indices"):
        SparseVectors.from_coo([0, 5], [1, 1], [1.0, 1.0], n_rows=2, vocab_size=4)
    with pytest.raises(ValueError, match="row indices"):
        SparseVectors.from_coo([-1], [1], [1.0], n_rows=2, vocab_size=4)
    v = SparseVectors(np.array([0, 2], dtype=np.uint64), np.array([1, 3], dtype=np.int64), np.array([1.0, 2.0]))
    assert v.indices.tolist() == [1, 3] and v.values.dtype == torch.float32


# ---------------------------------------------------------------------------------------- non-finite scores
@pytest.mark.parametrize("score", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_run_readers_refuse_non_finite_scores(tmp_path, score):
    path = _write(tmp_path / "r.trec", f"q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 {score} t\n")
    with pytest.raises(ValueError, match=r"r\.trec:2: score .* not finite"):
        runs.read_trec(path)
    with pytest.raises(ValueError, match="not finite"):
        evaluate(path, {"q1": {"d1": 1}}, ["RR@10"])


# ---------------------------------------------------------------------------------------- runs cut short
def test_a_run_cut_inside_its_last_line_is_refused(tmp_path):
    full = "".join(f"q{q} Q0 d{d} {d + 1} {9.5 - d} my-run\n" for q in (1, 2) for d in range(3))
    cut = _write(tmp_path / "cut.trec", full[:-4])   # "... my-" : six columns, the tag cut short
    with pytest.raises(ValueError, match=r"cut\.trec:6: the last line's run tag 'my-' is the start of 'my-run'"):
        runs.read_trec(cut)
    other = _write(tmp_path / "other.trec", full + "q3 Q0 d0 1 1.0 other\n")   # a new tag, not a prefix: fine
    assert runs.read_trec(other)["q3"] == {"d0": 1.0}
    lines = "".join(f"q1\td{d}\t{d + 1}\n" for d in range(12))
    cut = _write(tmp_path / "cut.tsv", lines[:-2])     # rank 12 -> 1: query q1 has rank 1 twice
    with pytest.raises(ValueError, match=r"cut\.tsv:12: query 'q1' has rank 1 again \(first on line 1\)"):
        runs.read_msmarco(cut)
    assert list(runs.read_msmarco(_write(tmp_path / "ok.tsv", lines))["q1"]) == [f"d{d}" for d in range(12)]


@pytest.mark.parametrize("rank", ["0", "-1", "2.5", "x", "67108864"])
def test_an_msmarco_rank_outside_the_integers_it_orders_is_refused(tmp_path, rank):
    path = _write(tmp_path / "run.tsv", f"q1\td1\t1\nq1\td2\t{rank}\n")
    with pytest.raises(ValueError, match=rf"run\.tsv:2: rank '{rank}' is not an integer in \[1, 67108864\)"):
        runs.read_msmarco(path)


def test_judged_queries_missing_from_a_run_are_named_in_a_warning(tmp_path, caplog):
    from lsr.evaluation.topk import evaluate_topk

    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 1}}
    path = _write(tmp_path / "r.trec", "q1 Q0 d1 1 2.0 t\n")   # cut at a line end: only the count tells
    with caplog.at_level("WARNING", logger="lsr.evaluation"):
        assert evaluate(path, qrels, ["RR@10"]) == {"RR@10": pytest.approx(1 / 3)}
        assert evaluate_topk(["q1", "q2"], np.array([[0], [-1]]), ["d1"], qrels, ["RR@10"]) == \
            {"RR@10": pytest.approx(1 / 3)}
    assert [r.getMessage() for r in caplog.records] == [
        "r.trec has no results for 2 of the 3 judged queries (e.g. 'q2'); they count 0, as with trec_eval -c"
        .replace("r.trec", str(path)),
        "the search output has no results for 2 of the 3 judged queries (e.g. 'q2'); they count 0, as with "
        "trec_eval -c"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="lsr.evaluation"):
        evaluate({"q1": {"d1": 1.0}, "q2": {"d1": 1.0}, "q3": {"d3": 1.0}}, qrels, ["RR@10"])
    assert not caplog.records


def test_run_writers_name_the_query_of_a_non_finite_score(tmp_path):
    scores = np.float32([[2.0, 1.0], [np.inf, 1.0]])
    with pytest.raises(ValueError, match="query 'q2' has score inf at rank 1"):
        runs.write_topk(tmp_path / "r.trec", ["q1", "q2"], ["a", "b"], scores, np.array([[0, 1], [1, 0]]))
    with pytest.raises(ValueError, match="query 'q2', doc 'b' has score nan"):
        runs.write_trec({"q1": {"a": 1.0}, "q2": {"b": float("nan")}}, tmp_path / "r.trec")
    assert not (tmp_path / "r.trec").exists()
    # padding may hold anything: it is never written
    runs.write_topk(tmp_path / "ok.trec", ["q1"], ["a"], np.float32([[1.0, np.nan]]), np.array([[0, -1]]))
    assert runs.read_trec(tmp_path / "ok.trec") == {"q1": {"a": 1.0}}


def test_weights_that_could_overflow_a_dot_product_are_refused_and_the_limit_is_safe():
    with pytest.raises(ValueError, match="could overflow float32"):
        SparseVectors(np.array([0, 1]), np.array([1]), np.array([1e38]), vocab_size=4)
    with pytest.raises(ValueError, match="could overflow float32"):
        SparseVectors.from_dicts([{"a": 1e30}], vocab={"a": 0, "b": 1})
    # at the limit, the largest possible dot product (every term, both sides) is still finite
    from lsr.index.inverted import InvertedIndex
    from lsr.search.searcher import Searcher

    vocab = 5
    w = np.float32(weight_limit(vocab))
    full = SparseVectors(np.array([0, vocab]), np.arange(vocab), np.full(vocab, w), ids=["d"], vocab_size=vocab)
    scores, idx = Searcher(InvertedIndex.build(full, device="cpu"), backend="torch").search(full, k=1)
    assert idx.tolist() == [[0]] and bool(torch.isfinite(scores).all()) and float(scores[0, 0]) > 1e38
    with pytest.raises(ValueError, match="could overflow"):
        SparseVectors(np.array([0, 1]), np.array([0]), np.array([w * 1.001]), vocab_size=vocab)
