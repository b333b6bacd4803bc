"""Tokenization in worker processes gives exactly the in-process token ids."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

from lsr.encode import splade
from tests.conftest import DATA


def test_worker_processes_tokenize_like_the_main_process(monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DATA / "bert-base-uncased")
    with open(DATA / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(301), f)] + ["", "a"]
    local = splade._Tokenize(tok, 48)
    pooled = splade._Tokenize(tok, 48, workers=2)
    monkeypatch.setattr(splade, "POOL_MIN_TEXTS", 1)
    try:
        flat_a, len_a = local(texts)
        flat_b, len_b = pooled(texts)
    finally:
        pooled._pool.close()
    assert len_a.tolist() == len_b.tolist() and int(len_a.max()) == 48
    assert np.array_equal(flat_a, flat_b)
