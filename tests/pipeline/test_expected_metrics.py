"""A config's ``evaluation.expected`` values hold for the data they were measured on, nowhere else.

configs/scifact-bm25.yaml documents SciFact's numbers; the same config run on other data (``--set
data.dataset=...``) must not record them in metrics.json as if they were that data's, and ``--check`` must say
that it has nothing to compare with instead of comparing against SciFact's numbers.
"""

from __future__ import annotations

import json

import pytest
import yaml

from lsr.cli import main
from lsr.config import load_config
from lsr.testing import write_scifact_slice
from tests.conftest import DATA, REPO

BM25 = REPO / "configs" / "scifact-bm25.yaml"


@pytest.fixture(scope="module")
def other_data(tmp_path_factory) -> str:
    """A BEIR folder that is not SciFact's (a slice of it: 3 queries, their abstracts and 10 more)."""
    folder = tmp_path_factory.mktemp("other") / "beir"
    write_scifact_slice(folder, DATA, n_queries=3, n_other=10)
    return str(folder)


def test_a_run_on_other_data_records_no_expected_values(tmp_path, other_data):
    out = tmp_path / "run"
    assert main(["run", str(BM25), "--set", f"data.dataset={other_data}", "--set", f"output={out}"]) == 0
    result = json.loads((out / "metrics.json").read_text())
    assert result["dataset"] == other_data and result["n_docs"] < 50
    assert result["expected"] == {}
    assert set(result["metrics"]) == {"RR@10", "nDCG@10", "R@1000"}


def test_check_on_other_data_is_refused_before_any_work(tmp_path, other_data, capsys):
    out = tmp_path / "run"
    assert main(["run", str(BM25), "--set", f"data.dataset={other_data}", "--set", f"output={out}", "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lsr run: error: --check:")
    assert "data/scifact" in err and other_data in err and "drop --check" in err
    assert not out.exists()


def test_a_config_records_the_values_measured_on_its_own_data(tmp_path, other_data):
    """A config whose own data is the other folder: its expected values are that folder's and are recorded."""
    config = tmp_path / "own.yaml"
    config.write_text(yaml.safe_dump({"name": "own", "data": {"dataset": other_data, "split": "test"},
                                      "output": str(tmp_path / "run"), "encoder": {"kind": "bm25"},
                                      "evaluation": {"expected": {"nDCG@10": 0.5}}}))
    assert main(["run", str(config)]) == 0
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["expected"] == {"nDCG@10": 0.5}


@pytest.mark.parametrize(("overrides", "holds"), [
    ((), True),
    (("data.dataset=data/scifact",), True),
    (("data.dataset=./data/scifact/",), True),          # the same folder, spelled otherwise
    (("data.split=train",), False),                     # other judgements
    (("data.dataset=data/msmarco-passage",), False),
    (("data.dataset=data/msmarco-passage", "evaluation.expected_on.dataset=data/msmarco-passage"), True),
])
def test_expected_values_hold_only_on_the_data_they_were_measured_on(monkeypatch, overrides, holds):
    monkeypatch.chdir(REPO)  # the config's data/scifact is relative to the repository
    cfg = load_config(BM25, list(overrides))
    assert (cfg.evaluation.expected_on.dataset, cfg.evaluation.expected_on.split) == (
        "data/msmarco-passage" if len(overrides) == 2 else "data/scifact", "test")
    assert cfg.expected_holds() is holds
