"""The benchmark harness every ``scripts/bench_*.py`` shares: environment and commit capture, timing with
quantiles (CUDA events on a GPU, the wall clock on a CPU), peak extra device memory, one result schema
written as JSON + CSV, and a plain-text table.

The result file of every benchmark has the same top-level keys::

    {"schema": "lsr-bench/1", "bench": NAME, "environment": {...}, "config": {...},
     "summary": {...}, "rows": [ROW, ...]}

and every row carries the keys of ``ROW_KEYS`` (None where a benchmark has no value) plus the fields
of its case (sizes, batch, k, ...). The CSV has one line per row, common keys first.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

SCHEMA = "lsr-bench/1"
MIB = 1 << 20
# Every row has these (None when not measured): what ran, whether it worked, its time quantiles over
# `repeats` timed calls, its peak device memory above what was allocated before, and its checks.
ROW_KEYS = ("method", "status", "ms", "ms_p10", "ms_p90", "repeats", "peak_extra_mb", "exact", "bit_identical",
            "error")
REPO = Path(__file__).resolve().parents[2]

__all__ = ["ROW_KEYS", "SCHEMA", "PeakMemory", "Results", "commit", "environment", "format_table", "quantiles",
           "synchronize", "time_calls", "time_for", "timed"]


def commit() -> str:
    """The git commit being measured (``LSR_COMMIT`` wins, for copies of the tree without .git);
    ``+dirty`` when the working tree has uncommitted changes."""
    if os.environ.get("LSR_COMMIT"):
        return os.environ["LSR_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=REPO, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def environment(device: str | torch.device | None = None, **extra: object) -> dict:
    """Machine, versions, commit, time and command line of this run (``extra`` is added as is)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "device_count": torch.cuda.device_count() if cuda else 0,
        "cuda": torch.version.cuda, "torch": torch.__version__, "triton": _version("triton"),
        "transformers": _version("transformers"), "python": sys.version.split()[0], "host": platform.node(),
        "cpu_count": os.cpu_count(), "commit": commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv, **extra,
    }


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], sync: bool = True) -> tuple[object, float]:
    """(fn(), seconds), the device synchronised before and after when ``sync``."""
    if sync:
        synchronize()
    t0 = time.perf_counter()
    out = fn()
    if sync:
        synchronize()
    return out, time.perf_counter() - t0


def time_calls(fn: Callable[[int], object], repeats: int, warmup: int = 1) -> list[float]:
    """Milliseconds of ``fn(i)`` for i in range(repeats), after ``warmup`` untimed calls (given i =
    repeats, repeats + 1, ...): CUDA events on a GPU, the wall clock otherwise."""
    for i in range(warmup):
        fn(repeats + i)
    synchronize()
    out = []
    for i in range(repeats):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(i)
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn(i)
            out.append((time.perf_counter() - t) * 1000)
    return out


def time_for(fn: Callable[[], object], budget_ms: float, min_reps: int = 5, max_reps: int = 100,
             flush_l2: bool = True) -> list[float]:
    """CUDA-event milliseconds of ``fn()`` repeated for about ``budget_ms`` (between ``min_reps`` and
    ``max_reps`` times) after two warm-up calls, the L2 cache flushed before each repeat, as
    ``triton.testing.do_bench`` does: for kernels whose inputs would otherwise stay in cache."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda") if flush_l2 else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(2):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = start.elapsed_time(end) / 2
    times = []
    for _ in range(int(min(max_reps, max(min_reps, budget_ms / max(estimate, 1e-3))))):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def quantiles(ms: Sequence[float]) -> dict[str, float | int]:
    """Row fields of a list of timings: median, 10th and 90th percentile (nearest rank) and count."""
    s = sorted(ms)
    if not s:
        return {"ms": None, "ms_p10": None, "ms_p90": None, "repeats": 0}
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {"ms": s[len(s) // 2], "ms_p10": pick(0.1), "ms_p90": pick(0.9), "repeats": len(s)}


class PeakMemory:
    """``with PeakMemory() as pm: ...`` then ``pm.extra_mb``: the peak CUDA memory allocated inside the
    block above what was allocated on entry (None on a CPU)."""

    def __enter__(self) -> PeakMemory:
        self.extra_mb: float | None = None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc: object) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            self.extra_mb = (torch.cuda.max_memory_allocated() - self._base) / MIB


class Results:
    """Rows of one benchmark, saved after every ``add`` so a run cut short keeps what it measured:
    OUT/NAME.json (the schema above) and OUT/NAME.csv."""

    def __init__(self, out_dir: str | Path, name: str, environment: dict, config: dict | None = None) -> None:
        self.dir, self.name = Path(out_dir), name
        self.environment, self.config = environment, dict(config or {})
        self.rows: list[dict] = []
        self.summary: dict = {}
        self.dir.mkdir(parents=True, exist_ok=True)

    def add(self, row: dict, echo: bool = True) -> dict:
        """Append ``row`` with every ROW_KEYS key present (status "ok" unless it says otherwise), save."""
        full = {key: row.get(key) for key in ROW_KEYS} | row
        full["status"] = full["status"] or ("error" if full.get("error") else "ok")
        self.rows.append(full)
        self.save()
        if echo:
            print(json.dumps(full, default=str), flush=True)
        return full

    def document(self) -> dict:
        return {"schema": SCHEMA, "bench": self.name, "environment": self.environment, "config": self.config,
                "summary": self.summary, "rows": self.rows}

    def save(self) -> None:
        (self.dir / f"{self.name}.json").write_text(json.dumps(self.document(), indent=1, default=str))
        keys = list(ROW_KEYS) + sorted({k for r in self.rows for k in r} - set(ROW_KEYS))
        with open(self.dir / f"{self.name}.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=keys)
            writer.writeheader()
            writer.writerows({k: _cell(r.get(k)) for k in keys} for r in self.rows)


def _cell(value: object) -> object:
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def format_table(rows: Iterable[dict], columns: Sequence[str | tuple[str, str]]) -> str:
    """A plain-text table of ``rows``: columns are keys or (key, printf format) pairs; missing values
    print as "-", rows with an error show it after their first column."""
    cols = [(c, "") if isinstance(c, str) else c for c in columns]
    cells = [[c for c, _ in cols]]
    for r in rows:
        line = [_fmt(r.get(c), f) for c, f in cols]
        if r.get("error") or r.get("status") not in (None, "ok"):
            line = line[:1] + [str(r.get("error") or r.get("status"))[:70]] + [""] * (len(cols) - 2)
        cells.append(line)
    widths = [max(len(line[i]) for line in cells) for i in range(len(cols))]
    buf = io.StringIO()
    for line in cells:
        buf.write("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(line, widths))).rstrip())
        buf.write("\n")
    return buf.getvalue()


def _fmt(value: object, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "y" if value else "n"
    return format(value, spec) if spec else str(value)
