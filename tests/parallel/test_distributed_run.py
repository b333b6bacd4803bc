"""``lsr run`` under 2 gloo ranks (CPU processes spawned as torchrun would start them): the run files and
metrics equal a single-process ``lsr run`` byte for byte, and a failure on one rank fails every rank
with a one-line error instead of a hang."""

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
from lsr.testing import free_port, join_or_kill, write_scifact_slice

WORLD, TIMEOUT_S = 2, 240
# shard_rows 12 puts the 47 docs in 4 shards (2 per rank); block_size 16 gives every partition several blocks
COMMON = ["--set", "device=cpu", "--set", "encoder.shard_rows=12", "--set", "index.block_size=16",
          "--set", "search.k=20", "--set", "search.backend=torch"]


def _job(tmp: Path, name: str, *extra: str) -> list[str]:
    return ["run", str(tmp / "job.yaml"), "--set", f"output={tmp / name}", *COMMON, *extra]


def _run_rank(rank: int, port: int, argv: list[str], log: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    log.write_text(json.dumps({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}))


def _worker(rank: int, jobs: list[tuple[int, list[str], str]]) -> None:
    torch.set_num_threads(1)
    for port, argv, log in jobs:  # one process group per job (lsr run leaves it when done)
        _run_rank(rank, port, argv, Path(f"{log}-r{rank}.json"))


def _spawn(jobs: list[tuple[list[str], str]]) -> None:
    """Run the jobs one after another on WORLD spawned ranks; fail (killing them) if they hang."""
    ctx = mp.spawn(_worker, args=([(free_port(), argv, log) for argv, log in jobs],), nprocs=WORLD, join=False)
    if not join_or_kill(ctx, TIMEOUT_S):
        pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s (a hang)")


def _logs(prefix: Path) -> list[dict]:
    return [json.loads(Path(f"{prefix}-r{r}.json").read_text()) for r in range(WORLD)]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_lsr_run_on_two_ranks_equals_one_process(tmp_path, data_dir):
    write_scifact_slice(tmp_path / "scifact", data_dir)
    (tmp_path / "job.yaml").write_text(f"name: dist\ndata:\n  dataset: {tmp_path / 'scifact'}\nencoder:\n  kind: bm25\n"
                                       "evaluation:\n  metrics: [nDCG@10, R@20]\n")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("not lsr's")
    pytest.importorskip("transformers")
    from lsr.testing import save_tiny_mlm

    model = save_tiny_mlm("roberta", tmp_path / "roberta", data_dir)
    splade = ("--set", "encoder.kind=splade", "--set", f"encoder.model={model}", "--set", "encoder.max_length_doc=48",
              "--set", "encoder.batch_size=5")  # 5 does not divide a rank's 24 documents
    _spawn([(_job(tmp_path, "dist"), str(tmp_path / "log-dist")),
            (_job(tmp_path, "dist-splade", *splade), str(tmp_path / "log-splade")),
            (_job(tmp_path, "foreign"), str(tmp_path / "log-foreign")),  # rank 0 refuses the folder
            # rank 0 fails after encoding and indexing: the queries file is missing
            (_job(tmp_path, "midway", "--set", f"inputs.query_vectors={tmp_path / 'none.tsv'}"), str(tmp_path / "log-mid")),
            (_job(tmp_path, "bad", "--set", "search.k=0"), str(tmp_path / "log-bad"))])  # every rank refuses

    logs = _logs(tmp_path / "log-dist")
    assert [g["rc"] for g in logs] == [0, 0], logs
    assert "nDCG@10" in logs[0]["stdout"] and logs[1]["stdout"] == ""  # rank 0 alone reports
    assert main(_job(tmp_path, "one-sharded", "--set", "index.partitions=2")) == 0
    assert main(_job(tmp_path, "one-plain")) == 0
    dist_out = tmp_path / "dist"
    for single in ("one-sharded", "one-plain"):
        for name in ("run.trec", "run.msmarco.tsv"):
            assert (dist_out / name).read_bytes() == (tmp_path / single / name).read_bytes(), (single, name)
        got, want = (json.loads((d / "metrics.json").read_text()) for d in (dist_out, tmp_path / single))
        assert got["metrics"] == want["metrics"] and got["n_docs"] == want["n_docs"] > 40
    # the encoded vectors, the BM25 fit and the sharded index are the single-process job's, file for file
    assert _files(dist_out / "doc_vectors") == _files(tmp_path / "one-sharded" / "doc_vectors")
    assert len(json.loads((dist_out / "doc_vectors" / "manifest.json").read_text())["shards"]) == 4
    assert _files(dist_out / "encoder") == _files(tmp_path / "one-sharded" / "encoder")
    assert _files(dist_out / "index") == _files(tmp_path / "one-sharded" / "index")
    assert "partitions: 2" in (dist_out / "config.yaml").read_text()  # one per rank by default

    assert [g["rc"] for g in _logs(tmp_path / "log-splade")] == [0, 0]
    assert main(_job(tmp_path, "one-splade", *splade, "--set", "index.partitions=2")) == 0
    assert len((tmp_path / "dist-splade" / "run.trec").read_text().splitlines()) > 6 * 10
    for name in ("run.trec", "metrics.json", "doc_vectors", "index"):
        got, want = tmp_path / "dist-splade" / name, tmp_path / "one-splade" / name
        if name == "metrics.json":
            assert json.loads(got.read_text())["metrics"] == json.loads(want.read_text())["metrics"]
        else:
            assert (_files(got) if got.is_dir() else got.read_bytes()) == (
                _files(want) if want.is_dir() else want.read_bytes()), name

    for prefix, rc, rank0_says, rank1_says in (
            ("log-foreign", 1, "was not written by lsr run", "another rank failed to claim the output folder"),
            ("log-mid", 1, "none.tsv", "another rank failed to encode the queries"),
            ("log-bad", 2, "config.search.k", "config.search.k")):
        logs = _logs(tmp_path / prefix)
        assert [g["rc"] for g in logs] == [rc, rc], logs
        errors = [[ln for ln in g["stderr"].splitlines() if "error" in ln] for g in logs]  # no progress bars
        assert all(len(e) == 1 and e[0].startswith("lsr run: error: ") for e in errors), errors
        errors = [e[0] for e in errors]
        assert rank0_says in errors[0] and rank1_says in errors[1], errors
    assert not (tmp_path / "midway" / "run.trec").exists()
    assert sorted(p.name for p in (tmp_path / "foreign").iterdir()) == ["notes.txt"]  # untouched


@pytest.mark.gpu
def test_lsr_run_on_two_ranks_sharing_one_gpu(tmp_path, data_dir):
    """The shipped SPLADE model, Triton search paths: 2 ranks on one GPU (gloo) == one process."""
    write_scifact_slice(tmp_path / "scifact", data_dir, n_other=400)
    (tmp_path / "job.yaml").write_text(f"name: gpu\ndata:\n  dataset: {tmp_path / 'scifact'}\nencoder:\n  kind: splade\n"
                                       f"  model: {data_dir / 'models' / 'splade-tiny'}\n")
    on_gpu = ("--set", "device=cuda", "--set", "search.backend=auto", "--set", "search.k=100")
    _spawn([(_job(tmp_path, "dist", *on_gpu), str(tmp_path / "log"))])
    assert [g["rc"] for g in _logs(tmp_path / "log")] == [0, 0], _logs(tmp_path / "log")
    assert main(_job(tmp_path, "one", *on_gpu, "--set", "index.partitions=2")) == 0
    assert main(_job(tmp_path, "plain", *on_gpu)) == 0
    for single in ("one", "plain"):
        assert (tmp_path / "dist" / "run.trec").read_bytes() == (tmp_path / single / "run.trec").read_bytes(), single
    assert _files(tmp_path / "dist" / "doc_vectors") == _files(tmp_path / "one" / "doc_vectors")


@pytest.mark.slow
def test_lsr_encode_index_search_on_two_ranks_equal_one_process(tmp_path, data_dir):
    """The three commands under torchrun: ``lsr encode`` (BM25 fitted on rank 0, loaded by the other),
    ``lsr index --partitions`` and ``lsr search`` (rank 0 encodes the queries and writes the run) give the
    single-process vectors, index and run, file for file; rank 0 alone reports encode and search."""
    write_scifact_slice(tmp_path / "scifact", data_dir)
    ds, cpu = str(tmp_path / "scifact"), ["--device", "cpu"]

    def commands(tag: str) -> list[list[str]]:
        vec, idx = tmp_path / f"{tag}-vec", tmp_path / f"{tag}-idx"
        return [["encode", "--dataset", ds, "--out", str(vec), "--shard-rows", "12", *cpu],
                ["index", "--vectors", str(vec), "--out", str(idx), "--partitions", "2", "--block-size", "16", *cpu],
                ["search", "--index", str(idx), "--queries", ds, "--model", str(vec / "encoder"), "--k", "20",
                 "--backend", "torch", "--out", str(tmp_path / f"{tag}.trec"), *cpu]]

    _spawn([(argv, str(tmp_path / f"log-{n}")) for n, argv in enumerate(commands("dist"))])
    for single in commands("one"):
        assert main(single) == 0
    encode, index, search = (_logs(tmp_path / f"log-{n}") for n in range(3))
    assert [g["rc"] for g in encode + index + search] == [0] * 6, (encode, index, search)
    assert encode[0]["stdout"] == f"document vectors in {tmp_path / 'dist-vec'} (47 documents in 4 shards)\n"
    assert encode[1]["stdout"] == search[1]["stdout"] == ""
    assert search[0]["stdout"].startswith("searched 6 queries (k=20) -> ")
    for name in ("vec", "idx"):
        assert _files(tmp_path / f"dist-{name}") == _files(tmp_path / f"one-{name}"), name
    assert (tmp_path / "dist.trec").read_bytes() == (tmp_path / "one.trec").read_bytes()
