from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from lsr.data import runs


def _random_run(rng: np.random.Generator, n_q: int = 5, n_d: int = 30) -> runs.Run:
    out: runs.Run = {}
    for q in range(n_q):
        scores = np.sort(rng.standard_normal(n_d).astype(np.float32) * 10)[::-1]
        docs = rng.choice(10_000, size=n_d, replace=False)
        out[f"q{q}"] = {f"D{d}": float(s) for d, s in zip(docs, scores)}
    return out


def test_from_topk_skips_padding_and_keeps_order():
    docnos = [f"doc{i}" for i in range(6)]
    scores = torch.tensor([[3.5, 2.0, 0.5], [1.0, 0.0, 0.0]])
    doc_idx = torch.tensor([[4, 0, 5], [2, -1, -1]])
    run = runs.from_topk(["a", "b"], docnos, scores, doc_idx)
    assert list(run) == ["a", "b"]
    assert list(run["a"].items()) == [("doc4", 3.5), ("doc0", 2.0), ("doc5", 0.5)]
    assert run["b"] == {"doc2": 1.0}
    # numpy input gives the same run
    assert runs.from_topk(["a", "b"], docnos, scores.numpy(), doc_idx.numpy()) == run


def test_from_topk_checks_shapes():
    with pytest.raises(ValueError, match=r"\[B, k\]"):
        runs.from_topk(["a"], ["d"], np.zeros((1, 2)), np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="qids"):
        runs.from_topk(["a", "b"], ["d"], np.zeros((1, 1)), np.zeros((1, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="out of range"):
        runs.from_topk(["a"], ["d"], np.ones((1, 1)), np.full((1, 1), 3, dtype=np.int64))


@pytest.mark.parametrize("suffix", [".trec", ".trec.gz"])
def test_trec_round_trip_is_exact(tmp_path, suffix):
    run = _random_run(np.random.default_rng(0))
    path = tmp_path / f"run{suffix}"
    runs.write_trec(run, path, tag="mytag")
    if suffix.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
        with gzip.open(path, "rt") as f:
            lines = f.read().splitlines()
    else:
        lines = path.read_text().splitlines()
    assert len(lines) == sum(len(d) for d in run.values())
    first = lines[0].split()
    assert first[:2] == ["q0", "Q0"] and first[3] == "1" and first[5] == "mytag"
    back = runs.read_trec(path)
    assert back == run
    assert all(list(back[q]) == list(run[q]) for q in run)  # same ranking order


def test_trec_keeps_six_significant_digits(tmp_path):
    # values that a %.5g / %.4f writer would merge or zero out
    run = {"q": {"a": 1.2345678, "b": 1.2345677, "c": 123456.78, "d": 1.0e-7}}
    runs.write_trec(run, tmp_path / "r.trec")
    assert runs.read_trec(tmp_path / "r.trec") == run
    # float32 search scores come back as the same float32 values
    scores = np.array([[1 / 3, 1 / 7, 2e-8]], dtype=np.float32)
    topk = runs.from_topk(["q"], ["x", "y", "z"], scores, np.array([[0, 1, 2]]))
    runs.write_trec(topk, tmp_path / "f.trec")
    back = runs.read_trec(tmp_path / "f.trec")["q"]
    assert np.array_equal(np.array(list(back.values()), dtype=np.float32), scores[0])


def test_trec_sorts_by_score_and_keeps_tie_order(tmp_path):
    run = {"q": {"low": 0.5, "tie_first": 2.0, "tie_second": 2.0, "top": 9.0}}
    runs.write_trec(run, tmp_path / "r.trec")
    lines = [line.split() for line in (tmp_path / "r.trec").read_text().splitlines()]
    assert [p[2] for p in lines] == ["top", "tie_first", "tie_second", "low"]
    assert [p[3] for p in lines] == ["1", "2", "3", "4"]
    assert list(runs.read_trec(tmp_path / "r.trec")["q"]) == ["top", "tie_first", "tie_second", "low"]


@pytest.mark.parametrize("suffix", [".tsv", ".tsv.gz"])
def test_msmarco_round_trip_preserves_ranking(tmp_path, suffix):
    run = _random_run(np.random.default_rng(1))
    path = tmp_path / f"run{suffix}"
    runs.write_msmarco(run, path)
    back = runs.read_msmarco(path)
    assert set(back) == set(run)
    for q in run:
        assert list(back[q]) == list(run[q])
        assert [back[q][d] for d in back[q]] == [1.0 / r for r in range(1, len(run[q]) + 1)]
    assert runs.detect_run_format(path) == "msmarco"
    assert runs.read_run(path) == back


@pytest.mark.parametrize("reader, text, message", [
    ("read_trec", "1 Q0 d1 1 2.0 x\n1 Q0 d2 2 1.0 x\n1 Q0 d1 3 0.5 x\n", r"bad.run:3: duplicate .*'d1'.*line 1"),
    ("read_msmarco", "1\td1\t1\n1\td1\t2\n", "duplicate"),
    ("read_trec", "1 Q0 d1 1 2.0\n", "expected 6 columns"),
    ("read_trec", "1 Q0 d1 1 abc x\n", "not a number"),
], ids=["trec-duplicate", "msmarco-duplicate", "trec-columns", "trec-score"])
def test_read_rejects_bad_lines(tmp_path, reader, text, message):
    path = tmp_path / "bad.run"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        getattr(runs, reader)(path)


def test_write_is_atomic_on_failure(tmp_path):
    path = tmp_path / "r.trec"
    runs.write_trec({"q": {"a": 1.0}}, path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="finite"):
        runs.write_trec({"q": {"a": 1.0, "b": float("nan")}}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.trec"]  # no temp file left behind
    with pytest.raises(ValueError, match="whitespace"):
        runs.write_trec({"q 1": {"a": 1.0}}, tmp_path / "x.trec")


def test_reads_a_real_anserini_run(data_dir):
    path = data_dir / "msmarco-passage/reference-runs/run.dl19-passage.bm25.top100.trec"
    run = runs.read_run(path)
    first = path.read_text().splitlines()[0].split()
    assert len(run) == 43 and all(len(d) == 100 for d in run.values())
    assert next(iter(run[first[0]].items())) == (first[2], float(first[4]))
    for docs in run.values():
        scores = list(docs.values())
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("fmt, suffix", [("trec", ".trec"), ("msmarco", ".tsv"), ("trec", ".trec.gz")])
def test_write_topk_equals_the_dict_writer(tmp_path, fmt, suffix):
    rng = np.random.default_rng(11)
    B, k, n = 7, 9, 30
    docnos = [f"D{i}" for i in range(n)]
    doc_idx = np.stack([rng.permutation(n)[:k] for _ in range(B)])
    scores = -np.sort(-rng.random((B, k)).astype(np.float32), axis=1)
    doc_idx[2, 4:] = -1
    doc_idx[5, :] = -1
    qids = [f"q{i}" for i in range(B)]
    fast = tmp_path / f"fast{suffix}"
    n_lines = runs.write_topk(fast, qids, docnos, scores, doc_idx, fmt=fmt, tag="t")
    assert n_lines == int((doc_idx >= 0).sum())
    slow_run = {q: v for q, v in runs.from_topk(qids, docnos, scores, doc_idx).items() if v}
    got = runs.read_run(fast)
    assert list(got) == list(slow_run)
    assert all(list(got[q]) == list(slow_run[q]) for q in got)  # same documents in the same rank order
    if fmt == "trec":  # float32 scores print as their shortest round-trip text
        assert all(np.float32(a) == np.float32(b) for q in got
                   for a, b in zip(got[q].values(), slow_run[q].values()))
    with pytest.raises(ValueError, match="out of range"):
        runs.write_topk(tmp_path / "bad", qids, docnos[:3], scores, doc_idx)


def test_write_topk_both_formats_in_one_pass(tmp_path):
    rng = np.random.default_rng(12)
    docnos = [f"D{i}" for i in range(20)]
    doc_idx = np.stack([rng.permutation(20)[:6] for _ in range(4)])
    scores = -np.sort(-rng.random((4, 6)).astype(np.float32), axis=1)
    qids = ["a", "b", "c", "d"]
    both = {"trec": tmp_path / "x.trec", "msmarco": tmp_path / "x.tsv"}
    assert runs.write_topk(both, qids, docnos, scores, doc_idx) == 24
    runs.write_topk(tmp_path / "y.trec", qids, docnos, scores, doc_idx)
    runs.write_topk(tmp_path / "y.tsv", qids, docnos, scores, doc_idx, fmt="msmarco")
    assert (tmp_path / "x.trec").read_bytes() == (tmp_path / "y.trec").read_bytes()
    assert (tmp_path / "x.tsv").read_bytes() == (tmp_path / "y.tsv").read_bytes()
    with pytest.raises(ValueError, match="formats"):
        runs.write_topk({"json": tmp_path / "z"}, qids, docnos, scores, doc_idx)


def test_write_topk_is_the_same_in_parallel_slices(tmp_path):
    rng = np.random.default_rng(13)
    docnos = [f"D{i}" for i in range(50)]
    doc_idx = np.stack([rng.permutation(50)[:8] for _ in range(9)])
    doc_idx[3, 2:] = -1
    scores = -np.sort(-rng.random((9, 8)).astype(np.float32), axis=1)
    qids = [f"q{i}" for i in range(9)]
    one = {"trec": tmp_path / "1.trec", "msmarco": tmp_path / "1.tsv"}
    many = {"trec": tmp_path / "n.trec", "msmarco": tmp_path / "n.tsv"}
    runs.write_topk(one, qids, docnos, scores, doc_idx)
    runs.write_topk(many, qids, docnos, scores, doc_idx, threads=4)
    for f in ("trec", "msmarco"):
        assert one[f].read_bytes() == many[f].read_bytes()
