"""encode_corpus on the first 300 SciFact documents with tiny models: stream order, length bucketing,
exact resume after an exception and after a real SIGKILL, refusals, and the generic (BM25) path."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from lsr.testing import save_tiny_mlm

pytest.importorskip("transformers")

from lsr.encode.corpus import encode_corpus
from lsr.encode.splade.encoder import SpladeEncoder
from lsr.storage.shards import read_manifest, read_vectors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_DOCS, SHARD, WINDOW, BATCH = 300, 64, 32, 32
SETTINGS = {"batch_size": BATCH, "shard_rows": SHARD, "sort_window": WINDOW, "show_progress_bar": False}


@pytest.fixture(scope="module")
def docs(data_dir) -> list[tuple[str, str]]:
    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, N_DOCS)]
    return [(r["_id"], f"{r['title']} {r['text']}") for r in rows]


@pytest.fixture(scope="module")
def roberta(tmp_path_factory, data_dir) -> str:
    # byte-level BPE, vocab 500: the head is cheap on the CPU, so several full runs stay fast
    return str(save_tiny_mlm("roberta", tmp_path_factory.mktemp("roberta"), data_dir))


@pytest.fixture(scope="module")
def encoder(roberta) -> SpladeEncoder:
    return SpladeEncoder.from_pretrained(roberta, device="cpu", max_length_doc=64)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, encoder, docs) -> dict:
    """An uninterrupted run: the manifest every interrupted run must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "vectors"
    return encode_corpus(encoder, docs, out, **SETTINGS) | {"dir": str(out)}


def shard_hashes(manifest: dict) -> list[tuple[str, int, str]]:
    return [(s["file"], s["rows"], s["sha256"]) for s in manifest["shards"]]


def failing_after(docs, n):
    for i, d in enumerate(docs):
        if i == n:
            raise RuntimeError("simulated crash")
        yield d


@pytest.mark.slow
def test_stream_order_and_equality_with_direct_encoding(tmp_path, data_dir, docs):
    model = save_tiny_mlm("bert", tmp_path / "bert", data_dir)  # real WordPiece tokenizer on real text
    enc = SpladeEncoder.from_pretrained(model, device="cpu", max_length_doc=32)
    docs = docs[:160]
    manifest = encode_corpus(enc, docs, tmp_path / "vec", **SETTINGS)
    assert manifest["complete"] and [s["rows"] for s in manifest["shards"]] == [64, 64, 32]
    assert manifest["metadata"] == enc.describe() and manifest["vocab_size"] == 30522
    got = read_vectors(tmp_path / "vec")
    want = enc.encode_document([t for _, t in docs], ids=[i for i, _ in docs])
    assert got.ids == [i for i, _ in docs]
    torch.testing.assert_close(got.to_dense(), want.to_dense(), atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_resume_after_exception_is_exact(tmp_path, encoder, docs, reference):
    out = tmp_path / "vec"
    with pytest.raises(RuntimeError, match="simulated crash"):
        encode_corpus(encoder, failing_after(docs, 150), out, **SETTINGS)
    partial = read_manifest(out)
    # windows before the failure are still encoded: two full shards, the rest is redone
    assert not partial["complete"] and partial["n_rows"] == 128
    manifest = encode_corpus(encoder, docs, out, **SETTINGS)
    assert manifest["complete"] and shard_hashes(manifest) == shard_hashes(reference)
    assert read_vectors(out).equal(read_vectors(reference["dir"]))


CHILD = r"""
import json, os, signal, sys, time
from lsr.encode.corpus import encode_corpus
from lsr.encode.splade.encoder import SpladeEncoder

model, out, corpus, shard, window, batch = sys.argv[1:7]
docs = [tuple(d) for d in json.load(open(corpus))]

def stream():
    for i, d in enumerate(docs):
        if i == 200:  # wait until two shards are on disk, then die on the spot
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    if json.load(open(os.path.join(out, "manifest.json")))["n_rows"] >= 2 * int(shard):
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGKILL)
        yield d

enc = SpladeEncoder.from_pretrained(model, device="cpu", max_length_doc=64)
encode_corpus(enc, stream(), out, batch_size=int(batch), shard_rows=int(shard), sort_window=int(window),
              show_progress_bar=False)
"""


@pytest.mark.slow
def test_resume_after_sigkill_is_exact(tmp_path, roberta, encoder, docs, reference):
    corpus, out = tmp_path / "docs.json", tmp_path / "vec"
    corpus.write_text(json.dumps(docs))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", CHILD, roberta, str(out), str(corpus), str(SHARD), str(WINDOW),
                           str(BATCH)], env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    partial = read_manifest(out)
    assert not partial["complete"] and partial["n_rows"] in (128, 192)  # a third shard may have landed
    manifest = encode_corpus(encoder, docs, out, **SETTINGS)
    assert manifest["complete"] and shard_hashes(manifest) == shard_hashes(reference)
    assert read_vectors(out).equal(read_vectors(reference["dir"]))


def test_complete_directory_is_returned_without_reading(encoder, reference):
    def untouchable():
        raise AssertionError("the stream must not be read")
        yield  # pragma: no cover

    manifest = encode_corpus(encoder, untouchable(), reference["dir"], **SETTINGS)
    assert shard_hashes(manifest) == shard_hashes(reference)


def test_refusals(tmp_path, roberta, encoder, docs):
    out = tmp_path / "vec"
    with pytest.raises(RuntimeError):
        encode_corpus(encoder, failing_after(docs, 100), out, **SETTINGS)
    with pytest.raises(FileExistsError):
        encode_corpus(encoder, docs, out, **(SETTINGS | {"resume": False}))
    with pytest.raises(ValueError, match="same documents"):  # another order
        encode_corpus(encoder, docs[::-1], out, **SETTINGS)
    other = SpladeEncoder.from_pretrained(roberta, device="cpu", max_length_doc=32)
    with pytest.raises(ValueError, match="other settings"):
        encode_corpus(other, docs, out, **SETTINGS)
    with pytest.raises(TypeError, match="pairs"):
        encode_corpus(encoder, [("a", "x"), "not a pair"], tmp_path / "bad", **SETTINGS)


def test_doc_top_k_stats_and_bucketing(tmp_path, encoder, docs):
    stats: dict = {}
    manifest = encode_corpus(encoder, docs[:100], tmp_path / "vec", doc_top_k=8, stats=stats, **SETTINGS)
    vec = read_vectors(tmp_path / "vec")
    assert int(vec.lengths.max()) == 8 and manifest["metadata"]["doc_top_k"] == 8
    assert stats["docs"] == 100 and stats["nnz"] == vec.nnz and stats["docs_per_s"] > 0
    assert stats["tokens"] <= stats["padded_tokens"] < 1.1 * stats["tokens"]  # length sorting: little padding


def test_generic_encoder_path_with_bm25(tmp_path, docs):
    from lsr.encode.bm25.lexical import LexicalEncoder

    enc = LexicalEncoder().fit(t for _, t in docs)
    manifest = encode_corpus(enc, docs, tmp_path / "bm25", **SETTINGS)
    assert manifest["complete"] and manifest["metadata"] == enc.describe()
    want = enc.encode_document([t for _, t in docs], ids=[i for i, _ in docs])
    assert read_vectors(tmp_path / "bm25").equal(want)


@pytest.mark.slow
def test_tokenizer_workers_give_the_same_shards_across_a_resume(tmp_path, encoder, docs, reference):
    out = tmp_path / "vec"
    with pytest.raises(RuntimeError, match="simulated crash"):
        encode_corpus(encoder, failing_after(docs, 150), out, tokenize_workers=2, **SETTINGS)
    assert read_manifest(out)["n_rows"] == 128
    stats: dict = {}
    manifest = encode_corpus(encoder, docs, out, tokenize_workers=2, stats=stats, **SETTINGS)
    # every window goes to the workers; the reading thread may take chunks of the first one
    assert stats["tokenize_workers"] == 2 and stats["docs"] == N_DOCS - 128
    assert N_DOCS - 128 - WINDOW <= stats["tokenized_by_workers"] <= N_DOCS - 128
    assert manifest["complete"] and shard_hashes(manifest) == shard_hashes(reference)


@pytest.mark.slow
def test_first_windows_ramp_up_and_resume_exactly(tmp_path, encoder, docs):
    from lsr.encode.corpus import window_end

    settings = {**SETTINGS, "first_window": 4}
    for shard, window in ((64, 32), (100, 48), (30, 64)):
        pos, ends = 0, []
        while pos < 400:
            ends.append(pos := window_end(pos, shard, window, 4))
        assert ends[:4] == [4, 12, 28, min(shard, window)]  # doubling, then the regular cuts
        for k in range(1, 400 // shard):  # a resume at a shard boundary cuts the same windows
            later, pos = [], k * shard
            while pos < 400:
                later.append(pos := window_end(pos, shard, window, 4))
            assert later == [e for e in ends if e > k * shard]
    reference = encode_corpus(encoder, docs, tmp_path / "ref", **settings)
    with pytest.raises(RuntimeError, match="simulated crash"):
        encode_corpus(encoder, failing_after(docs, 150), tmp_path / "vec", **settings)
    assert read_manifest(tmp_path / "vec")["n_rows"] == 128
    manifest = encode_corpus(encoder, docs, tmp_path / "vec", **settings)
    assert shard_hashes(manifest) == shard_hashes(reference)
    got, want = read_vectors(tmp_path / "vec"), encoder.encode_document([t for _, t in docs])
    assert got.ids == [i for i, _ in docs]
    torch.testing.assert_close(got.to_dense(), want.to_dense(), atol=1e-5, rtol=1e-4)
