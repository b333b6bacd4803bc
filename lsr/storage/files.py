"""Small file helpers shared by the readers and writers of lsr (runs, data, interop).

One gzip-aware opener and one atomic writer, so every module treats ``.gz`` and partial
writes the same way: a file lsr writes appears whole (temporary file, flushed and fsynced, renamed into
place, the directory fsynced) with the permissions the user's umask gives new files, or not at all.
Text is read as UTF-8 with an optional byte-order mark (BOM) and LF or CRLF line ends.
The one rule for ids that go into run files is ``lsr.utils.ids``.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["OUT_OF_SPACE", "PathLike", "apply_umask", "arrow_strings", "atomic_directory", "atomic_write", "atomic_write_bytes",
           "atomic_write_text",
           "count_lines", "fsync_dir", "fsynced_write",
           "iter_lines", "iter_tsv_pairs", "naming_full_disk", "open_binary", "open_text", "pid_alive",
           "read_json", "recover_directory",
           "remove_dead_temporaries", "remove_stale_temporaries", "to_numpy"]

PathLike = str | os.PathLike


def open_binary(path: PathLike) -> IO[bytes]:
    """Open a file for reading bytes; ``.gz`` files are decompressed on the fly."""
    path = Path(path)
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def open_text(path: PathLike, encoding: str = "utf-8-sig") -> IO[str]:
    """Open a text file for reading (``.gz`` ok). The default ``utf-8-sig`` drops a UTF-8 BOM at the
    start of the file (editors on Windows write one; it would otherwise become part of the first id).
    Lines split at LF only, so a stray CR or U+2028 inside a text field does not cut a record in two."""
    return io.TextIOWrapper(open_binary(path), encoding=encoding, newline="\n")


def count_lines(path: PathLike) -> int:
    """Number of non-blank lines (fast: bytes, no decoding; a leading BOM is not content)."""
    with open_binary(path) as f:
        first = f.readline().removeprefix(_BOM)
        return int(bool(first.strip())) + sum(1 for line in f if line.strip())


def iter_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` (1-based, without the trailing newline / CR) of a text file."""
    n = 0
    try:
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                yield n, line.rstrip("\r\n")
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ValueError(f"{path}: not a complete gzip file after line {n} ({e}); recompress or fetch it again, or "
                         "drop the .gz suffix of a plain text file") from None
    except UnicodeDecodeError as e:
        # the decoder reads ahead in chunks, so n + 1 may be earlier than the bad line: find it in the bytes
        line, col = _first_bad_utf8(path, n + 1)
        raise ValueError(f"{path}:{line}: not UTF-8 text ({e.reason} at byte {col} of the line); "
                         "convert the file to UTF-8") from None


def _first_bad_utf8(path: PathLike, start: int) -> tuple[int, int]:
    """(line number, byte offset in it) of the first line from ``start`` on that is not UTF-8."""
    with open_binary(path) as f:
        for n, raw in enumerate(f, 1):
            if n < start:
                continue
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return n, e.start
    return start, 0


def iter_tsv_pairs(path: PathLike, what: str) -> Iterator[tuple[int, str, str]]:
    """Yield ``(line_number, key, value)`` of ``key<TAB>value`` lines (blank lines skipped, both sides
    stripped); ``what`` names the layout in the error for a line without a tab or with a third column (it is
    not glued into the value), e.g. "qid<TAB>text"."""
    for n, line in iter_lines(path):
        if not line.strip():
            continue
        parts = line.split("\t")
        while len(parts) > 2 and not parts[-1].strip():   # trailing tabs: no column
            parts.pop()
        if len(parts) != 2:
            got = "no tab" if len(parts) < 2 else f"{len(parts)} tab-separated columns"
            raise ValueError(f"{path}:{n}: expected '{what}' (2 columns), got {got}: {line[:80]!r}"
                             + ("; replace the tabs inside the text by spaces" if len(parts) > 2 else ""))
        yield n, parts[0].strip(), parts[1].strip()


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
    with naming_full_disk(path), open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())


OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""A full disk, a full quota, the process's file size limit (``ulimit -f``)."""


@contextlib.contextmanager
def naming_full_disk(path: PathLike) -> Iterator[None]:
    """Re-raise running out of space while writing ``path`` as ``OSError(errno, strerror, path)``: Python's and
    Arrow's errors name no file, and numpy's short write ("N requested and M written") has no errno."""
    try:
        yield
    except OSError as e:
        code = e.errno if e.errno in OUT_OF_SPACE else _short_write_errno(e, path)
        if code is None or e.filename is not None:
            raise
        raise OSError(code, os.strerror(code), str(path)) from e


def _short_write_errno(e: OSError, path: PathLike) -> int | None:
    """ENOSPC or EFBIG for numpy's short write (C's fwrite keeps the reason from it), else None."""
    if e.errno is not None or not re.fullmatch(r"\d+ requested and \d+ written", str(e)):
        return None
    try:
        import resource  # POSIX only: elsewhere there is no file size limit to blame
    except ImportError:
        return errno.ENOSPC
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    with contextlib.suppress(OSError):
        if limit != resource.RLIM_INFINITY and os.path.getsize(path) >= limit:
            return errno.EFBIG
    return errno.ENOSPC


_BOM = b"\xef\xbb\xbf"
@contextlib.contextmanager
def atomic_write_bytes(path: PathLike, replace: bool = True) -> Iterator[IO[bytes]]:
    """Write a binary file atomically: into a temporary file next to ``path``, renamed on success.

    A ``.gz`` path is gzip-compressed. The data is fsynced before the rename, so a crash leaves either
    the old file or the whole new one. On any exception (KeyboardInterrupt too) the temporary file is
    removed and ``path`` is left as it was, so readers never see a half-written run or vector file.
    ``replace=False`` publishes with a hard link, which fails (FileExistsError) when ``path`` exists,
    even if another process created it a moment before. The temporary name holds the writer's pid
    (``.<name>.<pid>-<random>.tmp``): one left by a killed writer is deleted by the next write of ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    with _naming_the_target(path, path.parent):   # an unwritable folder: the error names the hidden temporary
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent)
    try:
        with naming_full_disk(path), os.fdopen(fd, "wb") as raw:
            if path.suffix == ".gz":
                # mtime=0 keeps gzip output byte-identical across runs (reproducible files)
                with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped:
                    yield zipped
            else:
                yield raw
            raw.flush()
            os.fsync(raw.fileno())
        apply_umask(tmp)
        if replace:
            os.replace(tmp, path)
        else:
            _link_no_replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename == tmp:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def _naming_the_target(path: Path, folder: Path) -> Iterator[None]:
    """Re-raise an OSError about a temporary file or folder lsr made in ``folder`` for ``path`` (``mkstemp`` /
    ``mkdtemp`` name the random name they tried) as one about ``path``: the output the user asked for."""
    try:
        yield
    except OSError as e:
        if e.filename is None or Path(e.filename).parent != folder or Path(e.filename) == path:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def _link_no_replace(tmp: str, path: Path) -> None:
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(f"{path} already exists (another process may have written it); "
                              "pass --overwrite to replace it") from None
    os.unlink(tmp)


@contextlib.contextmanager
def atomic_directory(path: PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory atomically: yields a temporary directory next to ``path``, renamed to ``path``
    when the block succeeds and deleted when it fails.

    Without ``overwrite`` the rename refuses an existing non-empty ``path`` (FileExistsError), also one
    another process published meanwhile. With it an existing ``path`` is moved aside first and deleted
    last, so a failure leaves the old directory in place, and a kill between the two renames is repaired
    by the next call (or ``InvertedIndex.load``) through :func:`recover_directory`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_directory(path)
    with _naming_the_target(path, path.parent):
        tmp = Path(tempfile.mkdtemp(prefix=f"{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    try:
        apply_umask(tmp, directory=True)
        yield tmp
        _publish(tmp, path, overwrite)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in OUT_OF_SPACE and e.filename and Path(e.filename).is_relative_to(tmp):
            # name the file where the user will look for it, not in the temporary folder just deleted
            raise OSError(e.errno, e.strerror, str(path / Path(e.filename).relative_to(tmp))) from e
        raise


def _publish(tmp: Path, path: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` to ``path``, moving an old one aside first and deleting it last."""
    if not overwrite or not path.exists():
        try:
            os.rename(tmp, path)  # never replaces a non-empty directory (ENOTEMPTY / EEXIST) nor a file
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise FileExistsError(f"{path} already exists (another process may have written it); pass "
                                      "overwrite to replace it") from None
            raise
        fsync_dir(path.parent)
        return
    old = Path(tempfile.mkdtemp(prefix=f"{path.name}.old-{os.getpid()}-", dir=path.parent))
    os.rmdir(old)  # reserve a unique name; rename needs it free
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (a process we may not signal counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _dead_writer(name: str, prefix: str) -> bool:
    """``name`` is ``<prefix><pid>-...`` and that pid is no longer running."""
    pid = name[len(prefix):].split("-", 1)[0]
    return name.startswith(prefix) and pid.isdigit() and not pid_alive(int(pid))


def remove_stale_temporaries(path: PathLike) -> None:
    """Delete the temporary files of ``path`` (``.<name>.<pid>-*.tmp``) whose writer is dead."""
    path = Path(path)
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            if entry.name.endswith(".tmp") and _dead_writer(entry.name, f".{path.name}."):
                with contextlib.suppress(OSError):
                    entry.unlink()


def remove_dead_temporaries(folder: PathLike) -> None:
    """Delete every file temporary (``.<name>.<pid>-*.tmp``) in ``folder`` whose writer is dead, whatever its
    name: a job taking over a folder (e.g. a killed encoding's) may never write those names again."""
    with contextlib.suppress(OSError):
        for entry in Path(folder).iterdir():
            name = entry.name
            if name.startswith(".") and name.endswith(".tmp") and "." in name[1:-4]:
                target = name[1:-4].rsplit(".", 1)[0]
                if _dead_writer(name, f".{target}."):
                    with contextlib.suppress(OSError):
                        entry.unlink()


def recover_directory(path: PathLike) -> None:
    """Repair what killed writers of the directory ``path`` left: the half-swapped ``<name>.old-<pid>-*``
    goes back to ``path`` when ``path`` is missing (roll back) and is deleted when the new ``path`` is
    in place (finish); their ``<name>.tmp-<pid>-*`` folders are deleted. Live writers' are left alone."""
    path = Path(path)
    if not path.parent.is_dir():
        return
    olds, tmps = [], []
    for entry in sorted(path.parent.iterdir(), key=lambda e: e.name):
        if _dead_writer(entry.name, f"{path.name}.old-"):
            olds.append(entry)
        elif _dead_writer(entry.name, f"{path.name}.tmp-"):
            tmps.append(entry)
    for old in olds:
        if not path.exists():
            try:
                os.rename(old, path)
            except OSError:
                continue  # leave it for a later call rather than lose the only copy
            fsync_dir(path.parent)
        else:
            shutil.rmtree(old, ignore_errors=True)
    for tmp in tmps:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_write(path: PathLike, encoding: str = "utf-8") -> Iterator[IO[str]]:
    """Write a text file atomically (see ``atomic_write_bytes``; ``.gz`` paths are gzip-compressed)."""
    with atomic_write_bytes(path) as binary:
        text = io.TextIOWrapper(binary, encoding=encoding, newline="\n")
        yield text
        text.flush()
        text.detach()  # the binary file stays open for atomic_write_bytes to fsync and close


def read_json(path: PathLike, fix: str) -> Any:
    """The JSON value in the UTF-8 file ``path``; one that is not JSON is a one-line ValueError naming the file
    (``json``'s own message names none) and ending with ``fix``."""
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not valid JSON ({e}); {fix}") from None


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically (see ``atomic_write_bytes``)."""
    with atomic_write(path, encoding) as f:
        f.write(text)


def to_numpy(x: Any) -> np.ndarray:
    """A torch tensor (any device) or array-like as a numpy array, without importing torch here."""
    if hasattr(x, "detach"):
        from lsr.utils.host_copy import copy_to_host  # a large result (a whole query set's top-k) at the bus's speed

        x = (copy_to_host(x.detach()) if x.is_cuda else x.detach().cpu()).numpy()  # (a CPU tensor: no copy)
    return np.asarray(x)


def arrow_strings(values: Any) -> Any:
    """A pyarrow string array of ``values`` (returned as is when it already is an Arrow array)."""
    import pyarrow as pa

    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    return pa.array(values if isinstance(values, list) else list(values), pa.string())
