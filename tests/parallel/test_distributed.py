"""Distributed search and encoding on CPU processes (gloo), 2 and 3 ranks spawned with
torch.multiprocessing: results equal single-process search / encoding bit for bit."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from lsr.index import InvertedIndex
from lsr.index.sharded import ShardedIndex
from lsr.search import Searcher
from lsr.storage.shards import read_vectors, write_vectors
from lsr.testing import free_port, random_collection

N_DOCS, VOCAB, KS = 70, 40, (3, 25, 80)   # k = 25 and 80 exceed a partition's 23-35 docs; 80 > all docs
ENCODE = {"batch_size": 4, "shard_rows": 10, "sort_window": 4, "show_progress_bar": False}  # 4 does not divide 10


def _texts(data_dir: Path, n: int) -> list[tuple[str, str]]:
    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, n)]
    return [(r["_id"], f"{r['title']} {r['text']}"[: 40 + 13 * i]) for i, r in enumerate(rows)]


def _out_of_memory(*args, **kwargs):
    raise RuntimeError("out of memory (simulated)")


def _worker(rank: int, world: int, port: int, tmp: str, splade: str | None, data_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from lsr.cli import main
    from lsr.encode.bm25.lexical import LexicalEncoder
    from lsr.parallel.encode import encode_corpus_distributed
    from lsr.parallel.search import DistributedSearcher
    from lsr.parallel.topology import init_distributed

    t = Path(tmp)
    init_distributed("cpu")
    _search_all(t, rank, ("p_world", "p_more", "p_one"))  # P = W; P > W; one partition replicated on every rank
    searcher = DistributedSearcher(t / "p_more", "cpu", backend="torch")
    with pytest.raises(RuntimeError, match="another rank failed") if rank else pytest.raises(ValueError, match="vocab"):
        bad = random_collection(3, VOCAB + 1, 9) if rank == 0 else None
        searcher.search(bad, 5)
    if rank == 1:  # a failure inside one rank's local search ends every rank, none waits in the gather
        searcher.local.search = _out_of_memory
    with pytest.raises(RuntimeError, match="out of memory" if rank == 1 else "another rank failed to search"):
        searcher.search(read_vectors(t / "q") if rank == 0 else None, 5)
    docs = _texts(Path(data_dir), 37)
    encode_corpus_distributed(LexicalEncoder.load(t / "bm25"), docs, t / "enc-bm25", len(docs), **ENCODE)
    if splade:
        from lsr.encode.splade.encoder import SpladeEncoder

        enc = SpladeEncoder.from_pretrained(splade, device="cpu", max_length_doc=48)
        encode_corpus_distributed(enc, docs, t / "enc-splade", len(docs), **ENCODE)
    # every rank builds its partitions of the vectors, rank 0 publishes the folder
    assert main(["index", "--vectors", str(t / "enc-bm25"), "--out", str(t / "idx-dist"), "--partitions", "3",
                 "--device", "cpu", "--block-size", "16"]) == 0
    assert main(["search", "--index", str(t / "p_world"), "--queries", str(t / "q"), "--k", "25", "--out",
                 str(t / "cli.trec"), "--device", "cpu", "--backend", "torch"]) == 0
    # every output this test checks is written; the rank ends without the interpreter's teardown, where a rank
    # of the world-2 case (transformers loaded) has aborted in clean-clone CI runs ("terminate called without an
    # active exception", after its process group was destroyed; not reproduced in isolation). The teardown is
    # not what this test checks; the abort is an open item of the scaling docs
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _search_all(t: Path, rank: int, names: tuple[str, ...]) -> None:
    """Every k of KS over each index folder in ``names``, saved per rank; 5-query chunks (13 queries: the
    slices of the last chunk are uneven) and, as "<name>-one", a batch of a single query (empty slices)."""
    from lsr.parallel.search import DistributedSearcher

    queries = read_vectors(t / "q") if rank == 0 else None
    for name in names:
        searcher = DistributedSearcher(t / name, "cpu", backend="torch")
        for k in KS:
            s, i = searcher.search(queries, k, query_batch=5)
            np.save(t / f"{name}-k{k}-r{rank}-s.npy", s.numpy())
            np.save(t / f"{name}-k{k}-r{rank}-i.npy", i.numpy())
        s, i = searcher.search(queries[2:3] if rank == 0 else None, KS[1])
        np.save(t / f"{name}-one-r{rank}-s.npy", s.numpy())
        np.save(t / f"{name}-one-r{rank}-i.npy", i.numpy())


def _assert_all_equal(t: Path, names: tuple[str, ...], world: int, docs, queries) -> None:
    searcher = Searcher(InvertedIndex.build(docs, block_size=16), backend="torch")
    for k, name, r in itertools.product(KS, names, range(world)):
        want_s, want_i = searcher.search(queries, k)
        s = torch.from_numpy(np.load(t / f"{name}-k{k}-r{r}-s.npy"))
        i = torch.from_numpy(np.load(t / f"{name}-k{k}-r{r}-i.npy"))
        assert torch.equal(s, want_s) and torch.equal(i, want_i), (name, k, r)
    want_s, want_i = searcher.search(queries[2:3], KS[1])
    for name, r in itertools.product(names, range(world)):
        assert torch.equal(torch.from_numpy(np.load(t / f"{name}-one-r{r}-s.npy")), want_s), (name, r)
        assert torch.equal(torch.from_numpy(np.load(t / f"{name}-one-r{r}-i.npy")), want_i), (name, r)


def _single_encodings(tmp: Path, data_dir: Path, splade: str | None) -> dict[str, Path]:
    from lsr.encode.bm25.lexical import LexicalEncoder
    from lsr.encode.corpus import encode_corpus

    docs = _texts(data_dir, 37)
    bm25 = LexicalEncoder().fit(text for _, text in docs)
    bm25.save(tmp / "bm25")
    out = {"bm25": tmp / "single-bm25"}
    encode_corpus(bm25, docs, out["bm25"], **ENCODE)
    if splade:
        from lsr.encode.splade.encoder import SpladeEncoder

        out["splade"] = tmp / "single-splade"
        encode_corpus(SpladeEncoder.from_pretrained(splade, device="cpu", max_length_doc=48), docs, out["splade"],
                      **ENCODE)
    return out


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_distributed_equals_single_process(tmp_path, data_dir, world):
    docs = random_collection(N_DOCS, VOCAB, 11, density=0.15, quantized=True)  # many exact ties
    queries = random_collection(13, VOCAB, 12, density=0.2, quantized=True)
    write_vectors(tmp_path / "q", queries)
    ShardedIndex.build(docs, world, tmp_path / "p_world", block_size=16)
    ShardedIndex.build(docs, world + 2, tmp_path / "p_more", block_size=16)
    ShardedIndex.build(docs, 1, tmp_path / "p_one", block_size=16)
    splade = None
    if world == 2:  # the tiny SPLADE model once (transformers in every rank is the slow part)
        pytest.importorskip("transformers")
        from lsr.testing import save_tiny_mlm

        splade = str(save_tiny_mlm("roberta", tmp_path / "roberta", data_dir))
    single = _single_encodings(tmp_path, data_dir, splade)

    mp.spawn(_worker, args=(world, free_port(), str(tmp_path), splade, str(data_dir)), nprocs=world)

    _assert_all_equal(tmp_path, ("p_world", "p_more", "p_one"), world, docs, queries)
    want_i = Searcher(InvertedIndex.build(docs, block_size=16), backend="torch").search(queries, KS[-1])[1]
    assert (want_i[:, -1] == -1).any() and (want_i >= 0).sum() > 25  # padding and full rows both occur
    for kind, path in single.items():
        got = read_vectors(tmp_path / f"enc-{kind}")
        assert got.equal(read_vectors(path)), kind
        # the folder one process writes, file for file (names, checksums, manifest), no rank folders left
        folder = tmp_path / f"enc-{kind}"
        assert json.loads((folder / "manifest.json").read_text()) == json.loads((path / "manifest.json").read_text())
        assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in path.iterdir())
        assert [s["rows"] for s in json.loads((folder / "manifest.json").read_text())["shards"]] == [10, 10, 10, 7]
    ShardedIndex.load(tmp_path / "p_world")  # untouched by the searches
    ShardedIndex.build(single["bm25"], 3, tmp_path / "idx-single", block_size=16)
    for f in ("manifest.json", "max_scores.npy", "part-00002/doc_ids.npy", "part-00001/meta.json"):
        assert (tmp_path / "idx-dist" / f).read_bytes() == (tmp_path / "idx-single" / f).read_bytes(), f
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    from lsr.cli import main

    assert main(["search", "--index", str(tmp_path / "p_world"), "--queries", str(tmp_path / "q"), "--k", "25",
                 "--out", str(tmp_path / "one.trec"), "--device", "cpu", "--backend", "torch"]) == 0
    assert (tmp_path / "cli.trec").read_text() == (tmp_path / "one.trec").read_text()


def _replica_worker(rank: int, world: int, port: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from lsr.parallel.search import DistributedSearcher
    from lsr.parallel.topology import init_distributed

    init_distributed("cpu")
    _search_all(Path(tmp), rank, ("p_two", "p_one"))
    with pytest.raises(ValueError, match="3 partitions cannot be shared by 4 ranks"):
        DistributedSearcher(Path(tmp) / "p_three", "cpu", backend="torch")
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_replica_groups_equal_single_process(tmp_path):
    """4 ranks over 2 partitions (two replica groups, each searching half of every batch) and over 1
    (every rank a whole copy, a quarter of each batch): the single-process results, bit for bit."""
    from lsr.parallel.plan import rank_role

    assert [rank_role(2, r, 4) for r in range(4)] == [([0], 0, 2), ([1], 0, 2), ([0], 1, 2), ([1], 1, 2)]
    assert rank_role(5, 1, 2) == ([1, 3], 0, 1)
    docs = random_collection(N_DOCS, VOCAB, 11, density=0.15, quantized=True)
    queries = random_collection(13, VOCAB, 12, density=0.2, quantized=True)
    write_vectors(tmp_path / "q", queries)
    for name, n_p in (("p_one", 1), ("p_two", 2), ("p_three", 3)):
        ShardedIndex.build(docs, n_p, tmp_path / name, block_size=16)
    mp.spawn(_replica_worker, args=(4, free_port(), str(tmp_path)), nprocs=4)
    _assert_all_equal(tmp_path, ("p_two", "p_one"), 4, docs, queries)


def _gpu_worker(rank: int, world: int, port: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    from lsr.parallel.search import DistributedSearcher
    from lsr.parallel.topology import init_distributed

    t = Path(tmp)
    dev = init_distributed("cuda")  # both ranks on one GPU: gloo
    searcher = DistributedSearcher(t / "idx", dev)
    s, i = searcher.search(read_vectors(t / "q") if rank == 0 else None, 1000, query_batch=32)
    np.save(t / f"r{rank}-s.npy", s.cpu().numpy())
    np.save(t / f"r{rank}-i.npy", i.cpu().numpy())
    torch.distributed.destroy_process_group()


@pytest.mark.gpu
def test_two_ranks_sharing_one_gpu(tmp_path):
    from lsr.benchmarks.synth import synth_docs, synth_queries

    docs, queries = synth_docs(200_000, device="cuda"), synth_queries(70, device="cuda")
    ShardedIndex.build(docs, 2, tmp_path / "idx", device="cuda")
    write_vectors(tmp_path / "q", queries)
    want_s, want_i = Searcher(InvertedIndex.build(docs)).search(queries, 1000)
    mp.spawn(_gpu_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    for r in range(2):
        assert np.array_equal(np.load(tmp_path / f"r{r}-s.npy"), want_s.cpu().numpy())
        assert np.array_equal(np.load(tmp_path / f"r{r}-i.npy"), want_i.cpu().numpy())
