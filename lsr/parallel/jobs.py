"""The one frame of every distributed job: ``rank_job``, the same code in one process and on every rank.

``lsr encode``, ``lsr index --partitions``, ``lsr search``, ``lsr run`` and ``lsr train`` run under torchrun as::

    with rank_job(device) as job:                         # join the group, heartbeat; leave at the end
        with job.agreement("read the index") as parts:     # first: what every rank uses, compared once
            parts += index_parts(path)
        with job.step("load its partitions"):              # fails on every rank when it fails on one
            mine = load_rank_index(path, job.rank, job.world)
        job.on_lead("write the run", lambda: write(...))   # rank 0 alone, the others wait

What the frame does, so that no job does it its own way:

* **the process group**: joined on entry under torchrun (``lsr.parallel.topology.init_distributed``: gloo on
  CPUs, NCCL on GPUs, this rank's device) unless the caller had joined it, and left on exit only if joined here.
  Outside torchrun the job is one process, rank 0 of 1, and every step is the plain step: a job is written once.
* **the heartbeat** (``lsr.parallel.watchdog``) runs from joining to leaving; a rank that leaves with an error
  first ends its stopped peers on this host (nothing else would: a stopped process outlives torchrun).
* **the agreement before any work** (``lsr.parallel.agreement``): ``job.step`` and ``job.on_lead`` before
  ``job.agreement`` are a programming error (RuntimeError), so no job starts work on inputs the ranks have not
  compared.
* **one-line failures**: a step that fails on one rank raises its own error there and "another rank failed to
  STEP (its error says why)" on the others; a collective (or the joining) that waited ``LSR_DIST_TIMEOUT``
  seconds leaves the job as one RuntimeError naming the setting. ``lsr.cli`` prints either as its one line.

Library collectives that a job calls (``encode_corpus_distributed``, ``build_on_ranks``, ``search_batch``) take
the process group as they find it (``lsr.parallel.topology.rank_and_size``, ``agree``), so they run inside any
job, or in a group a caller joined by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from lsr.parallel.agreement import Part, agreement
from lsr.parallel.topology import (
    TIMEOUT_ENV,
    agree,
    broadcast_text,
    built_on_rank0,
    collective_timeout,
    init_distributed,
    is_distributed,
    leave_distributed,
)

__all__ = ["RankJob", "rank_job"]

T = TypeVar("T")


@dataclass
class RankJob:
    """This process's place in a job: its ``rank`` of ``world`` ranks and the ``device`` it works on (rank 0 of 1
    in one process); the steps below coordinate the ranks (each is the plain step in one process)."""

    rank: int
    world: int
    device: torch.device
    agreed: bool = False

    @classmethod
    def alone(cls, device: str | torch.device) -> RankJob:
        """The job of one process outside torchrun (nothing to join, nothing to compare)."""
        return cls(0, 1, torch.device(device))

    @property
    def lead(self) -> bool:
        """Rank 0: the one that decides, writes the shared outputs and reports."""
        return self.rank == 0

    @contextmanager
    def agreement(self, what: str) -> Iterator[list[Part]]:
        """The job's agreement (``lsr.parallel.agreement.agreement``): the body appends this rank's parts (and may
        check what must hold before any work); on exit every rank's parts are compared with rank 0's."""
        with agreement(what) as parts:
            yield parts
        self.agreed = True

    def _check_agreed(self, what: str) -> None:
        if not self.agreed:
            raise RuntimeError(f"a distributed job agrees on its inputs before any work: call job.agreement(...) "
                               f"before the step {what!r}")

    def step(self, what: str) -> AbstractContextManager[None]:
        """A step of the job (``agree``): if it fails on one rank, it fails on all; also a barrier."""
        self._check_agreed(what)
        return agree(what)

    def on_lead(self, what: str, fn: Callable[[], T]) -> T | None:
        """``fn()`` on rank 0 while the others wait (None there); a failure on rank 0 fails every rank."""
        with self.step(what):
            return fn() if self.lead else None

    def from_lead(self, text: str | None, limit: int = 4096) -> str:
        """Rank 0's ``text`` on every rank (``broadcast_text``), e.g. a path rank 0 chose or its result as JSON."""
        self._check_agreed("send rank 0's text")
        return broadcast_text(text, limit)

    def built_on_lead(self, build: Callable[[], Any], load: Callable[[], Any], what: str, *,
                      lead_only: bool = True) -> Any:
        """``build()`` on rank 0 (every rank when not ``lead_only``), then ``load()`` on the others
        (``built_on_rank0``)."""
        self._check_agreed(f"build {what}")
        return built_on_rank0(build, load, what, rank0_only=lead_only)


def _timed_out(e: BaseException) -> bool:
    """Whether ``e`` is a collective or the rendezvous store giving up waiting for another rank."""
    store_error = getattr(dist, "DistStoreError", ())
    return isinstance(e, store_error) or (isinstance(e, RuntimeError) and "timed out" in str(e).lower())


def _timeout_error() -> RuntimeError:
    t = collective_timeout()
    return RuntimeError(f"another rank did not answer within {t:g} s ({TIMEOUT_ENV}={t:g}): it stopped or hung; "
                        f"if it was only busy for longer, raise {TIMEOUT_ENV} (seconds)")


@contextmanager
def rank_job(device: str | torch.device) -> Iterator[RankJob]:
    """The job on this process: under torchrun (or in a process group the caller joined) this rank of the group,
    joined on entry unless the caller had (``device``: "cuda" means this rank's GPU) and left on exit only if
    joined here, ending stopped peers on this host first when the job leaves with an error; outside torchrun
    ``RankJob.alone(device)``. A collective that waited ``LSR_DIST_TIMEOUT`` seconds leaves as one RuntimeError
    naming the setting."""
    if not (is_distributed() or (dist.is_available() and dist.is_initialized())):
        yield RankJob.alone(device)
        return
    joined = not dist.is_initialized()
    try:
        dev = init_distributed(str(device))
        failed = True
        try:
            yield RankJob(dist.get_rank(), dist.get_world_size(), dev)
            failed = False
        finally:
            if joined:
                leave_distributed(failed)
    except Exception as e:
        if _timed_out(e):
            raise _timeout_error() from e
        raise
