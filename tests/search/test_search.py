"""Searcher (torch backend) against a float64 brute-force reference; exact_topk; checks and dispatch."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from lsr.index import InvertedIndex
from lsr.search.searcher import Searcher, check_compatible, exact_topk
from lsr.sparse import SparseVectors
from lsr.testing import random_collection, reference_topk


def make_case(n_docs: int, n_queries: int, vocab: int, seed: int, quantized: bool):
    docs = random_collection(n_docs, vocab, seed, density=0.08, quantized=quantized)
    queries = random_collection(n_queries, vocab, seed + 1000, density=0.15, quantized=quantized)
    queries = SparseVectors(queries.indptr, queries.indices, queries.values,
                            [f"q{seed}-{i}" for i in range(n_queries)], vocab)
    return docs, queries


@pytest.mark.parametrize("seed,block_size,k", [(0, 64, 10), (1, 16, 50), (2, 65536, 7), (3, 1, 1)])
def test_quantized_weights_match_reference_exactly(seed, block_size, k):
    # multiples of 1/8: float32 sums are exact, so every tie is a real tie and the order must match
    docs, queries = make_case(400, 13, 60, seed, quantized=True)
    index = InvertedIndex.build(docs, block_size=block_size)
    scores, idx = Searcher(index, backend="torch").search(queries, k=k)
    ref_s, ref_i = reference_topk(queries, docs, k)
    assert scores.dtype == torch.float32 and idx.dtype == torch.int64 and scores.shape == (13, k)
    np.testing.assert_array_equal(idx.numpy(), ref_i)
    np.testing.assert_array_equal(scores.numpy(), ref_s.astype(np.float32))


@pytest.mark.parametrize("seed", [5, 6])
def test_continuous_weights_match_reference_up_to_near_ties(seed):
    docs, queries = make_case(500, 9, 80, seed, quantized=False)
    k = 40
    scores, idx = Searcher(InvertedIndex.build(docs, block_size=128), backend="torch").search(queries, k=k)
    ref_s, ref_i = reference_topk(queries, docs, k)
    np.testing.assert_allclose(scores.numpy(), ref_s, rtol=1e-6, atol=0)  # score multisets, in order
    for b in range(len(queries)):
        valid = ref_i[b] >= 0
        assert np.array_equal(idx[b].numpy() >= 0, valid)
        # every doc clearly above the k-th score must be returned
        kth = ref_s[b][valid].min() if valid.any() else 0.0
        sure = set(ref_i[b][ref_s[b] > kth * (1 + 1e-6)].tolist())
        assert sure <= set(idx[b].tolist())
        s = scores[b][idx[b] >= 0]
        assert bool((s[1:] <= s[:-1]).all())


def test_k_larger_than_matches_pads_and_never_returns_zero_scores():
    docs, queries = make_case(60, 5, 40, 7, quantized=True)
    index = InvertedIndex.build(docs, block_size=16)
    k = 200  # > n_docs
    scores, idx = Searcher(index).search(queries, k=k)
    _, ref_i = reference_topk(queries, docs, k)
    np.testing.assert_array_equal(idx.numpy(), ref_i)
    n_hits = (ref_i >= 0).sum(1)
    for b, h in enumerate(n_hits.tolist()):
        assert h < k and bool((idx[b, h:] == -1).all()) and bool((scores[b, h:] == 0).all())
        assert bool((scores[b, :h] > 0).all())


def test_empty_queries_give_padding():
    docs, _ = make_case(50, 1, 30, 8, quantized=True)
    index = InvertedIndex.build(docs, block_size=8)
    empty = SparseVectors(torch.zeros(4, dtype=torch.int64), [], [], ["a", "b", "c"], 30)
    scores, idx = Searcher(index).search(empty, k=5)
    assert scores.shape == (3, 5) and bool((idx == -1).all()) and bool((scores == 0).all())
    # a batch mixing empty and non-empty queries
    mixed = SparseVectors(torch.tensor([0, 0, 2, 2]), torch.tensor([1, 29]), torch.tensor([1.0, 0.5]),
                          ["e1", "q", "e2"], 30)
    scores, idx = Searcher(index).search(mixed, k=5, query_batch=1)
    assert bool((idx[[0, 2]] == -1).all())
    np.testing.assert_array_equal(idx[1].numpy(), reference_topk(mixed, docs, 5)[1][1])
    assert Searcher(index).search(empty[:0], k=3)[0].shape == (0, 3)


def test_bad_arguments_are_rejected():
    docs, queries = make_case(30, 2, 20, 9, quantized=True)
    searcher = Searcher(InvertedIndex.build(docs, block_size=8))
    for k in (0, -3, 2.5):
        with pytest.raises(ValueError, match="k must be"):
            searcher.search(queries, k=k)
    other = SparseVectors(queries.indptr, queries.indices, queries.values, queries.ids, 21)
    with pytest.raises(ValueError, match="vocab_size"):
        searcher.search(other, k=3)
    with pytest.raises(ValueError, match="backend"):
        Searcher(searcher.index, backend="cuda")


@pytest.mark.slow
def test_chunking_and_batching_do_not_change_results():
    docs, queries = make_case(700, 11, 50, 10, quantized=True)  # quantized: many ties across chunks
    index = InvertedIndex.build(docs, block_size=64)
    big = Searcher(index, max_memory_bytes=1 << 30)
    tiny = Searcher(index, max_memory_bytes=3_000)
    assert len(tiny._doc_chunks(3)) > 10  # really chunked
    expected = big.search(queries, k=25)
    for qb in (1, 3, None):
        got = tiny.search(queries, k=25, query_batch=qb)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_a_query_gets_the_same_bits_in_any_batch():
    """Continuous weights (float32 sums round): a query alone, in a batch of 3 and in one of 40 gets the same
    scores, bit for bit (the server batches whatever requests arrive together)."""
    docs, queries = make_case(2000, 40, 300, 12, quantized=False)
    searcher = Searcher(InvertedIndex.build(docs, block_size=64))
    expected = searcher.search(queries, k=20)
    for start, n in [(i, 1) for i in range(0, 40, 3)] + [(i, 3) for i in range(0, 37, 5)]:
        got = searcher.search(queries[start:start + n], k=20)
        assert torch.equal(got[0], expected[0][start:start + n]) and torch.equal(got[1], expected[1][start:start + n])


def test_repeated_runs_are_bit_identical():
    docs, queries = make_case(300, 8, 40, 11, quantized=False)
    searcher = Searcher(InvertedIndex.build(docs, block_size=32), max_memory_bytes=50_000)
    a, b = searcher.search(queries, k=30), searcher.search(queries, k=30)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_search_run_maps_docnos_best_first():
    docs, queries = make_case(80, 4, 30, 12, quantized=True)
    searcher = Searcher(InvertedIndex.build(docs, block_size=16))
    run = searcher.search_run(queries, k=6)
    scores, idx = searcher.search(queries, k=6)
    assert list(run) == queries.ids
    for b, qid in enumerate(queries.ids):
        hits = [(docs.ids[i], float(s)) for s, i in zip(scores[b].tolist(), idx[b].tolist()) if i >= 0]
        assert list(run[qid].items()) == hits


def test_search_run_deeper_than_the_collection_searches_only_its_documents(monkeypatch):
    """A run holds each document once, so search_run caps k at the index's documents: k = 10^12 gives the same
    run as k = n_docs instead of asking for [queries x 10^12] of padding."""
    docs, queries = make_case(50, 3, 30, 14, quantized=True)
    searcher = Searcher(InvertedIndex.build(docs, block_size=16))
    asked = []
    search = searcher.search
    monkeypatch.setattr(searcher, "search", lambda q, k, *a: asked.append(k) or search(q, k, *a))
    assert searcher.search_run(queries, k=10**12) == searcher.search_run(queries, k=len(docs))
    assert asked == [len(docs), len(docs)]
    with pytest.raises(ValueError, match="positive integer"):
        searcher.search_run(queries, k=0)


def test_encoder_metadata_is_checked():
    check_compatible(None, {"kind": "splade"})
    check_compatible({"kind": "splade", "max_length": 32}, {"kind": "splade", "max_length": 256})
    with pytest.raises(ValueError, match="model"):
        check_compatible({"kind": "splade", "model": "a"}, {"kind": "splade", "model": "b"})
    docs, queries = make_case(30, 2, 20, 13, quantized=True)
    searcher = Searcher(InvertedIndex.build(docs, block_size=8, metadata={"kind": "bm25", "vocab_hash": "x"}))
    with pytest.raises(ValueError, match="vocab_hash"):
        searcher.search(queries, k=3, query_metadata={"kind": "bm25", "vocab_hash": "y"})
    searcher.search(queries, k=3, query_metadata={"kind": "bm25", "vocab_hash": "x"})


def test_two_spellings_of_one_model_folder_are_one_encoder(tmp_path, monkeypatch):
    """An index encoded with ``models/m`` searched with the folder's absolute path (or ``./models/m``) is the same
    encoder; another folder is not."""
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    index_meta = {"kind": "splade", "model": "models/m"}
    for spelling in (str(tmp_path / "models" / "m"), "./models/m", "models/../models/m"):
        check_compatible({"kind": "splade", "model": spelling}, index_meta)
    with pytest.raises(ValueError, match="model"):
        check_compatible({"kind": "splade", "model": "models/other"}, index_meta)


def test_exact_topk_orders_ties_by_id():
    g = torch.Generator().manual_seed(int.from_bytes(np.random.bytes(2), "little"))
    B, n, k = 6, 300, 17
    scores = torch.randint(0, 5, (B, n), generator=g).float()  # heavy ties, zeros excluded
    ids = torch.randperm(10_000, generator=g)[:n]
    for kind in ("none", "shared", "per_row"):
        if kind == "none":
            s, i = exact_topk(scores, k)
            id_of = torch.arange(n).expand(B, n)
        elif kind == "shared":
            s, i = exact_topk(scores, k, ids)
            id_of = ids.expand(B, n)
        else:
            id_of = torch.stack([torch.randperm(10_000, generator=g)[:n] for _ in range(B)])
            s, i = exact_topk(scores, k, id_of)
        for b in range(B):
            ref = sorted((-scores[b, j].item(), id_of[b, j].item()) for j in range(n) if scores[b, j] > 0)[:k]
            assert i[b].tolist() == [r[1] for r in ref] + [-1] * (k - len(ref))
            assert s[b].tolist() == [-r[0] for r in ref] + [0.0] * (k - len(ref))
    s, i = exact_topk(torch.zeros(2, 0), 3)
    assert s.shape == (2, 3) and bool((i == -1).all())


def test_backend_dispatch(monkeypatch):
    docs, queries = make_case(40, 5, 20, 14, quantized=True)
    index = InvertedIndex.build(docs, block_size=8)
    assert Searcher(index, backend="auto").backend == "torch"  # CPU: the torch twin
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "triton", None)  # triton does not import
        with pytest.raises(RuntimeError, match="backend='gpu' needs triton"):
            Searcher(index, backend="gpu")
        assert Searcher(index, backend="auto").backend == "torch"
    searcher = Searcher(index, backend="gpu")   # the kernels, under TRITON_INTERPRET=1 (tests/conftest.py)
    assert searcher.backend == "gpu" and searcher.config.backend == "gpu"
    assert "query batches  3 of <= 2" in str(searcher.explain(queries, k=4, query_batch=2))
    got = searcher.search(queries, k=4, query_batch=2)
    ref = Searcher(index, backend="torch").search(queries, k=4)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])   # quantized: float32 sums are exact


def test_searcher_takes_only_an_inverted_index():
    """A ShardedIndex (or a folder) is opened with lsr.search.open_searcher, which picks the searcher."""
    with pytest.raises(TypeError, match="open_searcher"):
        Searcher("some/folder")


@pytest.mark.gpu
def test_cuda_torch_backend_matches_cpu_and_is_deterministic():
    docs, queries = make_case(5000, 64, 300, 15, quantized=False)
    index = InvertedIndex.build(docs, block_size=512)
    cpu = Searcher(index, backend="torch").search(queries, k=100)
    gpu_searcher = Searcher(index, device="cuda", backend="torch", max_memory_bytes=2_000_000)
    a, b = gpu_searcher.search(queries, k=100), gpu_searcher.search(queries, k=100)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    np.testing.assert_allclose(a[0].cpu().numpy(), cpu[0].numpy(), rtol=1e-6)
    ref_s, _ = reference_topk(queries, docs, 100)
    np.testing.assert_allclose(a[0].cpu().numpy(), ref_s, rtol=1e-6)
