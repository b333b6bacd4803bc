"""ShardedSearcher (lsr.search.sharded) over a sharded index: results equal to the unsharded index bit for bit
(torch backend; the Triton backend under TRITON_INTERPRET=1), resident and streamed, through open_searcher, the
CLI and ``lsr run``."""

from __future__ import annotations

import pytest
import torch

from lsr.cli import main
from lsr.index import InvertedIndex
from lsr.index.sharded import ShardedIndex, is_sharded
from lsr.search import Searcher, ShardedSearcher, open_searcher
from lsr.storage.shards import write_vectors
from lsr.testing import random_collection
from tests.conftest import DEV


def _collection(n=90, vocab=50, seed=3):
    docs = random_collection(n, vocab, seed, density=0.15, quantized=True)  # many exact ties
    queries = random_collection(12, vocab, seed + 100, density=0.2, quantized=True)
    return docs, queries


@pytest.mark.parametrize("n_parts,k", [(1, 10), (3, 10), (4, 40), (7, 5)])
def test_sharded_equals_single_bit_for_bit(tmp_path, n_parts, k):
    docs, queries = _collection()
    write_vectors(tmp_path / "v", docs, {"kind": "test"}, shard_rows=11)
    path = ShardedIndex.build(tmp_path / "v", n_parts, tmp_path / "idx", block_size=16, workers=2)
    assert is_sharded(path)
    sharded = ShardedIndex.load(path)
    assert sharded.docnos == docs.ids and sharded.metadata == {"kind": "test"}
    single = InvertedIndex.build(docs, block_size=16)
    want = Searcher(single, backend="torch").search(queries, k)
    for stream in (False, True):
        got = ShardedSearcher(sharded, backend="torch", stream=stream).search(queries, k, query_batch=5)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # k larger than any partition (40 > 90 / 4): padding and cross-partition ties merge exactly
    assert (want[1] >= 0).sum() > 0


@pytest.mark.skipif(DEV == "cpu" and not __import__("os").environ.get("TRITON_INTERPRET"), reason="no Triton")
def test_triton_backend_sharded_equals_single(tmp_path):
    # partitions with smaller term maxima than the collection would pick other fixed-point scales
    docs = random_collection(60, 24, 5, density=0.2)
    queries = random_collection(6, 24, 6, density=0.3)
    ShardedIndex.build(docs, 3, tmp_path / "idx", block_size=8)
    sharded = ShardedIndex.load(tmp_path / "idx", device=DEV)
    want = Searcher(InvertedIndex.build(docs, device=DEV, block_size=8), backend="gpu").search(queries, 7)
    got = ShardedSearcher(sharded, backend="gpu").search(queries, 7)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_searcher_of_a_sharded_index_and_in_memory_build(tmp_path):
    docs, queries = _collection()
    ShardedIndex.build(docs, 4, tmp_path / "idx", block_size=16)
    loaded = ShardedIndex.load(tmp_path / "idx")
    memory = ShardedIndex.from_vectors(docs, 4, block_size=16)
    assert memory.doc_starts == loaded.doc_starts and memory.docnos == loaded.docnos
    want = Searcher(InvertedIndex.build(docs, block_size=16), backend="torch").search(queries, 30)
    for index in (loaded, memory):
        searcher = open_searcher(index, backend="torch")
        assert isinstance(searcher, ShardedSearcher)
        got = searcher.search(queries, 30)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    run = open_searcher(memory, backend="torch").search_run(queries, 5)
    assert list(run) == queries.ids and all(d in docs.ids for hits in run.values() for d in hits)
    only = ShardedIndex.from_vectors(docs, 4, partitions=[2])
    assert [p is None for p in only.partitions] == [True, True, False, True]
    assert torch.equal(only.partitions[2].max_scores, loaded.partitions[2].max_scores)


@pytest.mark.gpu
def test_gpu_streamed_and_resident_equal_single():
    from lsr.benchmarks.synth import synth_docs, synth_queries

    docs = synth_docs(300_000, device="cuda")
    queries = synth_queries(64, device="cuda")
    want = Searcher(InvertedIndex.build(docs)).search(queries, 1000)
    sharded = ShardedIndex.from_vectors(docs, 3, device="cuda")
    for stream in (False, True):
        searcher = ShardedSearcher(sharded, "cuda", stream=stream)
        assert searcher.stream == stream and searcher.backend == "gpu"
        got = searcher.search(queries, 1000, query_batch=20)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.slow
def test_lsr_run_with_partitions_equals_one_index(tmp_path):
    from tests.conftest import REPO

    out = tmp_path / "job"
    config = str(REPO / "configs" / "scifact-bm25.yaml")
    assert main(["run", config, "--set", f"output={out}", "--set", "device=cpu"]) == 0
    single = (out / "run.trec").read_text()
    # same output folder: the vectors and the BM25 fit are reused, the index is replaced by a sharded one
    assert main(["run", config, "--set", f"output={out}", "--set", "device=cpu", "--set", "index.partitions=3"]) == 0
    assert is_sharded(out / "index") and (out / "run.trec").read_text() == single
    assert main(["run", config, "--set", "index.partitions=0"]) == 2


def test_sharded_search_defaults_to_the_config_s_k():
    """``k`` left out: the config's ``k``, as ``Searcher.search`` (``lsr run``'s search.k reaches both)."""
    from lsr.index.sharded import ShardedIndex
    from lsr.search import SearchConfig
    from lsr.search.sharded import ShardedSearcher
    from lsr.testing import random_dense_rows, seeded_generator

    gen = seeded_generator()
    docs = random_dense_rows(40, 20, 0.3, gen, quantized=True)
    queries = random_dense_rows(3, 20, 0.3, gen, quantized=True)
    index = ShardedIndex.from_vectors(docs, 2, block_size=64)
    scores, idx = ShardedSearcher(index, "cpu", config=SearchConfig(k=7)).search(queries)
    assert scores.shape == idx.shape == (3, 7)
