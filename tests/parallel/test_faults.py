"""Faults in a distributed job: a stopped rank is found by the heartbeat within ``LSR_DIST_HEARTBEAT`` seconds
and ended with the job, or ends the others after ``LSR_DIST_TIMEOUT`` (the shorter), with one line naming the
setting, and outlives no rank; a killed rank ends the torchrun job at once (its agent stops the other ranks);
a bad setting is one line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from lsr.cli import main
from lsr.index import InvertedIndex
from lsr.storage.shards import write_vectors
from lsr.testing import free_port, random_collection
from tests.conftest import REPO

TIMEOUT_S, HEARTBEAT_S = 3, 5


def _data(tmp: Path) -> None:
    InvertedIndex.build(random_collection(40, 30, 1, density=0.2), block_size=16).save(tmp / "idx")
    write_vectors(tmp / "q", random_collection(5, 30, 2, density=0.3))


def _search_argv(tmp: Path, out: str) -> list[str]:
    return ["search", "--index", str(tmp / "idx"), "--queries", str(tmp / "q"), "--out", str(tmp / out),
            "--device", "cpu", "--backend", "torch"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def _stalled_rank(rank: int, port: int, tmp: str) -> None:
    """Rank 1 joins the process group and stops itself (as `kill -STOP` would); rank 0 searches."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LSR_DIST_TIMEOUT=str(TIMEOUT_S))
    from lsr.parallel.jobs import rank_job

    if rank == 1:
        with rank_job("cpu"):
            os.kill(os.getpid(), signal.SIGSTOP)
        return
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(_search_argv(Path(tmp), "lib.trec"))
    (Path(tmp) / "rank0.txt").write_text(f"{rc}\n{err.getvalue()}")


@pytest.mark.slow
def test_a_stopped_rank_ends_the_others_after_the_timeout(tmp_path):
    _data(tmp_path)
    # stopped before it joins: rank 0 gives up waiting for it in the rendezvous
    env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", LSR_DIST_TIMEOUT=str(TIMEOUT_S))
    cmd = [sys.executable, "-m", "lsr", *_search_argv(tmp_path, "cli.trec")]
    stopped = subprocess.Popen(cmd, env=env | {"RANK": "1", "LOCAL_RANK": "1"}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    stopped.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        lead = subprocess.run(cmd, env=env | {"RANK": "0", "LOCAL_RANK": "0"}, capture_output=True, text=True,
                              timeout=120)
        took = time.monotonic() - start
    finally:
        stopped.kill()
        stopped.wait()
    assert lead.returncode == 1 and lead.stderr.count("\n") == 1, lead.stderr
    assert f"did not answer within {TIMEOUT_S} s (LSR_DIST_TIMEOUT={TIMEOUT_S})" in lead.stderr
    assert took < 90 and not (tmp_path / "cli.trec").exists()
    # stopped after it joined: rank 0's first collective gives up
    ctx = mp.spawn(_stalled_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=False)
    try:
        ctx.processes[0].join(timeout=120)
        assert ctx.processes[0].exitcode == 0, "rank 0 did not end"
        ctx.processes[1].join(timeout=30)
        stalled = ctx.processes[1].exitcode
    finally:
        for p in ctx.processes:
            p.kill()
            p.join()
    rc, err = (tmp_path / "rank0.txt").read_text().split("\n", 1)
    assert rc == "1" and err.count("\n") == 1 and f"LSR_DIST_TIMEOUT={TIMEOUT_S}" in err, err
    assert err.startswith("lsr search: error: another rank did not answer within")
    assert stalled == -signal.SIGKILL   # the stopped rank does not outlive the job: rank 0 ended it as it left


@pytest.mark.parametrize(("name", "says"), [("LSR_DIST_TIMEOUT", "is not a positive number of seconds"),
                                            ("LSR_DIST_HEARTBEAT", "is not a number of seconds (0 turns")])
def test_a_bad_timeout_setting_is_one_line(tmp_path, monkeypatch, capsys, name, says):
    _data(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(name, "soon")
    assert main(_search_argv(tmp_path, "x.trec")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name}='soon' {says}" in err, err


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _rank_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e[5:].decode() for e in env if e.startswith(b"RANK=")), None)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
def test_a_killed_rank_ends_the_torchrun_job(tmp_path):
    """SIGKILL on one rank: torchrun's agent stops the other rank and exits non-zero within seconds, its
    report naming the signal; no run file is written."""
    _data(tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "lsr", *_search_argv(tmp_path, "run.trec")]
    job = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, victim = time.monotonic() + 60, None
        while victim is None and time.monotonic() < deadline and job.poll() is None:
            victim = next((c for c in _children(job.pid) if _rank_of(c) == "1"), None)
            time.sleep(0.05)
        assert victim is not None, "rank 1 never started"
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        out, _ = job.communicate(timeout=120)
        took = time.monotonic() - start
    finally:
        job.kill()
    assert job.returncode != 0 and took < 60, (job.returncode, took)
    assert "SIGKILL" in out and "rank" in out, out[-2000:]
    assert not (tmp_path / "run.trec").exists()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
def test_a_stopped_rank_is_found_by_the_heartbeat_and_no_rank_outlives_the_job(tmp_path, data_dir):
    """torchrun, 2 gloo ranks encoding: rank 1 is SIGSTOPped mid-job. Within seconds of LSR_DIST_HEARTBEAT (not
    after LSR_DIST_TIMEOUT) the job ends non-zero with one line naming the stopped rank, and no rank is left,
    running or stopped; nothing is published."""
    from tests.parallel.test_distributed_encode import _alive, _children, _scifact, _shards_done, _torchrun

    ds = _scifact(tmp_path / "ds", data_dir, 20000)   # a job of seconds: rank 1 is stopped at work, not after
    job = _torchrun(2, ["encode", "--dataset", ds, "--shard-rows", "20", "--device", "cpu", "--out",
                        str(tmp_path / "vec")], LSR_DIST_HEARTBEAT=str(HEARTBEAT_S), LSR_DIST_TIMEOUT="900")
    ranks: dict[int, int] = {}
    try:
        _shards_done(tmp_path / "vec", 3, job)
        ranks = _children(job.pid)
        os.kill(ranks[1], signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            _, err = job.communicate(timeout=120)
        except subprocess.TimeoutExpired as e:   # say where it stands: which rank still runs, in which state
            states = {r: _state(pid) for r, pid in ranks.items()}
            tail = (e.stderr or b"").decode(errors="replace")[-2000:].replace("\r", "\n")
            pytest.fail(f"no end 120 s after the stop; rank states {states}, torchrun {_state(job.pid)}; stderr:\n{tail}")
        took = time.monotonic() - stopped
    finally:
        job.kill()
        for pid in ranks.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert job.returncode != 0 and took < HEARTBEAT_S + 45, (job.returncode, took)
    errors = [ln for ln in err.splitlines() if ln.startswith("lsr encode: error: ")]
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith(f"lsr encode: error: rank 1 (pid {ranks[1]} on host "), errors
    assert f"sent no heartbeat for {HEARTBEAT_S} s: it is stopped (e.g. SIGSTOP) or hung" in errors[0], errors
    assert not [r for r, pid in ranks.items() if _alive(pid)]   # none left running, none left stopped
    assert not (tmp_path / "vec" / "manifest.json").exists()


def _state(pid: int) -> str:
    """A process's state letter from /proc (R running, S sleeping, T stopped, Z zombie), or "gone"."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
