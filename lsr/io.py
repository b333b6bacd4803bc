"""Small file helpers shared by the readers and writers of lsr (runs, data, interop).

One gzip-aware opener and one atomic writer, so every module treats ``.gz`` and partial
writes the same way: a file lsr writes appears whole (temporary file, flushed and fsynced, renamed into
place, the directory fsynced) with the permissions the user's umask gives new files, or not at all.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["PathLike", "apply_umask", "arrow_strings", "atomic_write", "atomic_write_bytes", "atomic_write_text",
           "count_lines", "fsync_dir", "fsynced_write", "iter_lines", "iter_tsv_pairs", "open_binary", "open_text",
           "to_numpy"]

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


def iter_tsv_pairs(path: PathLike, what: str) -> Iterator[tuple[int, str, str]]:
    """Yield ``(line_number, key, value)`` of ``key<TAB>value`` lines (blank lines skipped, both sides
    stripped); ``what`` names the layout in the error for a line without a tab, e.g. "qid<TAB>text"."""
    for n, line in iter_lines(path):
        if not line.strip():
            continue
        key, tab, value = line.partition("\t")
        if not tab:
            raise ValueError(f"{path}:{n}: expected '{what}', got {line[:80]!r}")
        yield n, key.strip(), value.strip()


def _umask() -> int:
    mask = os.umask(0)   # the only portable way to read it: set and restore at once
    os.umask(mask)
    return mask


def apply_umask(path: PathLike, directory: bool = False) -> None:
    """Give ``path`` the mode a plain ``open`` / ``mkdir`` would (mkstemp / mkdtemp create 0600 / 0700)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def fsync_dir(path: PathLike) -> None:
    """Flush a directory entry (a rename into it) to disk where the platform allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsynced_write(path: PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Write a new file through ``write(fileobj)`` and fsync it (files inside a temporary directory that
    is published by one rename, like an index, need no rename of their own)."""
    with open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_write_bytes(path: PathLike) -> Iterator[IO[bytes]]:
    """Write a binary file atomically: into a temporary file next to ``path``, renamed on success.

    A ``.gz`` path is gzip-compressed. The data is fsynced before the rename, so a crash leaves either
    the old file or the whole new one. On any exception (KeyboardInterrupt too) the temporary file is
    removed and ``path`` is left as it was, so readers never see a half-written run or vector file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.suffix == ".gz":
                # mtime=0 keeps gzip output byte-identical across runs (reproducible files)
                with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped:
                    yield zipped
            else:
                yield raw
            raw.flush()
            os.fsync(raw.fileno())
        apply_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_write(path: PathLike, encoding: str = "utf-8") -> Iterator[IO[str]]:
    """Write a text file atomically (see ``atomic_write_bytes``; ``.gz`` paths are gzip-compressed)."""
    with atomic_write_bytes(path) as binary:
        text = io.TextIOWrapper(binary, encoding=encoding, newline="\n")
        yield text
        text.flush()
        text.detach()  # the binary file stays open for atomic_write_bytes to fsync and close


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (see ``atomic_write_bytes``)."""
    with atomic_write(path, encoding) as f:
        f.write(text)


def to_numpy(x: Any) -> np.ndarray:
    """A torch tensor (any device) or array-like as a numpy array, without importing torch here."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def arrow_strings(values: Any) -> Any:
    """A pyarrow string array of ``values`` (returned as is when it already is an Arrow array)."""
    import pyarrow as pa

    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    return pa.array(values if isinstance(values, list) else list(values), pa.string())
