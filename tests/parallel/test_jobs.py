"""``rank_job``, the one frame of a distributed job (lsr.parallel.jobs): the same job code in one process and on 2
gloo ranks (spawned as torchrun starts them); the agreement comes before any step; a step that fails on one rank
fails on both with one line each; the process group is left at the end, or kept when the caller had joined it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lsr.parallel.agreement import settings_part
from lsr.parallel.jobs import RankJob, rank_job
from lsr.testing import free_port, join_or_kill

WORLD, TIMEOUT_S = 2, 120


def _job(job: RankJob, fail_on: int | None) -> dict:
    """A small job: agree, a step every rank runs, a value rank 0 decides, a step that fails on rank ``fail_on``."""
    with job.agreement("read the settings") as parts:
        parts.append(settings_part("settings", {"k": 10}))
    with job.step("count"):
        mine = job.rank + 1
    chosen = job.on_lead("choose", lambda: "rank 0's choice")
    sent = job.from_lead(chosen)
    built = job.built_on_lead(lambda: "built", lambda: "loaded", "the model")
    error = None
    try:
        with job.step("check the counts"):
            if job.rank == fail_on:
                raise ValueError(f"rank {job.rank} broke")
    except Exception as e:  # noqa: BLE001 - the test records what each rank raised
        error = f"{type(e).__name__}: {e}"
    return {"rank": job.rank, "world": job.world, "device": str(job.device), "mine": mine, "chosen": chosen,
            "sent": sent, "built": built, "error": error}


def test_one_process_runs_the_job_as_plain_steps(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with rank_job("cpu") as job:
        with pytest.raises(RuntimeError, match="agrees on its inputs before any work: call job.agreement"):
            job.step("load")  # no work before the agreement
        got = _job(job, fail_on=0)
    assert got == {"rank": 0, "world": 1, "device": "cpu", "mine": 1, "chosen": "rank 0's choice",
                   "sent": "rank 0's choice", "built": "built", "error": "ValueError: rank 0 broke"}
    assert not torch.distributed.is_initialized()


def _rank(rank: int, ports: tuple[int, int], tmp: str) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    from lsr.parallel.topology import init_distributed, leave_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    with rank_job("cpu") as job:  # joined here: left at the end
        got = _job(job, fail_on=1)
    got["left"] = not dist.is_initialized()
    os.environ["MASTER_PORT"] = str(ports[1])
    init_distributed("cpu")  # a group the caller joined: the job runs in it and leaves it to the caller
    try:
        with rank_job("cpu") as job, job.agreement("read the settings") as parts:
            parts.append(settings_part("settings", {"rank": rank}))  # differs on rank 1: refused on both
    except Exception as e:  # noqa: BLE001 - recorded for the test
        got["refused"] = f"{type(e).__name__}: {e}"
    got["kept"] = dist.is_initialized()
    leave_distributed()
    Path(tmp, f"r{rank}.json").write_text(json.dumps(got))


@pytest.mark.slow
def test_two_ranks_run_the_same_job_and_fail_together(tmp_path):
    ctx = mp.spawn(_rank, args=((free_port(), free_port()), str(tmp_path)), nprocs=WORLD, join=False)
    if not join_or_kill(ctx, TIMEOUT_S):
        pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s (a hang)")
    logs = [json.loads(Path(tmp_path, f"r{r}.json").read_text()) for r in range(WORLD)]
    for r, got in enumerate(logs):
        assert (got["rank"], got["world"], got["mine"], got["left"], got["kept"]) == (r, WORLD, r + 1, True, True)
        assert got["sent"] == "rank 0's choice" and got["built"] == ("built" if r == 0 else "loaded")
        assert got["chosen"] == ("rank 0's choice" if r == 0 else None)
    # the failing rank raises its own error, the other names the step another rank failed
    assert logs[1]["error"] == "ValueError: rank 1 broke"
    assert logs[0]["error"] == "RuntimeError: another rank failed to check the counts (its error says why)"
    # the second job's agreement: the same one-line refusal on both ranks, before any work
    refused = {got["refused"] for got in logs}
    assert len(refused) == 1 and next(iter(refused)).startswith("RanksDisagree: the ranks disagree: rank 1's settings")
