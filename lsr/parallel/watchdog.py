"""Heartbeats between the ranks of a job: a rank that stops (SIGSTOP, a frozen host) or hangs is found within
``LSR_DIST_HEARTBEAT`` seconds (default 60), and no rank of a job is left running or stopped when it ends.

Why: a stopped rank never fails, it only stops answering, so without this the others wait in their next
collective for ``LSR_DIST_TIMEOUT`` (1800 s by default: it must cover the longest stretch one rank works
alone), and the stopped process outlives the job.

Every rank of a process group joined by ``lsr.parallel.topology.init_distributed`` runs two daemon threads on
its own connection to the job's TCP store (torchrun's agent store, or rank 0's without torchrun):

* the *beat* thread adds 1 to the rank's counter every ``interval`` seconds (T / 10, at most 2 s) and reads
  every other rank's counter in one request;
* the *judge* thread declares a rank stopped when its counter has not moved for T seconds (a rank that left
  the group normally says so and is not judged), and the store stopped when one request of the beat thread
  has waited T seconds. Then it prints one line (``lsr <command>: error: rank R (pid P on host H) sent no
  heartbeat for T s ...``), ends the stopped rank when it runs on this host (SIGKILL, after checking it is
  the same process: pid and start time), and ends this process with exit code 1: the main thread may be
  blocked inside a collective that only the collective timeout would end.

A thread of a busy rank still beats (Python hands the GIL over every few ms), so only a process that does not
run at all, or holds the GIL for T seconds, is judged stopped; raise ``LSR_DIST_HEARTBEAT`` if one call of
yours can, ``LSR_DIST_HEARTBEAT=0`` turns the heartbeat off. ``end_stopped_peers`` is the same clean-up for a
rank that leaves its job with an error (e.g. after ``LSR_DIST_TIMEOUT``): local peers that stopped are ended.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from lsr.utils.console import error_line
from lsr.utils.env import env_seconds

__all__ = ["DEFAULT_HEARTBEAT_S", "HEARTBEAT_ENV", "ProcessId", "Watchdog", "heartbeat_timeout", "report_as"]

HEARTBEAT_ENV = "LSR_DIST_HEARTBEAT"
DEFAULT_HEARTBEAT_S = 60.0
LEFT = 1 << 40          # added to a rank's counter when it leaves the group: not judged any more
LEAVE_WAIT_S = 10.0     # the store's host waits this long at most for the others to leave before it goes

_error_prefix = "lsr: error: "


def report_as(command: str) -> None:
    """The prefix of the line the watchdog prints (``lsr.cli`` sets ``lsr <command>``)."""
    global _error_prefix
    _error_prefix = f"{command}: error: "


def heartbeat_timeout() -> float | None:
    """Seconds without a heartbeat after which a rank is judged stopped: ``LSR_DIST_HEARTBEAT``, default 60;
    None when set to 0 (no heartbeat)."""
    return env_seconds(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S, off="the heartbeat")


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class ProcessId:
    """A process, told apart from a later one with the same pid: host, boot id, pid, start time."""

    host: str
    boot: str
    pid: int
    start: str

    @classmethod
    def this(cls) -> ProcessId:
        stat = _proc_stat(os.getpid())
        return cls(socket.gethostname(), _boot_id(), os.getpid(), stat[19] if stat else "")

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host}"

    def local(self) -> bool:
        """On this host (same boot), where it can be checked and ended."""
        here = ProcessId.this()
        return bool(self.start) and (self.host, self.boot) == (here.host, here.boot)

    def state(self) -> str | None:
        """Its /proc state letter (R, S, T (stopped), Z, ...) if it is this process and runs on this host."""
        stat = _proc_stat(self.pid) if self.local() else None
        return stat[0] if stat and stat[19] == self.start else None

    def alive(self) -> bool:
        return self.state() not in (None, "Z", "X")

    def end(self) -> bool:
        """SIGKILL it (a stopped process dies of it too) if it is alive on this host; whether it was sent."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            return False
        return True


class Watchdog:
    """The heartbeat of one rank in one process group (see the module docstring); ``leave`` when done."""

    def __init__(self, rank: int, world: int, generation: int, timeout: float) -> None:
        import torch.distributed as dist

        self.rank, self.world, self.timeout = rank, world, timeout
        self.interval = min(2.0, timeout / 10)
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        self.address = f"{host}:{port}"
        self.store_is_rank0 = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
        client = dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=max(timeout, 30.0)),
                               wait_for_workers=False)
        run = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.store = dist.PrefixStore(f"lsr-heartbeat/{run}/{generation}", client)
        self.store.add(f"beat/{rank}", 0)   # before "who": a rank whose "who" is there has its counter there
        self.store.set(f"who/{rank}", json.dumps(asdict(ProcessId.this())))
        self.peers: dict[int, ProcessId] = {}
        self.seen = {r: (-1, time.monotonic()) for r in range(world) if r != rank}   # (counter, when it moved)
        self.op_since: float | None = None   # when the beat thread's request in flight was sent
        self._group = dist.group.WORLD   # a group destroyed without ``leave`` (or replaced) ends the watch
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, name=f"lsr-{f.__name__.strip('_')}", daemon=True)
                         for f in (self._beat, self._judge)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ threads
    def _request(self, fn: Any, *args: Any) -> Any:
        self.op_since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.op_since = None

    def _beat(self) -> None:
        keys, who = [f"beat/{r}" for r in self.seen], [f"who/{r}" for r in self.seen]
        try:
            while not self._stop.is_set():
                self._request(self.store.add, f"beat/{self.rank}", 1)
                if len(self.peers) < len(who) and self._request(self.store.check, who):  # (never waits for a key)
                    found = self._request(self.store.multi_get, who)
                    self.peers = {r: ProcessId(**json.loads(w)) for r, w in zip(self.seen, found, strict=True)}
                values = self._request(self.store.multi_get, keys) if self.peers else []
                now = time.monotonic()
                for r, v in zip(self.seen, values, strict=True):
                    if int(v) != self.seen[r][0]:
                        self.seen[r] = (int(v), now)
                self._stop.wait(self.interval)
        except Exception:  # noqa: BLE001 - the store is gone (the job ended around us): nothing left to watch
            self._stop.set()

    def _judge(self) -> None:
        import torch.distributed as dist

        last = time.monotonic()
        while not self._stop.wait(self.interval):
            if not dist.is_initialized() or dist.group.WORLD is not self._group:
                self._stop.set()
                return
            now = time.monotonic()
            if now - last > self.timeout / 2:   # this process did not run for a while: what it saw is stale
                for r, (v, _) in list(self.seen.items()):
                    self.seen[r] = (v, now)
                self.op_since = now if self.op_since is not None else None
            last = now
            since = self.op_since
            if since is not None and now - since > self.timeout:
                self._fatal(0 if self.store_is_rank0 else None)
            for r, (value, moved) in list(self.seen.items()):
                if value < LEFT and now - moved > self.timeout:
                    self._fatal(r)

    def _fatal(self, rank: int | None) -> None:
        """One line, the stopped rank ended when it runs here, this process ended (exit code 1)."""
        peer = self.peers.get(rank) if rank is not None else None
        wait = f"{HEARTBEAT_ENV}={self.timeout:g} sets the wait: raise it if a rank can hold the GIL that long"
        if rank is None:
            what = (f"the job's store at {self.address} did not answer for {self.timeout:g} s: the process holding "
                    "it (torchrun's agent) is stopped or hung")
        else:
            who = f" ({peer})" if peer is not None else ""
            what = f"rank {rank}{who} sent no heartbeat for {self.timeout:g} s: it is stopped (e.g. SIGSTOP) or hung"
        if rank is None:
            fate = "; run the job again once it answers"
        elif peer is not None and not peer.local():
            fate = f"; end rank {rank} on {peer.host}, then run the job again"
        else:
            fate = f" (rank {rank} too); run the job again"
        sys.stdout.flush()
        error_line(f"{_error_prefix}{what}, so every rank ends{fate} ({wait})")
        if peer is not None:
            peer.end()
        os._exit(1)

    # ------------------------------------------------------------------ leaving
    def end_stopped_peers(self) -> list[int]:
        """End the peers on this host that are stopped and have not left (this rank leaves with an error and
        nothing else would end them); their ranks."""
        if len(self.peers) < len(self.seen):   # not read yet by the beat thread (stopped now): once, bounded
            _bounded(self._read_peers)
        ended = []
        for r, peer in self.peers.items():
            if self.seen[r][0] < LEFT and peer.state() in ("T", "t") and peer.end():
                ended.append(r)
        return ended

    def _read_peers(self) -> None:
        who = [f"who/{r}" for r in self.seen]
        if self.store.check(who):
            self.peers = {r: ProcessId(**json.loads(w)) for r, w in zip(self.seen, self.store.multi_get(who),
                                                                         strict=True)}

    def leave(self) -> None:
        """Stop beating and tell the others this rank left; the store's host (rank 0 without torchrun) then
        waits a little for them to leave too, so that none of their requests meets a closed store. Never blocks
        for long: a stopped store gets a bounded wait."""
        self._stop.set()
        for t in self._threads:
            t.join(self.interval + 1.0)
        _bounded(self._say_left, LEAVE_WAIT_S + 1.0)

    def _say_left(self) -> None:
        self.store.add(f"beat/{self.rank}", LEFT)
        if self.store_is_rank0 and self.rank == 0:
            deadline = time.monotonic() + LEAVE_WAIT_S
            while time.monotonic() < deadline:
                # (a peer on this host that is gone will not leave: it is not waited for)
                keys = [f"beat/{r}" for r in self.seen if r not in self.peers or self.peers[r].alive()
                        or not self.peers[r].local()]
                if not keys or all(int(v) >= LEFT for v in self.store.multi_get(keys)):
                    break
                time.sleep(0.05)


def _bounded(fn: Any, seconds: float = 5.0) -> None:
    """``fn()`` in a daemon thread, waited for ``seconds`` at most (a request to a stopped store never returns);
    its errors are dropped (the store is gone: there is nobody left to ask or tell)."""
    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - see above
            pass
    t = threading.Thread(target=run, name="lsr-store", daemon=True)
    t.start()
    t.join(seconds)
