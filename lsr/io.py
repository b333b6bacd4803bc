"""Small file helpers shared by the readers and writers of lsr (runs, data, interop).

One gzip-aware opener and one atomic writer, so every module treats ``.gz`` and partial
writes the same way.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["PathLike", "atomic_write", "count_lines", "iter_lines", "open_binary", "open_text"]

PathLike = str | os.PathLike


def open_binary(path: PathLike) -> IO[bytes]:
    """Open a file for reading bytes; ``.gz`` files are decompressed on the fly."""
    path = Path(path)
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def open_text(path: PathLike, encoding: str = "utf-8") -> IO[str]:
    """Open a text file for reading (``.gz`` ok). Lines split at LF only, so a stray CR inside a
    text field does not cut a record in two."""
    return io.TextIOWrapper(open_binary(path), encoding=encoding, newline="\n")


def count_lines(path: PathLike) -> int:
    """Number of non-blank lines (fast: bytes, no decoding)."""
    with open_binary(path) as f:
        return sum(1 for line in f if line.strip())


def iter_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` (1-based, without the trailing newline / CR) of a text file."""
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            yield n, line.rstrip("\r\n")


@contextlib.contextmanager
def atomic_write(path: PathLike, encoding: str = "utf-8") -> Iterator[IO[str]]:
    """Write a text file atomically: into a temporary file next to ``path``, renamed on success.

    A ``.gz`` path is gzip-compressed. On an exception the temporary file is removed and ``path``
    is left as it was, so readers never see a half-written run or vector file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            # mtime=0 keeps gzip output byte-identical across runs (reproducible files)
            binary: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if path.suffix == ".gz" else raw
            with io.TextIOWrapper(binary, encoding=encoding, newline="\n") as text:
                yield text
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
