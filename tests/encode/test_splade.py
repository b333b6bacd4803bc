"""SpladeEncoder on tiny random checkpoints (BERT, DistilBERT, RoBERTa, ModernBERT): equality with the
plain Hugging Face computation, truncation, pruning, decoding, query models, offline failures."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from lsr.testing import KINDS, save_tiny_mlm
from lsr.testing import SAMPLE_TEXTS as TEXTS

transformers = pytest.importorskip("transformers")

from lsr.encode.splade.encoder import SpladeEncoder
from tests.conftest import DEV


@pytest.fixture(scope="module")
def models(tmp_path_factory, data_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny-mlm")
    return {k: str(save_tiny_mlm(k, root / k, data_dir)) for k in KINDS}


def hf_reference(path: str, texts: list[str], max_length: int) -> torch.Tensor:
    """The plain HF computation: [n, V] = max_s log1p(relu(MLM logits)) · mask, fp32 on the CPU."""
    model = transformers.AutoModelForMaskedLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    return (torch.log1p(torch.relu(logits)) * enc["attention_mask"][..., None]).amax(1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_matches_hf_masked_lm(models, kind):
    enc = SpladeEncoder.from_pretrained(models[kind], device="cpu", backend="torch", batch_size=2)
    ids = [f"d{i}" for i in range(len(TEXTS))]
    vec = enc.encode_document(TEXTS, ids=ids)
    assert vec.ids == ids and vec.vocab_size == enc.vocab_size and vec.device.type == "cpu"
    vec.validate()
    ref = hf_reference(models[kind], TEXTS, enc.max_length_doc)
    assert ref.shape == (len(TEXTS), enc.vocab_size)
    assert (ref > 0).sum(1).min() > 0  # the comparison is not vacuous
    torch.testing.assert_close(vec.to_dense(), ref, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_triton_backend_matches_hf(models):
    # the RoBERTa model (V=500, not a multiple of the vocab tile) keeps the interpreter fast; the kernel
    # itself is tested at awkward shapes in test_sparton.py, this checks the encoder's wiring
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    # on a GPU host the kernel runs on the GPU (the interpreter is not on there); fp32, like the HF reference
    enc = SpladeEncoder.from_pretrained(models["roberta"], device=DEV, dtype=torch.float32, backend="triton")
    vec = enc.encode_query(TEXTS)
    ref = hf_reference(models["roberta"], TEXTS, enc.max_length_query)
    torch.testing.assert_close(vec.to_dense().cpu(), ref, atol=1e-5, rtol=1e-4)


def test_query_and_document_max_lengths(models):
    enc = SpladeEncoder.from_pretrained(models["bert"], device="cpu", max_length_query=6, max_length_doc=12)
    long = [TEXTS[0], TEXTS[4]]
    torch.testing.assert_close(enc.encode_query(long).to_dense(), hf_reference(models["bert"], long, 6),
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(enc.encode_document(long).to_dense(), hf_reference(models["bert"], long, 12),
                               atol=1e-5, rtol=1e-4)
    prepared = enc.prepare(long, "query")
    assert prepared.n_tokens == 12 and all(b.input_ids.shape[1] <= 6 for b in prepared.batches)
    d = enc.describe()
    assert (d["max_length_query"], d["max_length_doc"]) == (6, 12)


@pytest.mark.slow
def test_batching_and_length_sorting_keep_order(models):
    enc = SpladeEncoder.from_pretrained(models["distilbert"], device="cpu")
    texts = TEXTS * 3
    ids = [str(i) for i in range(len(texts))]
    one = enc.encode_document(texts, ids=ids, batch_size=64)
    small = enc.encode_document(texts, ids=ids, batch_size=2)
    assert small.ids == ids
    torch.testing.assert_close(small.to_dense(), one.to_dense(), atol=1e-5, rtol=1e-4)
    prepared = enc.prepare(texts, "doc", batch_size=4)
    widths = [b.input_ids.shape[1] for b in prepared.batches]
    assert widths == sorted(widths, reverse=True)  # longest first
    assert sorted(torch.cat([b.rows for b in prepared.batches]).tolist()) == list(range(len(texts)))
    assert prepared.n_slots < 1.3 * prepared.n_tokens  # sorting keeps padding small
    assert len(enc.encode_document([])) == 0


@pytest.mark.slow
def test_doc_top_k_prunes_documents_only(models):
    full = SpladeEncoder.from_pretrained(models["bert"], device="cpu")
    pruned = SpladeEncoder.from_pretrained(models["bert"], device="cpu", doc_top_k=5)
    docs = pruned.encode_document(TEXTS)
    assert int(docs.lengths.max()) == 5
    assert docs.equal(full.encode_document(TEXTS).prune_top_k(5))
    assert pruned.encode_query(TEXTS).equal(full.encode_query(TEXTS))
    assert pruned.describe()["doc_top_k"] == 5
    with pytest.raises(ValueError):
        SpladeEncoder.from_pretrained(models["bert"], device="cpu", doc_top_k=0)


def test_decode(models):
    enc = SpladeEncoder.from_pretrained(models["bert"], device="cpu")
    vec = enc.encode_query(TEXTS[:2])
    rows = enc.decode(vec)
    assert len(rows) == 2 and len(rows[0]) == int(vec.lengths[0])
    weights = [w for _, w in rows[0]]
    assert weights == sorted(weights, reverse=True)
    dense = vec.to_dense()
    tok, w = rows[1][0]
    assert enc.vocab.index(tok) == int(dense[1].argmax()) and w == pytest.approx(float(dense[1].max()))
    assert [len(r) for r in enc.decode(vec, top_k=3)] == [3, 3]
    assert enc.vocab[101] == "[CLS]" and enc.vocab_size == 30522


@pytest.mark.slow
def test_separate_query_model(models):
    enc = SpladeEncoder.from_pretrained(models["bert"], device="cpu", query_model=models["distilbert"])
    torch.testing.assert_close(enc.encode_query(TEXTS).to_dense(),
                               hf_reference(models["distilbert"], TEXTS, enc.max_length_query), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(enc.encode_document(TEXTS).to_dense(),
                               hf_reference(models["bert"], TEXTS, enc.max_length_doc), atol=1e-5, rtol=1e-4)
    d = enc.describe()
    assert d["query_model"] == models["distilbert"] and d["architecture"] == "BertForMaskedLM"
    with pytest.raises(ValueError, match="vocabular"):
        SpladeEncoder.from_pretrained(models["bert"], device="cpu", query_model=models["roberta"])


def test_describe_is_json_and_ids_are_checked(models):
    enc = SpladeEncoder.from_pretrained(models["roberta"], device="cpu")
    d = json.loads(json.dumps(enc.describe()))
    assert d["kind"] == "splade" and d["dtype"] == "float32" and d["vocab_size"] == 500
    assert len(d["vocab_hash"]) == 64 and d["model"] == models["roberta"]
    assert enc.vocab[1] == "<pad>"
    with pytest.raises(ValueError, match="unique"):
        enc.encode_document(["a", "b"], ids=["x", "x"])
    with pytest.raises(ValueError, match="ids"):
        enc.encode_document(["a", "b"], ids=["x"])


def test_offline_hub_id_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(OSError, match="HF_HUB_OFFLINE") as err:
        SpladeEncoder.from_pretrained("lsr-tests/no-such-splade-model", device="cpu")
    assert time.perf_counter() - t0 < 10
    assert "local" in str(err.value) and "lsr-tests/no-such-splade-model" in str(err.value)


def test_unreachable_hub_fails_fast(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused at once
    t0 = time.perf_counter()
    with pytest.raises(OSError, match="unreachable"):
        SpladeEncoder.from_pretrained("lsr-tests/no-such-splade-model", device="cpu")
    assert time.perf_counter() - t0 < 10


def test_missing_local_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        SpladeEncoder.from_pretrained(tmp_path / "nope" / "model", device="cpu")



@pytest.mark.parametrize("top_k", [None, 3])
def test_nan_weights_are_refused_with_and_without_pruning(models, top_k):
    enc = SpladeEncoder.from_pretrained(models["bert"], device="cpu", doc_top_k=top_k)
    with torch.no_grad():  # one term's weight NaN for every text; the check sees the unpruned weights
        enc.tower("doc").bias[7] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN"):
        enc.encode_document(TEXTS)


@pytest.mark.slow
def test_long_lists_are_encoded_in_windows_with_the_same_vectors(models):
    from lsr.encode import stream

    enc = SpladeEncoder.from_pretrained(models["bert"], device="cpu", batch_size=3)
    texts = TEXTS * 3
    whole = enc.encode_document(texts)
    enc.window = 4  # encode_document's lists longer than this go through encode_windows
    windows = stream.encode_windows(enc, texts, None, "doc", 3, window=4)
    assert windows.ids == whole.ids
    assert torch.equal(windows.indptr, whole.indptr) and torch.equal(windows.indices, whole.indices)
    torch.testing.assert_close(windows.values, whole.values, rtol=1e-6, atol=1e-6)
    through_api = enc.encode_document(texts, ids=[f"d{i}" for i in range(len(texts))])
    assert through_api.ids[0] == "d0" and torch.equal(through_api.indices, whole.indices)
    with pytest.raises(ValueError, match="unique"):
        enc.encode_document(texts, ids=["x"] * len(texts))


@pytest.mark.slow
def test_windows_through_the_shared_tokenizer_pool(models):
    from lsr.encode import stream

    enc = SpladeEncoder.from_pretrained(models["bert"], device="cpu", batch_size=3)
    texts = [f"{t} {i}" for i in range(4) for t in TEXTS]  # 20 texts, windows of 8, chunks of 2
    in_process = stream.encode_windows(enc, texts, None, "doc", 3, window=8, tokenize_workers=0)
    enc.tokenize_chunk = 2  # tokenizer tasks of 2 texts: several per window, and the windows use the pool
    try:
        pooled = stream.encode_windows(enc, texts, None, "doc", 3, window=8, tokenize_workers=2)
        pool = enc.shared_tokenizer_pool("doc", 2)
        done = pool.texts_by_workers
        assert 12 <= done <= 20  # every window but the first one entirely by the workers
        again = stream.encode_windows(enc, texts, None, "doc", 3, window=8, tokenize_workers=2)
        assert enc.shared_tokenizer_pool("doc", 2) is pool and pool.texts_by_workers >= done + 12  # kept running
    finally:
        enc.close()
    assert not pool._all  # close() stopped the processes
    for got in (pooled, again):
        assert got.ids == in_process.ids and torch.equal(got.indptr, in_process.indptr)
        assert torch.equal(got.indices, in_process.indices) and torch.equal(got.values, in_process.values)
