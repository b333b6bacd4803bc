"""``LiveIndex``: an index whose documents are added, replaced and deleted without a rebuild, crash-safe.

A live index folder holds one *generation*: a base index (``base-NNNNNN/``, an ``InvertedIndex`` folder), the
write-ahead log of the updates since (``wal-NNNNNN.log``, ``lsr.live.wal``) and ``live.json``, which names them
and is replaced last (atomically) when a compaction starts the next generation. Opening replays the log onto
the base: an update ``add`` / ``delete`` / ``upsert`` acknowledged (returned) is never lost, whatever kills the
process; a kill mid-compaction leaves the previous generation, which the next open uses (and removes the
half-built one). One process writes a folder at a time (``.lsr-live.lock`` names it); others are refused.

Document order is insertion order: the base's documents, then the added ones; a replaced document is deleted
from its place and added at the end. So the live documents (``documents()``) are what an index rebuilt from
scratch holds, in its order, and searching the live index (``lsr.live.search``) equals searching that rebuild.
In memory: the base, a mask of its live documents (deletes are tombstones), the added documents (the delta
segment: one small index per update batch, folded into one past ``MAX_SEGMENTS``) and theirs; ``compact`` folds
them into a new base.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lsr.index.inverted import InvertedIndex
from lsr.live.wal import LogWriter, read_log
from lsr.parallel.joblock import FolderLock
from lsr.sparse import SparseVectors
from lsr.storage.files import atomic_directory, atomic_write_text, fsync_dir

__all__ = ["LOCK", "MANIFEST", "MAX_SEGMENTS", "LiveIndex", "SlotDocnos", "is_live"]

MANIFEST, LOCK, FORMAT = "live.json", ".lsr-live.lock", "lsr-live"
MAX_SEGMENTS = 8   # delta parts searched one by one before they are folded into one


def is_live(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a live index folder."""
    return (Path(path) / MANIFEST).is_file()


def _names(generation: int) -> tuple[str, str]:
    return f"base-{generation:06d}", f"wal-{generation:06d}.log"


class LiveIndex:
    """A live index folder opened for writing (``create`` / ``open``); ``close`` (or ``with``) releases it."""

    def __init__(self, path: Path, base: InvertedIndex, generation: int, lock: FolderLock | None) -> None:
        self.path, self._lock_file = path, lock
        self._mutex = threading.RLock()   # updates and the search snapshot take it
        self._log: LogWriter | None = None
        self._compacting: list[tuple[int, dict]] | None = None   # updates made while a compaction builds
        self._start(base, generation)

    def _start(self, base: InvertedIndex, generation: int) -> None:
        """The state of a generation's base with no update applied."""
        self.base, self.generation = base, generation
        self.base_alive = np.ones(base.n_docs, dtype=bool)
        self._delta: list[SparseVectors] = []
        self.delta_alive = np.zeros(0, dtype=bool)
        self._slots = {d: i for i, d in enumerate(base.docnos)}   # live docno -> slot (base index, then delta)
        if len(self._slots) != base.n_docs:
            raise ValueError(f"{self.path}: the base index holds a docno twice; a live index needs unique docnos")
        self.seq = 0                    # the last update applied
        self.version = getattr(self, "version", -1) + 1   # changes of the searchable state
        self._segments: dict[int, InvertedIndex] = {}   # built indexes of the delta's parts, by position

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, path: str | os.PathLike, documents: SparseVectors | InvertedIndex, *,
               block_size: int | None = None, postings: str = "auto", metadata: dict[str, Any] | None = None) -> LiveIndex:
        """A new live index folder at ``path`` (which must not exist) over ``documents`` (vectors with their
        docnos as ids, or a built index), opened for writing. ``metadata``: the encoder's description (its
        ``describe()``), checked against queries and against the encoder of ``add_texts``."""
        path = Path(path)
        if path.exists():
            raise FileExistsError(f"{path} already exists: give a new folder for the live index, or open it")
        base = documents if isinstance(documents, InvertedIndex) else InvertedIndex.build(
            documents, block_size=block_size or 65536, postings=postings, metadata=metadata)
        base_name, wal_name = _names(0)
        with atomic_directory(path) as tmp:   # a kill while it is made leaves no half live index
            base.to("cpu").save(tmp / base_name)
            LogWriter(tmp / wal_name).close()
            _write_manifest(tmp, 0)
        return cls.open(path, device=base.device)

    @classmethod
    def open(cls, path: str | os.PathLike, device: str | torch.device = "cpu", write: bool = True) -> LiveIndex:
        """Open a live index folder: its base, with its log replayed. ``write``: take the writer lock (one
        writer per folder) and repair what a kill left (a torn log record, a half-built generation)."""
        path = Path(path)
        manifest = _read_manifest(path)
        lock = None
        if write:
            lock = FolderLock(path, LOCK)
            lock.acquire()
        try:
            generation = int(manifest["generation"])
            base_name, wal_name = _names(generation)
            live = cls(path, InvertedIndex.load(path / base_name, device=device), generation, lock)
            live.seq = int(manifest.get("seq", 0))
            records, valid = read_log(path / wal_name)
            for seq, payload in records:
                live._apply(payload)
                live.seq = seq
            if write:
                live._remove_other_generations()
                live._log = LogWriter(path / wal_name, valid)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        return live

    def close(self) -> None:
        """Release the log and the writer lock."""
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._lock_file is not None:
            self._lock_file.release()
            self._lock_file = None

    def __enter__(self) -> LiveIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ updates
    def add(self, vectors: SparseVectors) -> int:
        """Add documents (their ids are their docnos, new to the index); the update's sequence number, once it
        is on disk."""
        return self._update("add", vectors, None)

    def upsert(self, vectors: SparseVectors) -> int:
        """Add documents, replacing those whose docnos the index holds (a replaced one moves to the end)."""
        return self._update("upsert", vectors, None)

    def add_texts(self, encoder: Any, texts: Sequence[str], docnos: Sequence[str], replace: bool = False) -> int:
        """Encode documents with the index's encoder (``encoder.describe()`` must agree with the index's encoder
        description) and add them (``replace``: upsert); the update's sequence number."""
        from lsr.search.searcher import check_compatible

        if len(texts) != len(docnos):
            raise ValueError(f"{len(texts)} texts for {len(docnos)} docnos: give one docno per text")
        try:
            check_compatible(encoder.describe(), self.base.metadata)
        except ValueError as e:
            raise ValueError(f"this encoder is not the one the index was built with ({e}); encode the documents "
                             "with the index's encoder") from None
        vectors = encoder.encode_document(list(texts), ids=list(docnos))
        return self.upsert(vectors) if replace else self.add(vectors)

    def delete(self, docnos: Iterable[str], missing: str = "error") -> int:
        """Delete documents by docno; a docno the index lacks is an error (``missing="ignore"``: skipped)."""
        docnos = list(docnos)
        if missing not in ("error", "ignore"):
            raise ValueError(f"missing must be 'error' or 'ignore', got {missing!r}")
        return self._update("delete", None, docnos, missing)

    def _update(self, op: str, vectors: SparseVectors | None, docnos: list[str] | None, missing: str = "error") -> int:
        if self._log is None:
            raise ValueError(f"{self.path} is open read-only (or closed): open it with write=True to change it")
        with self._mutex:
            payload = self._checked(op, vectors, docnos, missing)
            self._log.append(self.seq + 1, payload)   # on disk (fsynced) before it is applied or acknowledged
            if self._compacting is not None:
                self._compacting.append((self.seq + 1, payload))
            self._apply(payload)
            self.seq += 1
            return self.seq

    def _checked(self, op: str, vectors: SparseVectors | None, docnos: list[str] | None, missing: str) -> dict:
        """The log payload of an update, after every check (nothing is written for a refused one)."""
        if op == "delete":
            unknown = [d for d in docnos if d not in self._slots]
            if unknown and missing == "error":
                shown = ", ".join(repr(d) for d in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
                raise KeyError(f"{len(unknown)} docno(s) to delete are not in the index ({shown}); pass "
                               "missing='ignore' to skip them")
            return {"op": "delete", "docnos": [d for d in dict.fromkeys(docnos) if d in self._slots]}
        if vectors.vocab_size != self.base.vocab_size:
            raise ValueError(f"the documents have vocab_size {vectors.vocab_size}, the index {self.base.vocab_size}: "
                             "encode them with the index's encoder")
        ids = vectors.ids
        if len(set(ids)) != len(ids):
            raise ValueError("an update holds a docno twice: give each document once")
        if op == "add":
            taken = [d for d in ids if d in self._slots]
            if taken:
                raise KeyError(f"{len(taken)} docno(s) are in the index already ({', '.join(map(repr, taken[:3]))}): "
                               "use upsert to replace them")
        v = vectors.to("cpu")
        return {"op": op, "docnos": list(ids), "indptr": v.indptr.tolist(), "indices": v.indices.tolist(),
                "values": v.values.tolist()}

    def _apply(self, payload: dict[str, Any]) -> None:
        """Apply a checked update to the in-memory state (also when the log is replayed)."""
        with self._mutex:
            docnos = payload["docnos"]
            if payload["op"] in ("delete", "upsert"):
                for d in docnos:
                    slot = self._slots.pop(d, None)
                    if slot is None:
                        continue
                    if slot < self.base.n_docs:
                        self.base_alive[slot] = False
                    else:
                        self.delta_alive[slot - self.base.n_docs] = False
            if payload["op"] in ("add", "upsert") and docnos:
                vectors = SparseVectors(torch.tensor(payload["indptr"], dtype=torch.int64),
                                        torch.tensor(payload["indices"], dtype=torch.int32),
                                        torch.tensor(payload["values"], dtype=torch.float32), docnos,
                                        self.base.vocab_size)
                first = self.base.n_docs + len(self.delta_alive)
                self._slots.update({d: first + i for i, d in enumerate(docnos)})
                self._delta.append(vectors)
                self.delta_alive = np.concatenate([self.delta_alive, np.ones(len(docnos), dtype=bool)])
            self.version += 1

    # ------------------------------------------------------------------ reading
    @property
    def n_docs(self) -> int:
        """Live documents."""
        return len(self._slots)

    def delta_vectors(self) -> SparseVectors | None:
        """Every document added since the base (live or not), in slot order; ids are the slots (a docno replaced
        twice has two of them)."""
        with self._mutex:
            if not self._delta:
                return None
            lengths = torch.cat([part.lengths for part in self._delta])
            indptr = torch.zeros(len(lengths) + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=indptr[1:])
            first = self.base.n_docs
            return SparseVectors(indptr, torch.cat([p.indices for p in self._delta]),
                                 torch.cat([p.values for p in self._delta]),
                                 [str(first + i) for i in range(len(lengths))], self.base.vocab_size, validate=False)

    def slot_docnos(self) -> SlotDocnos:
        """The docno of every slot: the base's, then the added documents' (deleted ones included); a view that
        copies only the added ones (a search takes one per call)."""
        with self._mutex:
            return SlotDocnos(self.base.docnos, tuple(d for part in self._delta for d in part.ids))

    def documents(self) -> SparseVectors:
        """The live documents in index order: what an index rebuilt from scratch holds."""
        with self._mutex:
            parts = [self.base.docs.to("cpu")[torch.from_numpy(np.flatnonzero(self.base_alive))]]
            delta = self.delta_vectors()
            if delta is not None and self.delta_alive.any():
                alive = np.flatnonzero(self.delta_alive)
                rows = delta[torch.from_numpy(alive)]
                names = [d for part in self._delta for d in part.ids]
                parts.append(SparseVectors(rows.indptr, rows.indices, rows.values, [names[i] for i in alive],
                                           rows.vocab_size, validate=False))
            return SparseVectors.concat(parts) if len(parts) > 1 else parts[0]

    def delta_segments(self) -> list[tuple[int, InvertedIndex]]:
        """The delta segment as [(first slot, index)]: one small index per update batch, each built once (an
        update costs an index of its own documents, not of the whole delta); past ``MAX_SEGMENTS`` they are
        folded into one (the slots stay: the documents keep their order)."""
        with self._mutex:
            if len(self._delta) > MAX_SEGMENTS:
                merged = self.delta_vectors()
                self._delta, self._segments = [SparseVectors(merged.indptr, merged.indices, merged.values,
                                                             [d for p in self._delta for d in p.ids],
                                                             merged.vocab_size, validate=False)], {}
            out, first = [], self.base.n_docs
            for j, part in enumerate(self._delta):
                if j not in self._segments:
                    self._segments[j] = InvertedIndex.build(
                        SparseVectors(part.indptr, part.indices, part.values, [str(first + i) for i in range(len(part))],
                                      part.vocab_size, validate=False).to(self.base.device),
                        block_size=self.base.block_size, postings=self.base.postings)
                out.append((first, self._segments[j]))
                first += len(part)
            return out

    # ------------------------------------------------------------------ compaction
    def compact(self, background: bool = False) -> threading.Thread | None:
        """Fold the updates into a new base (the next generation): built from a snapshot beside the current one,
        published by replacing ``live.json``, then the old generation is removed. Searches go on meanwhile; so do
        updates: those made while the base was built are carried into the new generation's log. ``background``:
        run in a thread (returned; ``join`` it), else return when done."""
        if self._log is None:
            raise ValueError(f"{self.path} is open read-only (or closed): open it with write=True to compact it")
        with self._mutex:
            if self._compacting is not None:
                raise RuntimeError(f"{self.path}: a compaction is running already")
            self._compacting = []   # the updates made from here on, carried into the next generation
            docs, seq0 = self.documents(), self.seq
        if not background:
            self._compact_from(docs, seq0)
            return None
        thread = threading.Thread(target=self._compact_from, args=(docs, seq0), name="lsr-live-compact", daemon=True)
        thread.start()
        return thread

    def _compact_from(self, docs: SparseVectors, seq0: int) -> None:
        nxt = self.generation + 1
        base_name, wal_name = _names(nxt)
        try:
            base = InvertedIndex.build(docs.to(self.base.device), block_size=self.base.block_size,
                                       metadata=dict(self.base.metadata), postings=self.base.postings)
            base.to("cpu").save(self.path / base_name, overwrite=True)
            with self._mutex:
                since = self._compacting
                log = LogWriter(self.path / wal_name)
                for seq, payload in since:
                    log.append(seq, payload)
                fsync_dir(self.path)
                _write_manifest(self.path, nxt, seq0)   # the switch: before it the old generation, after it the new
                self._log.close()
                seq = self.seq
                self._start(base, nxt)
                for _, payload in since:
                    self._apply(payload)
                self.seq, self._log = seq, log   # (sequence numbers go on across generations)
                self._remove_other_generations()
        finally:
            self._compacting = None

    def _remove_other_generations(self) -> None:
        keep = set(_names(self.generation))
        for entry in self.path.iterdir():
            if entry.name.startswith(("base-", "wal-")) and entry.name not in keep:
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        entry.unlink()


class SlotDocnos(Sequence):
    """The docnos of a live index's slots: its base's list (not copied: a generation's base does not change), then
    the added documents'."""

    def __init__(self, base: list[str], added: tuple[str, ...]) -> None:
        self.base, self.added = base, added

    def __len__(self) -> int:
        return len(self.base) + len(self.added)

    def __getitem__(self, slot: int) -> str:   # (ints only: from_topk and the run writers index one slot at a time)
        return self.base[slot] if slot < len(self.base) else self.added[slot - len(self.base)]

    def __iter__(self):
        yield from self.base
        yield from self.added


def _write_manifest(path: Path, generation: int, seq: int = 0) -> None:
    """``live.json``: the generation in use and the last update its base holds (the log's numbers go on)."""
    base, wal = _names(generation)
    atomic_write_text(path / MANIFEST, json.dumps({"format": FORMAT, "version": 1, "generation": generation,
                                                   "seq": seq, "base": base, "wal": wal}) + "\n")
    fsync_dir(path)


def _read_manifest(path: Path) -> dict[str, Any]:
    f = path / MANIFEST
    try:
        manifest = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is not a live index (no {MANIFEST}): make one with LiveIndex.create "
                                "or `lsr index --live`") from None
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{f} is not valid JSON: the live index's manifest was edited or damaged") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(
            manifest.get("generation"), int) or manifest["generation"] < 0:
        raise ValueError(f"{f} is not an lsr live index manifest (format {FORMAT!r}, a generation number)")
    return manifest
