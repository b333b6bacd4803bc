"""Writing vector directories shard by shard: ``ShardWriter`` (the format: ``lsr.storage.vector_format``).

Every file is written to a temporary name and renamed into place, and the manifest is rewritten after each
shard, so a killed writer leaves a directory whose manifest lists only complete shards:
``ShardWriter(..., resume=True)`` continues from there with no lost or duplicated rows.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from lsr.sparse import SparseVectors
from lsr.storage.files import OUT_OF_SPACE, atomic_write_bytes, atomic_write_text, naming_full_disk
from lsr.storage.provenance import check_same_origin
from lsr.storage.vector_format import (
    FORMAT,
    MANIFEST,
    SHARD_NAME,
    VERSION,
    check_shard_rows,
    read_manifest,
    sha256_file,
    unlisted_entries,
    vectors_to_table,
)

__all__ = ["PARQUET_OPTIONS", "ShardWriter", "new_manifest", "write_shard"]

# Parquet layout of a shard: term ids rise within a row (small deltas: delta-packed, which zstd does not
# shrink further) and bf16-born weights share their high bytes (byte-stream split + zstd); this writes faster,
# is smaller and reads faster than dictionaries + zstd (scripts/bench_shard_write.py measures both; the numbers
# are on the storage performance page). Any Parquet reader reads them as before.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": {"id": "zstd", "indices.list.element": "none", "values.list.element": "zstd"},
    "use_dictionary": False, "write_statistics": ["id"],
    "column_encoding": {"indices.list.element": "DELTA_BINARY_PACKED", "values.list.element": "BYTE_STREAM_SPLIT"}}


class _Sink:
    """A binary file that hashes what is written to it (the shard's sha256 without reading it back)."""

    def __init__(self, f: Any) -> None:
        self._f, self.sha256 = f, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return self._f.write(data)

    @property
    def closed(self) -> bool:
        return self._f.closed


class _ShardFile:
    """One shard file written a row group at a time, always on the same thread (a lane): into a temporary
    file renamed into place by ``finish``; after a failure (or ``abort``) the temporary file is removed."""

    def __init__(self, path: Path, k: int) -> None:
        self.name = f"part-{k:05d}.parquet"
        self._path = path / self.name
        self._stack: contextlib.ExitStack | None = None
        self._writer: pq.ParquetWriter | None = None
        self._sink: _Sink | None = None
        self._failed: BaseException | None = None
        self.rows = self.nnz = 0  # handed over so far (counted by the caller's thread)

    def write(self, vectors: SparseVectors) -> None:
        if self._failed is not None:
            return
        try:
            with naming_full_disk(self._path):
                self._write_table(vectors)
        except BaseException as e:
            self._failed = e
            self.abort()
            raise

    def _write_table(self, vectors: SparseVectors) -> None:
        table = vectors_to_table(vectors)
        if self._writer is None:
            self._stack = contextlib.ExitStack()
            self._sink = _Sink(self._stack.enter_context(atomic_write_bytes(self._path)))
            self._writer = pq.ParquetWriter(self._sink, table.schema, **PARQUET_OPTIONS)
        elif table.schema != self._writer.schema:
            table = table.cast(self._writer.schema)
        self._writer.write_table(table, row_group_size=max(len(table), 1))

    def finish(self) -> dict[str, Any]:
        failed = self._failed
        if isinstance(failed, OSError) and failed.errno in OUT_OF_SPACE:   # the CLI says what to do about it
            raise OSError(failed.errno, failed.strerror, failed.filename) from failed
        if failed is not None:
            raise RuntimeError(f"writing {self._path} failed: {failed}") from failed
        try:
            with naming_full_disk(self._path):
                self._writer.close()
                self._stack.close()  # fsync + rename into place
        except BaseException:
            self.abort()
            raise
        return {"file": self.name, "rows": self.rows, "nnz": self.nnz, "sha256": self._sink.sha256.hexdigest()}

    def abort(self) -> None:
        """Drop the temporary file (the shard is not listed anywhere)."""
        stack, self._stack = self._stack, None
        if stack is not None:
            with contextlib.suppress(Exception):
                if self._writer is not None:
                    self._writer.close()
            err = RuntimeError("shard aborted")
            stack.__exit__(type(err), err, None)


def new_manifest(vocab_size: int, metadata: Mapping[str, Any] | None = None,
                 origin: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of an empty, unfinished vector directory (``ShardWriter`` starts from it; a folder
    assembled from shards written elsewhere, ``lsr.parallel.encode``, too: the same keys in the same order)."""
    manifest: dict[str, Any] = {"format": FORMAT, "version": VERSION, "vocab_size": int(vocab_size), "n_rows": 0,
                                "nnz": 0, "complete": False, "metadata": json.loads(json.dumps(dict(metadata or {}))),
                                "shards": []}
    if origin:
        manifest["origin"] = dict(origin)
    return manifest


def write_shard(folder: str | os.PathLike, index: int, rows: SparseVectors, row_group_rows: int) -> dict[str, Any]:
    """Write ``rows`` as shard ``index`` of ``folder`` (``part-{index:05d}.parquet``, renamed into place when
    complete) with the bytes ``ShardWriter(..., row_group_rows=row_group_rows)`` gives the shard holding these
    rows; returns its manifest entry."""
    if row_group_rows <= 0 or not len(rows):
        raise ValueError("a shard needs rows and a positive row_group_rows")
    shard = _ShardFile(Path(folder), index)
    for start in range(0, len(rows), row_group_rows):
        part = rows[start:start + row_group_rows] if row_group_rows < len(rows) else rows
        shard.rows += len(part)
        shard.nnz += part.nnz
        shard.write(part)
    return shard.finish()


class ShardWriter:
    """Write SparseVectors batches as fixed-size Parquet shards, resumably.

    Args:
        path: output directory.
        vocab_size: size of the term space.
        metadata: JSON-serialisable facts about the vectors (model id, revision, tokenizer hash, max_length...).
            On resume they must equal the stored ones.
        shard_rows: rows per shard (the last one may be shorter).
        resume: continue a directory whose manifest lists complete shards (``rows_done`` tells how many
            input rows to skip); without it an existing non-empty manifest is an error. Shards of an unfinished
            directory that its manifest does not list (a killed writer's, past the listed ones) are deleted.
        origin: where the documents come from (``Dataset.docs_origin``); kept in the manifest, and on
            resume it must equal the stored one (a folder of other documents is never continued or reused).
        write_threads: shards written at once (the same files; the manifest still lists complete shards
            in order, so a killed writer resumes as with one); ``add`` then returns before its shard is on disk.
        row_group_rows: rows per Parquet row group (default: one per shard). A shard's row groups are written
            as soon as their rows arrive, so after the last ``add`` only the last row group is left to write.
            The files depend on ``shard_rows`` and ``row_group_rows`` only, not on how the rows are split
            into ``add`` calls or on ``write_threads``.
    """

    def __init__(self, path: str | os.PathLike, vocab_size: int, metadata: Mapping[str, Any] | None = None,
                 shard_rows: int = 100_000, resume: bool = False, origin: Mapping[str, Any] | None = None,
                 write_threads: int = 1, row_group_rows: int | None = None) -> None:
        if shard_rows <= 0 or (row_group_rows is not None and row_group_rows <= 0):
            raise ValueError("shard_rows and row_group_rows must be positive")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.shard_rows = int(shard_rows)
        self.row_group_rows = min(int(row_group_rows or shard_rows), self.shard_rows)
        self.manifest = new_manifest(vocab_size, metadata, origin)
        meta = self.manifest["metadata"]
        if (self.path / MANIFEST).exists():
            self._check_resume(read_manifest(self.path), resume, origin, vocab_size, meta)
        elif resume:  # a writer killed before it listed a shard: what it finished is unlisted leftovers
            self._drop_unlisted_tail([])
        self._buffer: list[SparseVectors] = []
        self._buffered = 0
        # shard files written by several threads (Parquet + zstd release the GIL), committed in order;
        # a shard's row groups all go to one lane (a single thread), so they land in order
        self._write_threads = max(1, int(write_threads))
        self._lanes = ([ThreadPoolExecutor(1, thread_name_prefix="lsr-shard-file") for _ in range(self._write_threads)]
                       if self._write_threads > 1 else None)
        self._open: _ShardFile | None = None
        self._in_flight: collections.deque[Future] = collections.deque()
        self._lock = threading.Lock()  # the manifest and _in_flight: lanes commit finished shards themselves

    def _check_resume(self, old: dict[str, Any], resume: bool, origin: Mapping[str, Any] | None, vocab_size: int,
                      meta: dict[str, Any]) -> None:
        if not resume:
            raise FileExistsError(f"{self.path} already holds vectors; pass resume=True or choose a new directory")
        check_same_origin(old.get("origin"), origin, self.path)
        if old["vocab_size"] != vocab_size or old.get("metadata", {}) != meta:
            stored = {"vocab_size": old["vocab_size"], **old.get("metadata", {})}
            wanted = {"vocab_size": int(vocab_size), **meta}
            diff = "; ".join(f"{k}: {str(stored.get(k))[:60]} -> {str(wanted.get(k))[:60]}"
                             for k in sorted(set(stored) | set(wanted), key=str) if stored.get(k) != wanted.get(k))
            raise ValueError(f"cannot resume {self.path}: it was written with other settings ({diff}); "
                             "choose another output folder, or delete it")
        for s in old["shards"]:
            f = self.path / s["file"]
            if not f.exists() or sha256_file(f) != s["sha256"]:
                raise ValueError(f"cannot resume {self.path}: shard {s['file']} is missing or corrupt")
            check_shard_rows(f, s, self.path / MANIFEST)   # rows edited in the manifest: the checksum is the file's
        if not old.get("complete"):  # a complete folder's unlisted shard is not a leftover: readers report it
            self._drop_unlisted_tail(old["shards"])
        self.manifest = old
        self.manifest["complete"] = False

    def _drop_unlisted_tail(self, listed: list[dict[str, Any]]) -> None:
        """Delete the shards a killed writer finished after the listed ones (several write threads finish
        out of order): this writer rewrites those numbers, but a resume that ends with fewer shards (another
        shard_rows) would leave one behind, which readers refuse as a shard the manifest does not list."""
        for name in unlisted_entries(self.path, SHARD_NAME, (s["file"] for s in listed)):
            if int(name[len("part-"):-len(".parquet")]) >= len(listed):  # never a hand-placed earlier number
                (self.path / name).unlink(missing_ok=True)

    @property
    def rows_done(self) -> int:
        """Rows already in complete shards (input rows to skip when resuming)."""
        return int(self.manifest["n_rows"])

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def _next_cut(self) -> int:
        """Rows until the next row-group boundary (shard boundaries are row-group boundaries)."""
        done = self._open.rows if self._open is not None else 0
        return min(self.row_group_rows, self.shard_rows - done)

    def add(self, vectors: SparseVectors) -> None:
        """Queue rows for the shards (written as each shard fills); their vocabulary must be the folder's."""
        if vectors.vocab_size != self.manifest["vocab_size"]:  # another encoder's term ids would be misread
            raise ValueError(f"vectors of vocabulary size {vectors.vocab_size} cannot join {self.path}, whose "
                             f"vocabulary size is {self.manifest['vocab_size']}; write them to another folder")
        self._buffer.append(vectors.to("cpu"))
        self._buffered += len(vectors)
        while self._buffered and self._buffered >= self._next_cut():
            allv = SparseVectors.concat(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
            cut = self._next_cut()
            self._hand_over(allv[:cut] if cut < len(allv) else allv)
            rest = allv[cut:]
            self._buffer, self._buffered = ([rest], len(rest)) if len(rest) else ([], 0)

    def _run(self, k: int, fn: Any, *args: Any) -> Future:
        """``fn(*args)`` on shard k's lane (inline with one write thread)."""
        if self._lanes is not None:
            return self._lanes[k % self._write_threads].submit(fn, *args)
        done: Future = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as e:
            done.set_exception(e)
            raise
        return done

    def _k(self) -> int:
        with self._lock:
            return len(self.manifest["shards"]) + len(self._in_flight)

    def _hand_over(self, rows: SparseVectors) -> None:
        """Write these rows as the next row group of the open shard (opening one first)."""
        if self._open is None:
            while len(self._in_flight) >= self._write_threads:  # bounded memory; shard k's lane is then free
                self._in_flight[0].result()
                self._commit_done()
            self._open = _ShardFile(self.path, self._k())
        shard = self._open
        shard.rows += len(rows)
        shard.nnz += rows.nnz
        self._run(self._k(), shard.write, rows)
        if shard.rows == self.shard_rows:
            self._finish_open()

    def _finish_open(self) -> None:
        shard, self._open = self._open, None
        done = self._run(self._k(), shard.finish)
        with self._lock:
            self._in_flight.append(done)
        done.add_done_callback(self._commit_done)  # listed as soon as it and the shards before it are on disk

    def _commit_done(self, _: Future | None = None) -> None:
        """List the finished shards at the head of the queue (in order: the manifest lists a prefix)."""
        with self._lock:
            while self._in_flight and self._in_flight[0].done() and self._in_flight[0].exception() is None:
                self._commit(self._in_flight.popleft().result())

    def settle(self) -> None:
        """Wait for the shards being written and list them in the manifest (rows still buffered, and a
        shard not yet complete, stay unwritten): what a caller that stops on an error calls, so that a
        resume skips them."""
        if self._open is not None:
            shard, self._open = self._open, None
            with contextlib.suppress(Exception):
                self._run(self._k(), shard.abort).result()
        with self._lock:
            writing = list(self._in_flight)
        concurrent.futures.wait(writing)  # all of them, even after a failure: no file is left half-written
        self._commit_done()
        with self._lock:
            failed = self._in_flight[0] if self._in_flight else None
        if failed is not None:
            failed.result()  # raises the first failure; the shards after it are not listed

    def _commit(self, shard: dict[str, Any]) -> None:
        self.manifest["shards"].append(shard)
        self.manifest["n_rows"] += shard["rows"]
        self.manifest["nnz"] += shard["nnz"]
        atomic_write_text(self.path / MANIFEST, json.dumps(self.manifest, indent=1))

    def close(self) -> dict[str, Any]:
        """Flush the last partial shard and mark the directory complete; returns the manifest."""
        if self._buffered:
            self._hand_over(SparseVectors.concat(self._buffer) if len(self._buffer) > 1 else self._buffer[0])
            self._buffer, self._buffered = [], 0
        if self._open is not None:
            self._finish_open()
        self.settle()
        for lane in self._lanes or ():
            lane.shutdown()
        self.manifest["complete"] = True
        atomic_write_text(self.path / MANIFEST, json.dumps(self.manifest, indent=1))
        return self.manifest
