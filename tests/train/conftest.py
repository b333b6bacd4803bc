"""Fixtures of the training tests: a tiny random RoBERTa, splade-tiny without dropout and a 16-document BEIR folder
cut from SciFact."""

from __future__ import annotations

import json
import shutil

import pytest

from lsr.testing import save_tiny_mlm

N_DOCS = 16


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, data_dir):
    return save_tiny_mlm("roberta", tmp_path_factory.mktemp("tiny") / "roberta", data_dir, seed=0)


@pytest.fixture(scope="module")
def splade_tiny_no_dropout(tmp_path_factory, data_dir):
    """data/models/splade-tiny with dropout off: runs that must compute the same network (one process and two
    ranks, the eager and the graph step) then do."""
    out = tmp_path_factory.mktemp("splade-tiny") / "model"
    shutil.copytree(data_dir / "models" / "splade-tiny", out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def beir(tmp_path_factory, data_dir):
    """Documents = SciFact abstracts (first 40 words); query i = the title of document i, judged
    relevant to it; queries 0-11 are the train split, 12-15 the dev split."""
    root = tmp_path_factory.mktemp("beir")
    rows = []
    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        for line, _ in zip(f, range(N_DOCS)):
            rows.append(json.loads(line))
    with open(root / "corpus.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"_id": r["_id"], "title": "", "text": " ".join(r["text"].split()[:40])}) + "\n")
    with open(root / "queries.jsonl", "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"_id": f"q{i}", "text": r["title"]}) + "\n")
    (root / "qrels").mkdir()
    for split, ids in (("train", range(12)), ("dev", range(12, N_DOCS))):
        lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\t{rows[i]['_id']}\t1" for i in ids]
        (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return root
