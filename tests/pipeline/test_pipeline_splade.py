"""`lsr run` with a tiny local SPLADE model: encode -> index -> search -> evaluate on SciFact (CPU)."""

from __future__ import annotations

import json

import pytest

from lsr.cli import main
from lsr.testing import save_tiny_mlm
from tests.conftest import DATA, REPO


@pytest.mark.slow
def test_lsr_run_with_a_tiny_splade_model(tmp_path, capsys):
    model = save_tiny_mlm("bert", tmp_path / "tiny-bert", DATA)
    out = tmp_path / "run"
    args = ["run", str(REPO / "configs" / "scifact-splade.yaml"), "--set", f"output={out}",
            "--set", f"encoder.model={model}", "--set", "encoder.max_length_doc=32",
            "--set", "encoder.max_length_query=16", "--set", "encoder.batch_size=64", "--set", "device=cpu",
            "--json", str(out / "m.json")]
    assert main(args) == 0
    result = json.loads((out / "metrics.json").read_text())
    assert result["n_docs"] == 5183 and result["n_queries"] == 300
    manifest = json.loads((out / "doc_vectors" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["n_rows"] == 5183
    assert manifest["metadata"]["kind"] == "splade" and manifest["metadata"]["max_length_doc"] == 32
    lines = (out / "run.trec").read_text().splitlines()
    assert lines and all(len(ln.split()) == 6 for ln in lines[:20])
    metrics = json.loads((out / "m.json").read_text())
    assert set(metrics) == {"RR@10", "nDCG@10", "R@1000"}
    # a random tiny model is no retriever, but the pipeline must produce real, bounded metrics
    assert all(0.0 <= v <= 1.0 for v in metrics.values()) and metrics["R@1000"] > 0.0
    # a second run reuses the complete vector directory and gives the identical run
    first = (out / "run.trec").read_bytes()
    assert main(args) == 0
    assert (out / "run.trec").read_bytes() == first
