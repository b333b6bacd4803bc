"""lsr.benchmarks.synth: seeded, calibrated synthetic SPLADE-like collections (CPU, small sizes)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lsr.benchmarks.synth import (
    SynthSpec,
    load_npz,
    save_npz,
    synth_docs,
    synth_queries,
    synth_stats,
)

SPEC = SynthSpec(block_rows=4096)  # small generator blocks keep the CPU tests fast


@pytest.fixture(scope="module")
def collection():
    return synth_docs(12_000, SPEC, "cpu"), synth_queries(300, SPEC, "cpu")


@pytest.mark.slow
def test_calibrated_statistics(collection):
    docs, queries = collection
    st = synth_stats(docs, queries)
    assert 122 <= st["doc_nnz_mean"] <= 132          # ~127 terms per document
    assert 44 <= st["query_nnz_mean"] <= 50          # 44-50 terms per query
    assert 0.45 <= st["max_df_frac"] <= 0.60         # the most frequent term in ~52% of the docs
    assert 1.8 <= st["touched_per_query_over_n"] <= 2.6   # ~2.2 N postings touched per query
    assert 0.40 <= st["doc_w_mean"] <= 0.50 and 0.24 <= st["doc_w_median"] <= 0.32
    assert 0.52 <= st["query_w_mean"] <= 0.68 and 0.28 <= st["query_w_median"] <= 0.40


def test_valid_csr(collection):
    for v in collection:
        v.validate()  # unique ascending terms per row, weights > 0 and finite, ids unique
        assert v.vocab_size == SPEC.vocab_size
        lo, hi = (torch.tensor(x, dtype=torch.float32) for x in (SPEC.w_min, SPEC.w_max))  # float32 bounds
        assert bool(v.values.min() >= lo) and bool(v.values.max() <= hi)
        assert int(v.lengths.min()) >= 1


@pytest.mark.slow
def test_seeded_and_prefix_stable():
    a = synth_docs(5000, SPEC, "cpu")
    b = synth_docs(5000, SPEC, "cpu")
    assert a.equal(b), "same seed, same device: identical vectors"
    longer = synth_docs(9000, SPEC, "cpu")
    assert longer[:5000].equal(a), "the first N docs do not depend on the collection size"
    other = synth_docs(5000, replace(SPEC, seed=1), "cpu")
    assert not torch.equal(other.indptr, a.indptr)


def test_npz_roundtrip(tmp_path, collection):
    docs, queries = collection
    path = tmp_path / "vectors.npz"
    save_npz(str(path), docs[:50], queries[:7])
    d2, q2 = load_npz(str(path))
    for got, want in ((d2, docs[:50]), (q2, queries[:7])):
        assert torch.equal(got.indptr, want.indptr) and torch.equal(got.indices, want.indices)
        assert torch.equal(got.values, want.values) and got.vocab_size == want.vocab_size


@pytest.mark.gpu
def test_gpu_generation_matches_statistics():
    docs, queries = synth_docs(200_000, device="cuda"), synth_queries(500, device="cuda")
    st = synth_stats(docs, queries)
    assert 122 <= st["doc_nnz_mean"] <= 132 and 44 <= st["query_nnz_mean"] <= 50
    assert 0.45 <= st["max_df_frac"] <= 0.60 and 1.8 <= st["touched_per_query_over_n"] <= 2.6


@pytest.mark.slow
def test_ranking_from_real_queries_makes_them_touch_as_much_as_on_ms_marco(data_dir):
    from lsr.benchmarks.synth import ranking_from_queries
    from lsr.interop import read_anserini_queries

    real = read_anserini_queries(data_dir / "msmarco-passage" / "splade-encoded-queries" /
                                 "topics.msmarco-passage.dev-subset.splade-pp-ed.tsv.gz",
                                 data_dir / "bert-base-uncased" / "vocab.txt")
    real = real[torch.arange(0, len(real), 7)]  # ~1,000 queries keep it quick
    ranking = ranking_from_queries(real)
    assert torch.equal(torch.sort(ranking).values, torch.arange(real.vocab_size))
    assert torch.equal(ranking, ranking_from_queries(real))  # seeded
    docs = synth_docs(4096, SPEC, "cpu", term_ranking=ranking)
    shuffled = synth_docs(4096, SPEC, "cpu")
    assert 1.7 <= synth_stats(docs, real)["touched_per_query_over_n"] <= 2.8   # MS MARCO: ~2.2 N
    assert synth_stats(shuffled, real)["touched_per_query_over_n"] < 0.4       # the id permutation: ~0.18 N
    assert synth_stats(docs, synth_queries(100, SPEC, "cpu", term_ranking=ranking))["touched_per_query_over_n"] > 1.5
    with pytest.raises(ValueError, match="permutation"):
        synth_docs(10, SPEC, "cpu", term_ranking=torch.zeros(real.vocab_size, dtype=torch.long))
