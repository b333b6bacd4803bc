"""Distributed corpus encoding (``lsr.parallel.encode``): units of one window handed out through claim files,
shards assembled by whichever rank finishes them, resume after a killed job with another world size; the
output folder is the single-process one byte for byte."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lsr.encode.bm25.lexical import LexicalEncoder
from lsr.encode.corpus import DISTRIBUTED_WORK, encode_corpus, window_bounds
from lsr.parallel.encode import encode_corpus_distributed
from lsr.parallel.encode_units import EncodeWork, UnitWriter, claimed_windows
from lsr.testing import free_port

ENCODE = {"batch_size": 64, "shard_rows": 10, "sort_window": 4, "show_progress_bar": False}  # 4 does not divide 10
REPO = Path(__file__).resolve().parents[2]


def _texts(data_dir: Path, n: int) -> list[tuple[str, str]]:
    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, n)]
    return [(r["_id"], f"{r['title']} {r['text']}"[: 40 + 13 * i]) for i, r in enumerate(rows)]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class _Recording:
    """A fitted BM25 encoder that records the ids of every batch it encodes."""

    def __init__(self, inner: LexicalEncoder) -> None:
        self.inner, self.batches = inner, []
        self.vocab_size = inner.vocab_size

    def describe(self):
        return self.inner.describe()

    def encode_document(self, texts, ids=None):
        self.batches.append(tuple(ids))
        return self.inner.encode_document(texts, ids=ids)


def _plan(bm25: LexicalEncoder, n: int) -> dict:
    return {"n_docs": n, "shard_rows": ENCODE["shard_rows"], "sort_window": ENCODE["sort_window"], "first_window": 4096,
            "vocab_size": bm25.vocab_size, "metadata": bm25.describe(), "origin": None}


def test_two_ranks_take_alternate_units_and_the_folder_is_the_single_process_one(tmp_path, data_dir):
    docs = _texts(data_dir, 37)
    bm25 = LexicalEncoder().fit(text for _, text in docs)
    single = _Recording(bm25)
    encode_corpus(single, docs, tmp_path / "single", **ENCODE)
    units = window_bounds(37, 10, 4)
    assert units == [(0, 4), (4, 8), (8, 10), (10, 12), (12, 16), (16, 20), (20, 24), (24, 28), (28, 30), (30, 32),
                     (32, 36), (36, 37)]
    assert single.batches == [tuple(d for d, _ in docs[a:b]) for a, b in units]  # a batch per window here
    out = tmp_path / "out"
    work = EncodeWork(out, _plan(bm25, 37))
    work.start_job()
    ranks = [UnitWriter(work), UnitWriter(work)]  # two ranks, each reading the stream forward
    streams = [claimed_windows(work, docs, w) for w in ranks]
    taken: list[list[int]] = [[], []]
    for turn in itertools.cycle((0, 1, 1, 0)):  # uneven speeds: a rank takes the next unit nobody holds
        window = next(streams[turn], None)
        if window is None:
            break
        taken[turn].append(ranks[turn].claimed[-1])
        ranks[turn].add(bm25.encode_document(window[1], ids=window[0]))
    assert sorted(taken[0] + taken[1]) == list(range(len(units))) and min(map(len, taken)) >= 5
    assert all(work.shard_done(k) for k in range(4)) and not list((work.root / "units").iterdir())
    work.publish()
    assert _files(out) == _files(tmp_path / "single")  # shards, names, manifest: byte for byte


def test_an_interrupted_job_resumes_in_one_process(tmp_path, data_dir):
    """Two units and one shard finished, one unit claimed by a rank that died: one process finishes the job
    (encoding only the rest) and the folder is the single-process one; other settings are refused."""
    docs = _texts(data_dir, 37)
    bm25 = LexicalEncoder().fit(text for _, text in docs)
    encode_corpus(bm25, docs, tmp_path / "single", **ENCODE)
    out = tmp_path / "out"
    work = EncodeWork(out, _plan(bm25, 37))
    work.start_job()
    writer = UnitWriter(work)
    stream = claimed_windows(work, docs, writer)
    for _ in range(4):  # units 0-3: shard 0 complete, unit 3 of shard 1 on disk
        ids, texts = next(stream)
        writer.add(bm25.encode_document(texts, ids=ids))
    next(stream)  # unit 4 claimed, never written (the rank was killed)
    assert work.shard_done(0) and not work.shard_done(1)
    with pytest.raises(ValueError, match="holds an unfinished distributed encoding"):
        encode_corpus(bm25, docs, out, **ENCODE)
    with pytest.raises(ValueError, match="other settings .*shard_rows"):
        encode_corpus_distributed(bm25, docs, out, 37, **{**ENCODE, "shard_rows": 20})
    rec = _Recording(bm25)
    manifest = encode_corpus_distributed(rec, docs, out, 37, **ENCODE)
    assert rec.batches == [tuple(d for d, _ in docs[a:b]) for a, b in window_bounds(37, 10, 4)[4:]]
    assert manifest["complete"] and not (out / DISTRIBUTED_WORK).exists()
    assert _files(out) == _files(tmp_path / "single")
    assert encode_corpus_distributed(rec, docs, out, 37, **ENCODE) == manifest  # complete: left as it is
    assert len(rec.batches) == 8


def test_empty_corpus_and_missing_count(tmp_path, data_dir):
    bm25 = LexicalEncoder().fit(text for _, text in _texts(data_dir, 5))
    encode_corpus(bm25, [], tmp_path / "single", **ENCODE)
    (tmp_path / "out" / DISTRIBUTED_WORK).mkdir(parents=True)
    encode_corpus_distributed(bm25, [], tmp_path / "out", 0, **ENCODE)
    assert _files(tmp_path / "out") == _files(tmp_path / "single")
    (tmp_path / "x" / DISTRIBUTED_WORK).mkdir(parents=True)
    with pytest.raises(ValueError, match="n_docs=None"):
        encode_corpus_distributed(bm25, [], tmp_path / "x", None, **ENCODE)


def _children(pid: int) -> dict[int, int]:
    """{rank: pid} of the processes ``pid`` started with a RANK variable (torchrun's workers)."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                env = dict(v.split("=", 1) for v in (entry / "environ").read_bytes().decode().split("\0") if "=" in v)
                ranks[int(env["RANK"])] = int(entry.name)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return ranks


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _torchrun(nproc: int, argv: list[str], **env: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), "--monitor-interval", "0.2", "-m", "lsr", *argv]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **env)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _shards_done(folder: Path, n: int, job: subprocess.Popen, timeout_s: float = 120) -> None:
    """Wait until ``job``'s encoding into ``folder`` has written ``n`` shards (it is mid-way)."""
    shards, deadline = folder / DISTRIBUTED_WORK / "shards", time.monotonic() + timeout_s
    while not (shards.is_dir() and len(list(shards.glob("*.json"))) >= n):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.05)


def _scifact(folder: Path, data_dir: Path, n: int) -> str:
    """A dataset folder of SciFact's first ``n`` documents (past its 5,183, the corpus again under new ids)."""
    folder.mkdir()
    lines = (data_dir / "scifact" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    rows = lines[:n]
    for i in range(len(lines), n):   # (a job that must still be at work seconds after its first shards)
        doc = json.loads(lines[i % len(lines)])
        rows.append(json.dumps(dict(doc, _id=f"{doc['_id']}-{i // len(lines)}")))
    (folder / "corpus.jsonl").write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "a query"}\n')
    return str(folder)


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_and_one_process_resumes_it(tmp_path, data_dir):
    """torchrun, 2 gloo ranks: rank 1 is SIGKILLed mid-encode; every rank is gone within a bounded time and
    torchrun reports that one failure; one process then finishes the folder, byte for byte the folder a
    single process writes from scratch."""
    from lsr.cli import main

    ds = _scifact(tmp_path / "ds", data_dir, 8000)   # a job of seconds: rank 1 is killed at work, not after
    args = ["encode", "--dataset", ds, "--shard-rows", "20", "--device", "cpu"]
    job = _torchrun(2, [*args, "--out", str(tmp_path / "dist")])
    _shards_done(tmp_path / "dist", 5, job)
    ranks = _children(job.pid)
    assert sorted(ranks) == [0, 1]
    os.kill(ranks[1], signal.SIGKILL)
    killed = time.monotonic()
    _, err = job.communicate(timeout=60)
    assert job.returncode != 0 and time.monotonic() - killed < 30
    assert not any(_alive(p) for p in ranks.values())
    assert err.count("exitcode  : -9") == 1 and "Signal 9 (SIGKILL)" in err, err[-3000:]
    assert not (tmp_path / "dist" / "manifest.json").exists()
    assert main([*args, "--out", str(tmp_path / "dist")]) == 0  # another world size: one process
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert _files(tmp_path / "dist") == _files(tmp_path / "one")


@pytest.mark.slow
def test_three_ranks_finish_a_killed_single_process_encoding(tmp_path, data_dir):
    """A single-process ``lsr encode`` killed mid-way is taken over by ``torchrun --nproc-per-node 3`` (its
    finished shards kept): the folder one process writes."""
    from lsr.cli import main

    ds = _scifact(tmp_path / "ds", data_dir, 1000)
    args = ["encode", "--dataset", ds, "--shard-rows", "20", "--device", "cpu"]
    cmd = [sys.executable, "-m", "lsr", *args, "--out", str(tmp_path / "dist")]
    one = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(REPO)), stderr=subprocess.DEVNULL)
    manifest, deadline = tmp_path / "dist" / "manifest.json", time.monotonic() + 120
    while not (manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 5):
        assert one.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    one.kill()
    one.wait()
    kept = json.loads(manifest.read_text())["shards"]
    assert not json.loads(manifest.read_text())["complete"]
    job = _torchrun(3, [*args, "--out", str(tmp_path / "dist")])
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err[-3000:]
    assert out.endswith("(1000 documents in 50 shards)\n")
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert _files(tmp_path / "dist") == _files(tmp_path / "one")
    assert kept == json.loads(manifest.read_text())["shards"][:len(kept)]


@pytest.mark.slow
def test_a_second_torchrun_encode_into_a_busy_folder_is_refused(tmp_path, data_dir):
    """Two torchrun encodes into one folder: the second is refused with one line naming the first's rank 0
    (pid and host) before it touches the folder; the first finishes undisturbed (the folder one process
    writes, no lock or working folder left)."""
    from lsr.cli import main

    ds = _scifact(tmp_path / "ds", data_dir, 8000)   # a job of seconds: both ranks are stopped at work
    args = ["encode", "--dataset", ds, "--shard-rows", "20", "--device", "cpu"]
    first, ranks = _torchrun(2, [*args, "--out", str(tmp_path / "dist")]), {}
    try:
        _shards_done(tmp_path / "dist", 2, first)
        ranks = _children(first.pid)
        for pid in ranks.values():  # the first job is paused (not ended) while the second starts: however fast
            os.kill(pid, signal.SIGSTOP)  # it is, it is still at work when the second one looks
        second = _torchrun(2, [*args, "--out", str(tmp_path / "dist")])
        _, err = second.communicate(timeout=180)
        for pid in ranks.values():
            os.kill(pid, signal.SIGCONT)
        out, first_err = first.communicate(timeout=300)
    finally:
        first.kill()
        for pid in ranks.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert second.returncode != 0
    errors = [ln for ln in err.splitlines() if ln.startswith("lsr encode: error: ")]
    assert len(errors) == 2, err[-3000:]   # one line per rank
    assert any(f"{tmp_path / 'dist'} is being written by another job (pid {ranks[0]} on host " in e for e in errors), errors
    assert any("another rank failed to lock the output folder" in e for e in errors), errors
    assert first.returncode == 0, first_err[-3000:]
    assert out.endswith("(8000 documents in 400 shards)\n")
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert _files(tmp_path / "dist") == _files(tmp_path / "one")   # (rglob: no lock, no .lsr-encode left)


def test_a_single_process_encode_into_a_busy_folder_is_refused_before_the_fit(tmp_path, data_dir, capsys):
    """A one-process ``lsr encode`` (BM25, fitted here) into a folder another job holds is refused with one line
    before its fit saves ``OUT/encoder`` over the other job's."""
    from lsr.cli import main

    ds, out = _scifact(tmp_path / "ds", data_dir, 50), tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from lsr.parallel.joblock import FolderLock; "
                               "FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)", str(out)],
                              env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc = main(["encode", "--dataset", ds, "--encoder", "bm25", "--device", "cpu", "--out", str(out)])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "is being written by another job" in err[0], err
    assert not (out / "encoder").exists()
