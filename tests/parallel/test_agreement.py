"""The agreement at the start of every distributed job (``lsr.parallel.agreement``): ranks given different
inputs (an index of the same shape with other weights, a plain index against a sharded one, a truncated
corpus, other vectors, another output folder, another config value) all end, before any work, with one line
naming the rank, the file and what differs; ranks given identical copies at different paths run as before.
2 gloo ranks spawned as torchrun starts them, each with its own command line (as each host of a job has)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lsr.cli import main
from lsr.index import InvertedIndex
from lsr.index.sharded import ShardedIndex
from lsr.sparse import SparseVectors
from lsr.storage.shards import write_vectors
from lsr.testing import free_port, join_or_kill, random_collection, write_scifact_slice

WORLD, TIMEOUT_S = 2, 300
SEARCH = ["--queries", "{q}", "--k", "10", "--device", "cpu", "--backend", "torch"]


def _rank(rank: int, jobs: list[tuple[int, list[list[str]], str]]) -> None:
    torch.set_num_threads(1)
    for port, argvs, log in jobs:  # one process group per job; each rank its own command line
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                          LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argvs[rank])
        Path(f"{log}-r{rank}.json").write_text(json.dumps({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}))


def _spawn(tmp: Path, jobs: dict[str, list[list[str]]]) -> dict[str, list[dict]]:
    """Run the jobs one after another on WORLD spawned ranks; each job's per-rank {rc, stdout, stderr}."""
    runs = [(free_port(), argvs, str(tmp / f"log-{name}")) for name, argvs in jobs.items()]
    ctx = mp.spawn(_rank, args=(runs,), nprocs=WORLD, join=False)
    if not join_or_kill(ctx, TIMEOUT_S):
        pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s (a hang)")
    return {name: [json.loads(Path(f"{tmp}/log-{name}-r{r}.json").read_text()) for r in range(WORLD)] for name in jobs}


def _refused(logs: list[dict]) -> str:
    """The one error line every rank printed (the same on each), exit code 1."""
    assert [g["rc"] for g in logs] == [1, 1], logs
    lines = [[ln for ln in g["stderr"].splitlines() if ln.strip()] for g in logs]
    assert all(len(ln) == 1 for ln in lines), lines
    assert lines[0] == lines[1], lines
    return lines[0][0]


def _other_weights(docs: SparseVectors) -> SparseVectors:
    """The same documents and terms (the same shape: counts, postings, vocabulary), other weights."""
    return SparseVectors(docs.indptr, docs.indices, docs.values * 2, docs.ids, docs.vocab_size)


@pytest.mark.slow
def test_ranks_with_other_index_weights_or_layout_are_refused(tmp_path):
    docs = random_collection(40, 30, 1, density=0.2)
    InvertedIndex.build(docs, block_size=16).save(tmp_path / "a")
    InvertedIndex.build(docs, block_size=16).save(tmp_path / "a-copy")   # the same index, another folder
    InvertedIndex.build(_other_weights(docs), block_size=16).save(tmp_path / "b")
    ShardedIndex.build(docs, 2, tmp_path / "c", block_size=16)
    write_vectors(tmp_path / "q", random_collection(5, 30, 2, density=0.3))
    search = [a.format(q=tmp_path / "q") for a in SEARCH]

    def on(index0: str, index1: str, name: str) -> list[list[str]]:
        return [["search", "--index", str(tmp_path / i), *search, "--out", str(tmp_path / f"{name}.trec")]
                for i in (index0, index1)]

    knob = on("a", "a", "knob")
    knob[1] += ["--set", "search.triton.span=64"]   # another tuning knob on one rank (a host's own command line)
    logs = _spawn(tmp_path, {"weights": on("a", "b", "weights"), "layout": on("a", "c", "layout"),
                             "copies": on("a", "a-copy", "copies"), "knob": knob})
    line = _refused(logs["weights"])
    assert line.startswith(f"lsr search: error: the ranks disagree: rank 1's index {tmp_path / 'b'} differs from "
                           f"rank 0's {tmp_path / 'a'}: "), line
    assert ".npy" in line and "give every rank the same index" in line, line   # a weight file's checksum
    line = _refused(logs["layout"])
    assert "rank 1's index" in line and "layout a sharded index of 2 partitions on rank 1, a plain index on rank 0" \
        in line, line
    line = _refused(logs["knob"])
    assert "the search config" in line and "triton" in line, line
    assert not (tmp_path / "weights.trec").exists() and not (tmp_path / "layout.trec").exists()
    assert not (tmp_path / "knob.trec").exists()
    assert [g["rc"] for g in logs["copies"]] == [0, 0], logs["copies"]   # identical copies: the job runs
    assert main(["search", "--index", str(tmp_path / "a"), *search, "--out", str(tmp_path / "one.trec")]) == 0
    assert (tmp_path / "copies.trec").read_bytes() == (tmp_path / "one.trec").read_bytes()


@pytest.mark.slow
def test_ranks_with_other_documents_outputs_vectors_or_config_are_refused(tmp_path, data_dir):
    write_scifact_slice(tmp_path / "ds", data_dir)
    (tmp_path / "short").mkdir()   # rank 1's local copy of the corpus lost its last documents
    for name in ("queries.jsonl", "qrels"):
        os.symlink(tmp_path / "ds" / name, tmp_path / "short" / name)
    corpus = (tmp_path / "ds" / "corpus.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "short" / "corpus.jsonl").write_text("".join(corpus[:-5]))
    cpu = ["--device", "cpu"]
    encode = [["encode", "--dataset", str(tmp_path / ds), "--out", str(tmp_path / "vec"), "--shard-rows", "12", *cpu]
              for ds in ("ds", "short")]
    (tmp_path / "job.yaml").write_text(f"name: agree\ndata:\n  dataset: {tmp_path / 'ds'}\nencoder:\n  kind: bm25\n"
                                       "evaluation:\n  metrics: [nDCG@10]\n")
    run = ["run", str(tmp_path / "job.yaml"), "--set", "device=cpu", "--set", "search.backend=torch"]
    docs = random_collection(30, 20, 3, density=0.2)
    write_vectors(tmp_path / "v2", docs)
    write_vectors(tmp_path / "v3", _other_weights(docs))
    index = [["index", "--vectors", str(tmp_path / v), "--out", str(tmp_path / "idx"), "--partitions", "2", *cpu]
             for v in ("v2", "v3")]
    splade = data_dir / "models" / "splade-tiny"
    (tmp_path / "train.yaml").write_text(f"encoder:\n  model: {splade}\ndata:\n  dataset: {tmp_path / 'ds'}\n"
                                         f"negatives:\n  count: 0\noutput: {tmp_path / 'trained'}\ndevice: cpu\n")
    train = [["train", str(tmp_path / "train.yaml"), *extra] for extra in ([], ["--set", "optim.lr=0.001"])]
    logs = _spawn(tmp_path, {
        "encode": encode,
        "run-docs": [[*run, "--set", f"output={tmp_path / 'out'}", "--set", f"data.dataset={tmp_path / ds}"]
                     for ds in ("ds", "short")],
        "run-output": [[*run, "--set", f"output={tmp_path / out}"] for out in ("out0", "out1")],
        "index": index, "train": train})
    line = _refused(logs["encode"])
    assert line.startswith(f"lsr encode: error: the ranks disagree: rank 1's documents {tmp_path / 'short'}"), line
    assert "give every rank the same documents" in line, line
    assert not (tmp_path / "vec").exists()   # refused before any work: not even the BM25 fit
    line = _refused(logs["run-docs"])
    assert line.startswith("lsr run: error: the ranks disagree: rank 1's documents"), line
    assert not (tmp_path / "out").exists()
    line = _refused(logs["run-output"])
    assert line == (f"lsr run: error: the ranks disagree: rank 1's output folder {tmp_path / 'out1'} differs from "
                    f"rank 0's {tmp_path / 'out0'}; give every rank the same output folder (on several hosts, a folder "
                    "they all share)"), line
    assert not (tmp_path / "out0").exists() and not (tmp_path / "out1").exists()
    line = _refused(logs["index"])
    assert f"rank 1's vectors {tmp_path / 'v3'} differ from rank 0's {tmp_path / 'v2'}: manifest.json" in line, line
    assert not (tmp_path / "idx").exists()
    line = _refused(logs["train"])
    assert line.startswith("lsr train: error: the ranks disagree: rank 1's config differs from rank 0's: optim.lr "
                           "0.001 on rank 1,"), line
    assert not (tmp_path / "trained").exists()
