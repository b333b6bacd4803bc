"""lsr.benchmarks.harness (the benchmark harness) and lsr.testing (the shared references and checks)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from lsr.benchmarks import harness as bench
from lsr.index import InvertedIndex
from lsr.search.searcher import Searcher
from lsr.testing import float64_scores, random_collection, reference_topk, topk_violations


def test_results_have_one_schema_in_json_and_csv(tmp_path):
    res = bench.Results(tmp_path, "bench_x", bench.environment("cpu"), {"n": 3})
    res.add({"method": "a", "B": 1, **bench.quantiles(bench.time_calls(lambda i: sum(range(100)), 5))}, echo=False)
    res.add({"method": "b", "error": "OOM: no"}, echo=False)
    doc = json.loads((tmp_path / "bench_x.json").read_text())
    assert list(doc) == ["schema", "bench", "environment", "config", "summary", "rows"]
    assert doc["schema"] == bench.SCHEMA and doc["config"] == {"n": 3}
    assert {"commit", "torch", "device", "date"} <= set(doc["environment"])
    for row in doc["rows"]:
        assert set(bench.ROW_KEYS) <= set(row)
    assert [r["status"] for r in doc["rows"]] == ["ok", "error"]
    assert doc["rows"][0]["repeats"] == 5 and doc["rows"][0]["ms_p10"] <= doc["rows"][0]["ms"] <= doc["rows"][0]["ms_p90"]
    with open(tmp_path / "bench_x.csv") as fh:
        lines = list(csv.DictReader(fh))
    assert list(lines[0])[: len(bench.ROW_KEYS)] == list(bench.ROW_KEYS) and lines[1]["error"] == "OOM: no"


def test_quantiles_and_table():
    q = bench.quantiles([5.0, 1.0, 3.0, 2.0, 4.0])
    assert q == {"ms": 3.0, "ms_p10": 1.0, "ms_p90": 5.0, "repeats": 5}
    assert bench.quantiles([])["ms"] is None
    text = bench.format_table([{"method": "x", "ms": 1.234, "exact": True}, {"method": "y", "error": "boom"}],
                              ["method", ("ms", ".1f"), "exact"])
    lines = text.splitlines()
    assert lines[1].split() == ["x", "1.2", "y"] and "boom" in lines[2]


def test_topk_violations_accepts_exact_search_and_names_each_fault():
    docs = random_collection(200, 30, seed=3, quantized=True)  # multiples of 1/8: many exact ties
    queries = random_collection(6, 30, seed=4, density=0.3, quantized=True)
    scores, idx = Searcher(InvertedIndex.build(docs, block_size=16)).search(queries, k=20)
    ref = float64_scores(queries, docs)
    ref_s, ref_i = reference_topk(queries, docs, 20)
    assert torch.equal(idx, torch.from_numpy(ref_i))
    assert all(not topk_violations(s, d, r, 20) for s, d, r in zip(scores, idx, ref))
    tie = (scores[:, :-1] == scores[:, 1:]) & (scores[:, 1:] > 0)
    b = int(torch.argmax(tie.sum(1)))  # a query with a tie inside its top-k
    pos = int(torch.nonzero(tie[b])[0])
    swapped = idx[b].clone()
    swapped[[pos, pos + 1]] = swapped[[pos + 1, pos]]
    assert topk_violations(scores[b], swapped, ref[b], 20) == ["ties not by ascending doc index"]
    dropped = idx[b].clone()
    dropped[0] = int(torch.nonzero(ref[b] == 0)[0])  # a document that does not match at all
    assert "scores differ from the float64 inner products" in topk_violations(scores[b], dropped, ref[b], 20)
    with pytest.raises(AssertionError, match="padding"):
        from lsr.testing import assert_exact_topk

        bad = scores.clone()
        bad[:, -1] = 0.5
        idx_bad = idx.clone()
        idx_bad[:, -1] = -1
        assert_exact_topk(bad, idx_bad, ref, 20)
