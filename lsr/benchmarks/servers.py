"""The search servers a serving benchmark loads (``scripts/bench_serve.py``, ``scripts/profile_serve.py``).

* ``ThreadServer``: uvicorn serving an app in a thread of the benchmark's process (every replica of the app in
  that one process: ``lsr serve --devices``).
* ``ProcessServers``: one ``lsr serve --device D`` process per device, each on its own port: what one process
  per GPU would give (each has its own event loop and interpreter lock), for comparison with the threads.

Both answer ``ports`` and ``stats()`` (one ``/stats``-shaped dict: counters summed over the servers, each
server's replicas listed under ``replicas``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lsr.testing import free_port

__all__ = ["HOST", "ProcessServers", "ThreadServer", "merge_stats"]

HOST = "127.0.0.1"
_SUMMED = ("requests", "queries", "batches", "errors", "dropped", "device_busy_s", "stage_batches")


def get_json(port: int, path: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
        return json.loads(r.read())


class ThreadServer:
    """uvicorn serving ``app`` in a thread of this process (its own event loop), named "uvicorn";
    ``profiler``: a cProfile.Profile that records the event loop's thread."""

    def __init__(self, app: Any, profiler: Any = None) -> None:
        import uvicorn

        self.engine = app.state.engine
        self.port = free_port()
        self.ports = [self.port]
        self.server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=self.port, log_level="warning",
                                                    access_log=False))
        run = self.server.run if profiler is None else lambda: profiler.runcall(self.server.run)
        self.thread = threading.Thread(target=run, name="uvicorn", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start (see its log above)")
            time.sleep(0.05)

    def stats(self) -> dict:
        return get_json(self.port, "/stats")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class ProcessServers:
    """``lsr serve`` on each of ``devices`` in a process of its own, each on a free port, started side by side and
    waited for (``/health``) up to ``start_timeout_s``; ``serve_args``: the other ``lsr serve`` flags. Each
    server's output goes to ``log_dir``/serve-N.log."""

    def __init__(self, index_dir: str | Path, model: str | None, devices: Sequence[str], serve_args: Sequence[str],
                 log_dir: str | Path, start_timeout_s: float = 600) -> None:
        self.ports = [free_port() for _ in devices]
        self.logs = [Path(log_dir) / f"serve-{i}.log" for i in range(len(devices))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                            os.environ.get("PYTHONPATH", "")])}
        self.procs = []
        for device, port, log in zip(devices, self.ports, self.logs):
            cmd = [sys.executable, "-m", "lsr", "serve", "--index", str(index_dir), "--device", device, "--host", HOST,
                   "--port", str(port), *(["--model", str(model)] if model else []), *serve_args]
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
        try:
            self._wait_ready(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline, waiting = time.time() + timeout_s, set(range(len(self.procs)))
        while waiting:
            for i in sorted(waiting):
                if self.procs[i].poll() is not None:
                    tail = self.logs[i].read_text().strip().splitlines()[-1:] or ["(no output)"]
                    raise RuntimeError(f"lsr serve on port {self.ports[i]} exited ({self.procs[i].returncode}): "
                                       f"{tail[0]}")
                try:
                    get_json(self.ports[i], "/health", timeout=2)
                    waiting.discard(i)
                except OSError:
                    pass
            if waiting and time.time() > deadline:
                raise RuntimeError(f"lsr serve did not answer within {timeout_s:g} s (logs: {self.logs[0].parent})")
            time.sleep(0.25)

    def stats(self) -> dict:
        return merge_stats([get_json(port, "/stats") for port in self.ports])

    def cpu_seconds(self) -> float:
        """User + system CPU seconds so far of the server processes (Linux /proc)."""
        tick, total = os.sysconf("SC_CLK_TCK"), 0.0
        for p in self.procs:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick   # utime, stime
        return total

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def merge_stats(parts: Sequence[dict]) -> dict:
    """Several servers' ``/stats`` as one: counters and stage totals summed, the largest batch, the collectors'
    collections and pauses summed (longest pause: the largest), compile counts summed, every replica listed."""
    out: dict[str, Any] = {key: sum(p.get(key, 0) for p in parts) for key in _SUMMED}
    out["max_batch_queries"] = max(p.get("max_batch_queries", 0) for p in parts)
    stages: dict[str, float] = {}
    for p in parts:
        for key, ms in p.get("stage_ms_total", {}).items():
            stages[key] = stages.get(key, 0.0) + ms
    out["stage_ms_total"] = stages
    gcs = [p["gc"] for p in parts if p.get("gc")]
    if gcs:
        out["gc"] = {"collections": [sum(g["collections"][i] for g in gcs) for i in range(3)],
                     "pause_ms": [sum(g["pause_ms"][i] for g in gcs) for i in range(3)],
                     "max_pause_ms": [max(g["max_pause_ms"][i] for g in gcs) for i in range(3)]}
    compiled = [p["compiled"] for p in parts if p.get("compiled")]
    out["compiled"] = {key: sum(c.get(key, 0) for c in compiled) for key in (compiled[0] if compiled else {})}
    out["query_graphs"] = parts[0].get("query_graphs") if parts else None
    out["replicas"] = [r for p in parts for r in p.get("replicas", [])]
    return out
