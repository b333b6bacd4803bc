"""The write-ahead log of a live index: every acknowledged update is on disk before ``add`` / ``delete`` returns.

A log file is a sequence of records, each ``magic (4 bytes) | payload length (u32) | crc32 of the payload (u32) |
sequence number (u64) | payload (JSON, UTF-8)``, appended with one ``write`` and fsynced. A process killed while
appending leaves a torn last record (short, or failing its crc): it was never acknowledged, and opening the log
drops it. A record that fails its check with more records after it is not a torn write but an edited or damaged
file: opening refuses it in one line naming the file.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

__all__ = ["LogWriter", "read_log"]

MAGIC = b"LSRW"
HEADER = struct.Struct("<4sIIQ")
MAX_RECORD = 1 << 31   # a length above this is damage, not a record


def encode_record(seq: int, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    if len(body) >= MAX_RECORD:
        raise ValueError(f"one update of {len(body):,} bytes is too large for the log: split it into smaller batches")
    return HEADER.pack(MAGIC, len(body), zlib.crc32(body), seq) + body


def read_log(path: str | os.PathLike) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """The log's records [(seq, payload)] in order and the length of its valid part (a torn last record is not
    part of it); ValueError naming ``path`` for a damaged record that is not the last one."""
    data = Path(path).read_bytes()
    records, pos = [], 0
    while pos < len(data):
        bad = _check_record(data, pos)
        if bad is not None:
            end = pos + HEADER.size + (HEADER.unpack_from(data, pos)[1] if len(data) - pos >= HEADER.size else 0)
            if bad == "torn" or end >= len(data):
                break   # the last record, cut short by a kill: never acknowledged
            raise ValueError(f"{path}: record {len(records) + 1} at byte {pos} is damaged ({bad}) and more follow: "
                             "the log was edited or the disk damaged it; restore the live index from a copy")
        _, n, _, seq = HEADER.unpack_from(data, pos)
        body = data[pos + HEADER.size:pos + HEADER.size + n]
        records.append((seq, json.loads(body.decode("utf-8"))))
        pos += HEADER.size + n
    return records, pos


def _check_record(data: bytes, pos: int) -> str | None:
    """None for a sound record at ``pos``; "torn" when the file ends inside it; else what is wrong."""
    if len(data) - pos < HEADER.size:
        return "torn"
    magic, n, crc, _ = HEADER.unpack_from(data, pos)
    if magic != MAGIC:
        return "no record header"
    if n >= MAX_RECORD:
        return f"a length of {n:,} bytes"
    if len(data) - pos - HEADER.size < n:
        return "torn"
    body = data[pos + HEADER.size:pos + HEADER.size + n]
    if zlib.crc32(body) != crc:
        return "checksum"
    try:
        json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "not JSON"
    return None


class LogWriter:
    """Appends records to a log whose valid part is ``valid_bytes`` long (a torn tail is cut off first)."""

    def __init__(self, path: str | os.PathLike, valid_bytes: int = 0) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, valid_bytes)
        os.lseek(fd, valid_bytes, os.SEEK_SET)
        os.fsync(fd)
        self._fd: int | None = fd

    def append(self, seq: int, payload: dict[str, Any]) -> None:
        """Write one record and fsync it: when this returns, the update survives a kill or a power cut."""
        record = encode_record(seq, payload)
        assert self._fd is not None, "the log is closed"
        view, start = memoryview(record), os.lseek(self._fd, 0, os.SEEK_CUR)
        try:
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, start)   # a full disk: no half record left for the next append to follow
            os.lseek(self._fd, start, os.SEEK_SET)
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
