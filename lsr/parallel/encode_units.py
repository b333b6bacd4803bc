"""The working folder of a distributed encoding: work units handed out through files, shards assembled from them.

A unit is one window of ``encode_corpus`` (``window_bounds``): its vectors do not depend on the other windows,
so any rank may encode it and the result is the single-process one. Inside ``OUT/.lsr-encode/``:

* ``plan.json``: the stream length and the settings; a resume with other ones is refused.
* ``claims/u-NNNNNN``: unit N is being encoded in this job (created with O_EXCL: one rank wins). A rank walks
  the units in stream order and takes the next one nobody holds, so its reads only go forward and the ranks
  finish within about one window of each other, whatever their speed or the texts' lengths. Claims are
  dropped when a job starts: a unit a killed rank held is encoded again.
* ``units/u-NNNNNN.parquet``: a finished unit (written under a temporary name, renamed when complete).
* ``claims/s-NNNNN`` + ``shards/part-NNNNN.parquet`` and ``.json``: the rank that completes the last unit of a
  shard writes the shard (the bytes ``ShardWriter`` gives it) and its manifest entry, then drops the units.
* ``failed``: a rank's error, so that the others stop taking units instead of finishing the corpus first.

``publish`` moves the shards into OUT, writes its manifest and deletes the working folder: the folder one
process writes, file for file. Every step can be interrupted and repeated.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from lsr.encode.corpus import DISTRIBUTED_WORK, take_docs, window_bounds
from lsr.sparse import SparseVectors
from lsr.storage.files import atomic_write_bytes, atomic_write_text, fsync_dir, read_json
from lsr.storage.shard_writer import new_manifest, write_shard
from lsr.storage.shards import (
    MANIFEST,
    SHARD_NAME,
    check_shard_entry,
    check_shard_rows,
    sha256_file,
    table_to_vectors,
    unlisted_entries,
    vectors_to_table,
)

__all__ = ["EncodeWork", "UnitWriter", "claimed_windows"]

PLAN_KEYS = ("n_docs", "shard_rows", "sort_window", "first_window", "vocab_size", "metadata", "origin")
# the fix for a damaged file of the working folder (its units and shards are encoded again)
_DAMAGED = f"the unfinished encoding is damaged: delete its {DISTRIBUTED_WORK} folder (or the output folder) and encode again"


class EncodeWork:
    """The working folder ``out/.lsr-encode`` of an encoding of ``plan`` (``PLAN_KEYS``), and its units."""

    def __init__(self, out: str | os.PathLike, plan: dict[str, Any]) -> None:
        self.out = Path(out)
        self.root = self.out / DISTRIBUTED_WORK
        self.plan = json.loads(json.dumps({k: plan.get(k) for k in PLAN_KEYS}))
        self.units = window_bounds(plan["n_docs"], plan["shard_rows"], plan["sort_window"], plan["first_window"])
        self.n_shards = -(-plan["n_docs"] // plan["shard_rows"])
        self.shard_units: list[list[int]] = [[] for _ in range(self.n_shards)]
        for u, (start, _) in enumerate(self.units):
            self.shard_units[self.shard_of(u)].append(u)

    def shard_of(self, unit: int) -> int:
        return self.units[unit][0] // self.plan["shard_rows"]

    def _unit(self, unit: int) -> Path:
        return self.root / "units" / f"u-{unit:06d}.parquet"

    def _shard(self, k: int, suffix: str = ".parquet") -> Path:
        return self.root / "shards" / f"part-{k:05d}{suffix}"

    def start_job(self) -> None:
        """Create the folder or check that it holds this plan; drop the claims and failure of an earlier job.
        One process calls it, before any rank takes a unit."""
        plan_file = self.root / "plan.json"
        if plan_file.exists():
            stored = read_json(plan_file, _DAMAGED)
            if not isinstance(stored, dict):
                raise ValueError(f"{plan_file} holds {type(stored).__name__}, not the plan of an encoding; {_DAMAGED}")
            diff = [k for k in PLAN_KEYS if stored.get(k) != self.plan[k]]
            if diff:
                raise ValueError(f"{self.out} holds an unfinished encoding with other settings ({', '.join(diff)} "
                                 "differ): resume it with the same documents and settings, or choose a new folder")
        else:
            atomic_write_text(plan_file, json.dumps(self.plan, indent=1))
        shutil.rmtree(self.root / "claims", ignore_errors=True)
        (self.root / "failed").unlink(missing_ok=True)
        for sub in ("claims", "units", "shards"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def adopt(self, manifest: dict[str, Any]) -> None:
        """Take over the shards of an unfinished single-process folder (its manifest lists complete shards in
        stream order), then delete its manifest; repeatable after an interruption. After ``start_job``."""
        for k, entry in enumerate(manifest["shards"]):   # an edited row count: named before it reads as other settings
            if not self.shard_done(k):
                check_shard_rows(self.out / entry["file"], entry, self.out / MANIFEST)
        stored = {"vocab_size": manifest["vocab_size"], "metadata": manifest.get("metadata", {}),
                  "origin": manifest.get("origin")}
        diff = [k for k, v in stored.items() if (v or None) != (self.plan[k] or None)]
        if diff or any(s["rows"] != self.plan["shard_rows"] for s in manifest["shards"]):
            raise ValueError(f"cannot resume {self.out}: it was written with other settings "
                             f"({', '.join(diff) or 'shard_rows'} differ); choose another output folder, or delete it")
        for k, entry in enumerate(manifest["shards"]):
            if not self.shard_done(k):
                _move_shard(self.out / entry["file"], self._shard(k), entry["sha256"])
                atomic_write_text(self._shard(k, ".json"), json.dumps(entry))
        for name in unlisted_entries(self.out, SHARD_NAME, ()):  # a killed writer's shards past the listed ones
            if int(name[len("part-"):-len(".parquet")]) >= len(manifest["shards"]):
                (self.out / name).unlink()
        fsync_dir(self.root / "shards")
        (self.out / MANIFEST).unlink()

    def claim(self, name: str) -> bool:
        """Take ``name`` for this process (True) unless another has (False)."""
        try:
            os.close(os.open(self.root / "claims" / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        return True

    def unit_done(self, unit: int) -> bool:
        return self._unit(unit).exists() or self.shard_done(self.shard_of(unit))

    def shard_done(self, k: int) -> bool:
        return self._shard(k, ".json").exists()

    def fail(self, message: str) -> None:
        """Tell the other ranks to stop taking units (they report ``message``)."""
        with contextlib.suppress(OSError):
            atomic_write_text(self.root / "failed", message)

    def failure(self) -> str | None:
        try:
            return (self.root / "failed").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write_unit(self, unit: int, vectors: SparseVectors) -> None:
        start, stop = self.units[unit]
        if len(vectors) != stop - start:
            raise RuntimeError(f"unit {unit} [{start}, {stop}) got {len(vectors)} vectors")
        with atomic_write_bytes(self._unit(unit)) as f:  # read back once: not worth compressing
            pq.write_table(vectors_to_table(vectors), f, compression="none")

    def merge_if_ready(self, k: int) -> None:
        """Write shard ``k`` when all its units are on disk and no other rank has taken the job."""
        if all(self._unit(u).exists() for u in self.shard_units[k]) and self.claim(f"s-{k:05d}"):
            self.merge_shard(k)

    def merge_shard(self, k: int) -> None:
        """Shard ``k`` from its units (the bytes one process writes), its entry next to it; then drop the units."""
        vocab = self.plan["vocab_size"]
        missing = [u for u in self.shard_units[k] if not self._unit(u).exists()]
        if missing:
            raise RuntimeError(f"shard {k} lacks unit {missing[0]} in {self.root}")
        parts = [table_to_vectors(pq.read_table(self._unit(u)), vocab, validate=False) for u in self.shard_units[k]]
        rows = SparseVectors.concat(parts) if len(parts) > 1 else parts[0]
        entry = write_shard(self.root / "shards", k, rows, min(self.plan["sort_window"], self.plan["shard_rows"]))
        atomic_write_text(self._shard(k, ".json"), json.dumps(entry))
        for u in self.shard_units[k]:
            self._unit(u).unlink(missing_ok=True)

    def shard_entry(self, k: int) -> dict[str, Any]:
        """Shard ``k``'s manifest entry (``part-NNNNN.json``), checked: a JSON entry for this shard whose row count
        is the one in its file (a shard file moved to the output folder by an interrupted publish: that one)."""
        where = self._shard(k, ".json")
        entry = read_json(where, _DAMAGED)
        check_shard_entry(entry, where)
        if entry["file"] != self._shard(k).name:
            raise ValueError(f"{where} names shard {entry['file']!r}, not {self._shard(k).name}; {_DAMAGED}")
        file = self._shard(k) if self._shard(k).exists() else self.out / entry["file"]
        if file.exists():   # (else _move_shard says what is missing)
            check_shard_rows(file, entry, where)
        return entry

    def publish(self) -> dict[str, Any]:
        """Move the shards into the output folder, write its manifest, delete the working folder; returns the
        manifest."""
        manifest = new_manifest(self.plan["vocab_size"], self.plan["metadata"], self.plan["origin"])
        entries = [self.shard_entry(k) for k in range(self.n_shards)]   # every one checked before any is moved
        for k, entry in enumerate(entries):
            _move_shard(self._shard(k), self.out / entry["file"], entry["sha256"])
            manifest["shards"].append(entry)
            manifest["n_rows"] += entry["rows"]
            manifest["nnz"] += entry["nnz"]
        fsync_dir(self.out)
        manifest["complete"] = True
        atomic_write_text(self.out / MANIFEST, json.dumps(manifest, indent=1))
        shutil.rmtree(self.root)
        return manifest


def _move_shard(src: Path, dst: Path, sha256: str) -> None:
    """Rename ``src`` to ``dst`` unless an earlier, interrupted publish already did."""
    if src.exists():
        os.replace(src, dst)
    elif not dst.exists() or sha256_file(dst) != sha256:
        raise ValueError(f"shard {src} is missing and {dst} does not hold it: encode into a new folder")


class UnitWriter:
    """The writer ``CorpusRun`` hands each window to: the window of the next unit this rank claimed becomes a
    unit file (and a shard, when it completes one)."""

    def __init__(self, work: EncodeWork) -> None:
        self.work, self.path = work, work.root
        self.claimed: collections.deque[int] = collections.deque()  # appended by the reading thread
        self.written = 0

    def add(self, vectors: SparseVectors) -> None:
        unit = self.claimed.popleft()
        self.work.write_unit(unit, vectors)
        self.written += 1
        self.work.merge_if_ready(self.work.shard_of(unit))

    def settle(self) -> None:
        """Nothing to wait for: ``add`` writes its unit before it returns."""

    def close(self) -> dict[str, Any]:
        return {"units": self.written}


def claimed_windows(work: EncodeWork, docs: Iterable[Any], writer: UnitWriter) -> Iterator[tuple[list[str], list[str]]]:
    """(ids, texts) of each unit this rank claims, in stream order, reading ``docs`` forward; the claims are
    queued on ``writer``. Stops with an error once another rank has failed."""
    stream, pos = iter(docs), 0
    for unit, (start, stop) in enumerate(work.units):
        if work.unit_done(unit):
            continue
        failed = work.failure()
        if failed is not None:
            raise RuntimeError(f"another rank failed: {failed}")
        if not work.claim(f"u-{unit:06d}"):
            continue
        collections.deque(itertools.islice(stream, start - pos), maxlen=0)  # the units before: other ranks'
        ids, texts = take_docs(stream, start, stop - start)
        if len(ids) != stop - start:
            raise ValueError(f"the documents end after {start + len(ids)} of the n_docs={work.plan['n_docs']} the "
                             "encoding was planned for: give the same documents (or start a new folder)")
        writer.claimed.append(unit)
        pos = stop
        yield ids, texts
