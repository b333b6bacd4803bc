"""torch.distributed helpers shared by distributed search and encoding (launch with ``torchrun``).

gloo on CPUs, NCCL on GPUs; the rank's device is ``cuda:LOCAL_RANK`` modulo the visible GPUs, so several
ranks may share one GPU (a test of the multi-GPU code on one card: NCCL refuses that, so those ranks talk
through gloo, staging the small collective tensors in host memory).

Every collective waits at most ``LSR_DIST_TIMEOUT`` seconds (default 1800) for the other ranks: a rank that
hung (not one that died: torchrun's agent ends the job at once then) makes the others fail after that long
with one error naming the setting (``lsr.parallel.jobs.rank_job``), instead of waiting forever. The wait must cover the
longest stretch one rank works alone between two collectives (encoding its slice, building its partitions),
hence the long default; search-only jobs can set it to a minute or two. A rank that stopped (SIGSTOP, a frozen
host) is found sooner, by the heartbeat every rank runs from joining to leaving (``lsr.parallel.watchdog``,
``LSR_DIST_HEARTBEAT`` seconds, default 60); ``leave_distributed`` ends it, when it runs on this host, if this
rank leaves with an error.

The steps of a job (``agree``, ``broadcast_text``, ``built_on_rank0``) are plain steps outside a process group of
several ranks, as ``lsr.parallel.agreement.agreement`` is: a job is written once for one process and for W ranks
(``lsr.parallel.jobs``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lsr.utils.env import env_seconds

__all__ = ["DEFAULT_TIMEOUT_S", "TIMEOUT_ENV", "agree", "broadcast_text", "built_on_rank0", "collective_backend",
           "collective_timeout", "comm_device", "init_distributed", "is_distributed", "launch_rank", "leave_distributed",
           "rank_and_size", "rank_device"]

TIMEOUT_ENV = "LSR_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0

log = logging.getLogger(__name__)
_watch: dict[str, Any] = {"dog": None, "groups": 0}   # this process's heartbeat, and the groups it has joined


def is_distributed() -> bool:
    """Whether this process belongs to a torchrun job of more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def launch_rank() -> int:
    """This process's rank as torchrun set it (0 outside a torchrun job); readable before joining the process
    group and after leaving it, e.g. to let one rank report."""
    return int(os.environ.get("RANK", "0"))


def rank_and_size() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_backend(device: str) -> str:
    """"nccl" for one GPU per rank; "gloo" on CPUs and when ranks share a GPU (NCCL refuses two ranks on
    one device); ``LSR_DIST_BACKEND`` overrides."""
    if os.environ.get("LSR_DIST_BACKEND"):
        return os.environ["LSR_DIST_BACKEND"]
    if not str(device).startswith("cuda"):
        return "gloo"
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    return "nccl" if local_ranks <= torch.cuda.device_count() else "gloo"


def _local_gpu() -> torch.device:
    """This rank's GPU: ``LOCAL_RANK`` modulo the visible GPUs."""
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def rank_device(device: str) -> str:
    """The device this process works on, known before it joins the process group: under torchrun a CUDA
    ``device`` means this rank's GPU (the one ``init_distributed`` returns); otherwise ``device`` itself."""
    if is_distributed() and str(device).startswith("cuda"):
        return str(_local_gpu())
    return str(device)


def collective_timeout() -> float:
    """Seconds a collective waits for the other ranks: ``LSR_DIST_TIMEOUT``, default 1800 (torch's own)."""
    return env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)


def init_distributed(device: str) -> torch.device:
    """Join the process group torchrun describes (and start this rank's heartbeat) and return this rank's device."""
    from lsr.parallel.watchdog import heartbeat_timeout

    cuda = str(device).startswith("cuda")
    if cuda:
        dev = _local_gpu()
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        heartbeat = heartbeat_timeout()   # a bad setting fails before the join
        backend = collective_backend(device)
        kw: dict[str, Any] = {"device_id": dev} if backend == "nccl" else {}
        _watch["groups"] += 1   # every rank joins its job's groups in the same order: the same number on each
        timeout = timedelta(seconds=collective_timeout())
        store = _rank0_store(_watch["groups"], timeout)
        if store is not None:
            kw |= {"store": store, "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
        dist.init_process_group(backend, timeout=timeout, **kw)
        if heartbeat is not None and dist.get_world_size() > 1 and "MASTER_ADDR" in os.environ:
            from lsr.parallel.watchdog import Watchdog

            try:
                _watch["dog"] = Watchdog(dist.get_rank(), dist.get_world_size(), _watch["groups"], heartbeat)
            except Exception as e:  # noqa: BLE001 - the job runs on without it (the collective timeout still holds)
                log.warning("no heartbeat for this rank (%s: %s): a stopped rank is found by %s only",
                            type(e).__name__, e, TIMEOUT_ENV)
    return dev


def _rank0_store(generation: int, timeout: timedelta) -> Any:
    """Outside torchrun (ranks started with MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE, e.g. by
    torch.multiprocessing): rank 0's TCPStore for this process's ``generation``-th group, made here, or another
    rank's client of it; None under torchrun or without those variables (torch's env:// rendezvous then).

    Why: a process that joins its next group right after leaving one (``lsr search`` leaves its group when done)
    could reach rank 0's previous store while rank 0 has not closed it yet, and wait in it for ranks that never
    come. Rank 0 writes the generation into its new store; a client that finds another generation was connected
    to the old one, and connects again."""
    import time

    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env or not all(k in env for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")):
        return None   # (under torchrun its rendezvous makes the store, as it always has)
    host, port, rank, world = env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["RANK"]), int(env["WORLD_SIZE"])
    if rank == 0:
        # waits for every rank to connect, as torch's env:// store does (a rank that never comes times out here)
        store = dist.TCPStore(host, port, world, True, timeout=timeout, wait_for_workers=True)
        store.set("lsr/generation", str(generation))
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        store = dist.TCPStore(host, port, world, False, timeout=timeout)
        try:
            if store.get("lsr/generation").decode() == str(generation):
                return store
        except RuntimeError:   # the old store closed under the request: connect again
            pass
        del store
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0's store at {host}:{port} is still the one of an earlier group")
        time.sleep(0.05)


def leave_distributed(failed: bool = False) -> None:
    """Leave the process group ``init_distributed`` joined: stop the heartbeat (telling the others this rank
    left) and destroy the group. ``failed``: this rank leaves with an error, so its peers on this host that are
    stopped are ended first (nothing else would: a stopped process outlives torchrun)."""
    dog, _watch["dog"] = _watch["dog"], None
    if dog is not None:
        if failed:
            dog.end_stopped_peers()
        dog.leave()
    if dist.is_initialized():
        dist.destroy_process_group()


def comm_device() -> torch.device:
    """Where collective tensors live: this rank's GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _several_ranks() -> bool:
    return rank_and_size()[1] > 1


@contextmanager
def agree(what: str) -> Iterator[None]:
    """Run a step that may fail on some ranks: if it fails anywhere it fails everywhere (the failing
    rank raises its own error, the others say another rank failed) instead of leaving ranks waiting in
    a later collective. Also a barrier. Outside a process group of several ranks: the step alone."""
    if not _several_ranks():
        yield
        return
    error: BaseException | None = None
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised below, once the other ranks know
        error = e
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=comm_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if error is not None:
        raise error
    if int(flag):
        raise RuntimeError(f"another rank failed to {what} (its error says why)")


def _text_bytes(text: str | None, limit: int) -> bytes:
    data = (text or "").encode()
    if len(data) > limit:
        raise ValueError(f"text of {len(data)} bytes is longer than {limit}")
    return data


def broadcast_text(text: str | None, limit: int = 4096) -> str:
    """Rank 0's ``text`` (at most ``limit`` UTF-8 bytes) on every rank (a tensor, no pickling); in one process,
    ``text`` itself ("" for None)."""
    if not _several_ranks():
        return _text_bytes(text, limit).decode()
    buf = torch.zeros(limit + 1, dtype=torch.uint8, device=comm_device())
    if dist.get_rank() == 0:
        data = _text_bytes(text, limit)
        if data:  # (torch.frombuffer refuses an empty buffer)
            buf[1:1 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(buf, 0)
    return bytes(buf[1:].cpu().numpy()).rstrip(b"\0").decode()


def built_on_rank0(build: Callable[[], Any], load: Callable[[], Any], what: str, *, rank0_only: bool = True) -> Any:
    """``build()`` on rank 0 (on every rank when not ``rank0_only``); the other ranks then ``load()`` what
    rank 0 saved, e.g. BM25 statistics fitted once. Each step fails every rank when one fails. In one process:
    ``build()``."""
    with agree(f"build {what}"):
        built = build() if rank_and_size()[0] == 0 or not rank0_only else None
    with agree(f"load {what}"):
        return built if built is not None else load()
