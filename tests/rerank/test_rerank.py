"""The rerank stage: ColBERT encoder (both checkpoint layouts), document embedding cache, `lsr rerank`, and the
`rerank:` stage of `lsr run` — with tiny random ColBERT models saved from configs (CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from lsr.cli import main
from lsr.data import runs
from lsr.data.sources import load_dataset
from lsr.rerank.cache import DocEmbeddingCache
from lsr.rerank.encoder import ColbertEncoder
from lsr.rerank.kernels.maxsim import torch_maxsim
from lsr.testing import SAMPLE_TEXTS, save_tiny_colbert
from tests.conftest import DATA, DEV, REPO


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("colbert")
    return {layout: save_tiny_colbert(root / layout, DATA, layout=layout) for layout in ("pylate", "colbert")}


@pytest.fixture(scope="module")
def encoder(models):
    return ColbertEncoder(models["pylate"])


def test_layouts_load_to_the_same_encoder(models, encoder):
    other = ColbertEncoder(models["colbert"])
    assert other.settings == encoder.settings and encoder.settings.query_length == 12
    q1, m1 = encoder.encode_queries(SAMPLE_TEXTS)
    q2, m2 = other.encode_queries(SAMPLE_TEXTS)
    assert q1.shape == (len(SAMPLE_TEXTS), 12, 16) and torch.equal(q1, q2) and m1.all() and torch.equal(m1, m2)
    for a, b in zip(encoder.encode_documents(SAMPLE_TEXTS), other.encode_documents(SAMPLE_TEXTS)):
        assert torch.equal(a, b)
    assert ColbertEncoder(models["pylate"]).fingerprint == encoder.fingerprint
    assert other.fingerprint != encoder.fingerprint  # other files: a cache is never shared by accident


def test_document_tokens_marker_skiplist_and_padding(encoder):
    docs = encoder.encode_documents(["Cells!", SAMPLE_TEXTS[0]])
    # [CLS] [unused1] cells [SEP]: the "!" is in the skiplist, padding is dropped
    assert docs[0].shape == (4, 16)
    assert torch.allclose(docs[1].norm(dim=-1), torch.ones(docs[1].shape[0]), atol=1e-5)
    ids = encoder.tokenizer("Cells!")["input_ids"]
    ids = torch.tensor([ids[:1] + [encoder.doc_marker] + ids[1:]])
    hidden = encoder.body(input_ids=ids).last_hidden_state[0]
    manual = torch.nn.functional.normalize(hidden @ encoder.weight.T, dim=-1)
    assert torch.allclose(docs[0], manual[[0, 1, 2, 4]], atol=1e-5)
    alone = encoder.encode_documents(["Cells!"])[0]  # no padding leaks in from a longer batch-mate
    assert torch.allclose(alone, docs[0], atol=1e-5)


def test_query_augmentation_with_mask_tokens(encoder):
    ids, att = encoder._tokenize(["what is the capital of france"], 12, encoder.query_marker, True)
    assert ids[0, 1] == encoder.query_marker and ids.shape == (1, 12)
    q, mask = encoder.encode_queries(["what is the capital of france"])
    assert mask.all() and q.shape == (1, 12, 16)
    tail = q[0, int(att[0].sum()):]  # the [MASK] expansion tokens: real (unit) embeddings that score
    assert tail.shape[0] > 0 and torch.allclose(tail.norm(dim=-1), torch.ones(tail.shape[0]), atol=1e-5)


def test_cache_round_trip_persists_and_never_overwrites(tmp_path):
    g = torch.Generator().manual_seed(0)
    embs = [torch.randn(n, 8, generator=g) for n in (3, 1, 5)]
    cache = DocEmbeddingCache(tmp_path, "fp-a")
    cache.add(["a", "b", "c"], embs)
    cache.add(["d"], [torch.randn(2, 8, generator=g)])
    again = DocEmbeddingCache(tmp_path, "fp-a")
    assert len(again) == 4 and "d" in again and "z" not in again
    got = again.get(["c", "z", "a"])
    assert got[1] is None and torch.equal(got[0], embs[2].half()) and torch.equal(got[2], embs[0].half())
    assert len(DocEmbeddingCache(tmp_path, "fp-b")) == 0
    assert sorted(p.name for p in (tmp_path / "fp-a").iterdir()) == ["part-00000.safetensors", "part-00001.safetensors"]
    assert len(DocEmbeddingCache(None, "mem")) == 0  # in-memory only: nothing written


def _first_stage_run(tmp_path, n_queries=4, per_query=6):
    """A run over SciFact: a few test queries, each with documents in an arbitrary order."""
    ds = load_dataset(DATA / "scifact", "test")
    qids = list(ds.queries)[:n_queries]
    docnos = [d for d, _ in zip((d for d, _ in ds.docs_iter()), range(40))]
    run = {q: {docnos[(i * 5 + j) % 40]: float(per_query - j) for j in range(per_query)} for i, q in enumerate(qids)}
    path = tmp_path / "first.trec"
    runs.write_trec(run, path)
    return ds, run, path


@pytest.mark.parametrize("maxsim", ["torch", "triton"])
def test_lsr_rerank_scores_are_maxsim_of_the_cached_embeddings(models, encoder, tmp_path, maxsim):
    ds, run, path = _first_stage_run(tmp_path)
    out, cache = tmp_path / "rerank.trec", tmp_path / "cache"
    device = DEV if maxsim == "triton" else "cpu"  # Triton: CUDA, or the interpreter on a CPU-only machine
    args = ["rerank", "--run", str(path), "--model", str(models["pylate"]), "--dataset", str(DATA / "scifact"),
            "--split", "test", "--out", str(out), "--k", "4", "--cache", str(cache), "--device", device,
            "--maxsim", maxsim, "--dtype", "float32"]
    assert main(args) == 0
    got = runs.read_trec(out)
    assert list(got) == list(run)
    docs = dict(ds.docs_iter())
    for qid, ranked in got.items():
        top4 = list(run[qid])[:4]
        assert sorted(ranked) == sorted(top4)  # the first stage's top-k, nothing else
        q, qm = encoder.encode_queries([ds.queries[qid]])
        if device == "cuda":  # scored in float16 there (the cache's dtype)
            q = q.half().float()
        d = [e.half().float() for e in encoder.encode_documents([docs[x] for x in top4])]
        dpad = torch.nn.utils.rnn.pad_sequence(d, batch_first=True)
        ref = torch_maxsim(q, dpad, qm, torch.tensor([len(e) for e in d]))[0]
        expect = dict(zip(top4, ref.tolist()))
        tol = 1e-5 if device == "cpu" else 1e-3  # CUDA: another device's fp32 encoder and fp16 rounding
        assert all(abs(ranked[x] - expect[x]) <= tol for x in top4)
        assert list(ranked.values()) == sorted(ranked.values(), reverse=True)
    # a second run reads every document from the cache (a miss would add a cache part) and writes the same run
    cached = {p: p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()}
    first = out.read_bytes()
    assert main(args) == 2  # --out exists: refused
    assert main(args + ["--overwrite"]) == 0 and out.read_bytes() == first
    assert {p: p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()} == cached


def test_lsr_rerank_errors(models, tmp_path, capsys):
    _, run, path = _first_stage_run(tmp_path, n_queries=1)
    bad = tmp_path / "bad.trec"
    runs.write_trec({next(iter(run)): {"no-such-doc": 1.0}}, bad)
    base = ["--model", str(models["colbert"]), "--dataset", str(DATA / "scifact"), "--split", "test",
            "--no-cache", "--device", "cpu"]
    assert main(["rerank", "--run", str(bad), "--out", str(tmp_path / "o1"), *base]) == 1
    assert "not in the dataset" in capsys.readouterr().err
    assert main(["rerank", "--run", str(path), "--out", str(tmp_path / "o2"), "--k", "0", *base]) == 2
    empty = tmp_path / "empty-model"
    empty.mkdir()
    assert main(["rerank", "--run", str(path), "--out", str(tmp_path / "o3"), *base[:1], str(empty), *base[2:]]) == 1
    assert "no model.safetensors" in capsys.readouterr().err
    assert main(["rerank", "--run", str(tmp_path / "none.trec"), "--out", str(tmp_path / "o4"), *base]) == 1
    assert "no such run file" in capsys.readouterr().err
    assert main(["rerank", "--run", str(path), "--out", str(empty / "r.trec"), *base[:1], str(empty), *base[2:]]) == 1
    assert "never writes into its inputs" in capsys.readouterr().err


@pytest.mark.slow
def test_lsr_run_bm25_then_rerank(models, tmp_path):
    out = tmp_path / "run"
    args = ["run", str(REPO / "configs" / "scifact-bm25.yaml"), "--set", f"output={out}", "--set", "device=cpu",
            "--set", f"rerank.model={models['pylate']}", "--set", "rerank.k=3", "--set", "search.k=10",
            "--set", "evaluation.metrics=[nDCG@10]"]
    assert main(args) == 0
    result = json.loads((out / "metrics.json").read_text())
    assert set(result["metrics"]) == set(result["metrics_first_stage"]) == {"nDCG@10"}
    reranked = runs.read_trec(out / "rerank.trec")
    first = runs.read_trec(out / "run.trec")
    assert len(reranked) == result["n_queries"] == 300
    assert all(set(reranked[q]) == set(list(first[q])[:3]) for q in reranked)
    assert any((out / "doc-embeddings").rglob("part-*.safetensors"))
