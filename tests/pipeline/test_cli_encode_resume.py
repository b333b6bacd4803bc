"""`lsr encode` killed with SIGKILL midway and run again gives exactly the shards of an uninterrupted run."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lsr.testing import save_tiny_mlm
from tests.conftest import DATA, REPO

N_DOCS, SHARD = 1200, 100


def _beir_subset(root: Path) -> Path:
    """The first N_DOCS SciFact documents with the real test queries and qrels, in BEIR layout."""
    root.mkdir()
    with open(DATA / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        (root / "corpus.jsonl").write_text("".join(itertools.islice(f, N_DOCS)), encoding="utf-8")
    (root / "queries.jsonl").write_bytes((DATA / "scifact" / "queries.jsonl").read_bytes())
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_bytes((DATA / "scifact" / "qrels" / "test.tsv").read_bytes())
    return root


def _encode_cmd(dataset: Path, model: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "lsr", "encode", "--dataset", str(dataset), "--encoder", "splade",
            "--model", str(model), "--out", str(out), "--shard-rows", str(SHARD), "--max-length-doc", "32",
            "--batch-size", "32", "--device", "cpu"]


def _shards(out: Path) -> list[tuple[str, int, str]]:
    m = json.loads((out / "manifest.json").read_text())
    return [(s["file"], s["rows"], s["sha256"]) for s in m["shards"]]


@pytest.mark.slow
def test_lsr_encode_resumes_exactly_after_sigkill(tmp_path):
    dataset = _beir_subset(tmp_path / "scifact-subset")
    model = save_tiny_mlm("bert", tmp_path / "tiny-bert", DATA)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}

    reference = tmp_path / "reference"
    subprocess.run(_encode_cmd(dataset, model, reference), env=env, check=True, capture_output=True, cwd=REPO)

    out = tmp_path / "interrupted"
    proc = subprocess.Popen(_encode_cmd(dataset, model, out), env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "manifest.json").exists() and len(_shards(out)) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the encoder finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = json.loads((out / "manifest.json").read_text())
    assert not done["complete"] and SHARD <= done["n_rows"] < N_DOCS

    subprocess.run(_encode_cmd(dataset, model, out), env=env, check=True, capture_output=True, cwd=REPO)
    final = json.loads((out / "manifest.json").read_text())
    assert final["complete"] and final["n_rows"] == N_DOCS
    assert _shards(out) == _shards(reference)  # same files, same rows, same bytes
