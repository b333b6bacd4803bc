"""What produced an artefact, and the checks that keep lsr from reusing or writing over the wrong thing.

* ``file_origin(path)``: the facts recorded for a source file (resolved path, size, modification time in
  ns). Cheap for any size of corpus; a copy (new mtime) or an edit of the file counts as other documents.
* ``check_same_origin(recorded, current, artefact)``: one-line ValueError when an artefact (a vector
  folder, a BM25 fit, an ``lsr run`` output folder) was made from other documents than the ones at hand.
  An artefact without a record (written by an older lsr) passes.
* ``check_not_inside(out, inputs)``: an output may not be an input or lie inside one (``--set output=``
  the dataset folder would otherwise write over the user's files).
* ``file_in_the_way(out)``: the existing file among an output path's parents, which makes it unwritable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["check_not_inside", "check_same_origin", "describe_origin", "file_in_the_way", "file_origin"]


def file_origin(path: str | os.PathLike) -> dict[str, Any]:
    """``{"file", "size", "mtime_ns"}`` of a source file."""
    p = Path(path).resolve()
    st = p.stat()
    return {"file": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def describe_origin(origin: Mapping[str, Any]) -> str:
    if "file" in origin:
        return str(origin["file"])
    if "ir_datasets" in origin:
        return f"ir_datasets {origin['ir_datasets']!r}"
    return ", ".join(f"{k}={v}" for k, v in origin.items()) or "unknown documents"


def check_same_origin(recorded: Mapping[str, Any] | None, current: Mapping[str, Any] | None,
                      artefact: str | os.PathLike, fix: str = "") -> None:
    """Raise ValueError when ``artefact`` was made from other documents than ``current``."""
    if not recorded or not current or dict(recorded) == dict(current):
        return
    fix = fix or f"choose another output folder, or delete {artefact}"
    if recorded.get("file") is not None and recorded.get("file") == current.get("file"):
        changed = [k for k in ("size", "mtime_ns") if recorded.get(k) != current.get(k)]
        raise ValueError(f"{artefact} was made from {recorded['file']}, which has changed since "
                         f"({' and '.join(changed)} differ); {fix}")
    raise ValueError(f"{artefact} was made from {describe_origin(recorded)}, not from "
                     f"{describe_origin(current)}; {fix}")


def check_not_inside(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None], what: str = "output") -> None:
    """ValueError when ``out`` is one of ``inputs`` or lies inside one of them (None entries skipped)."""
    target = Path(out).resolve()
    for item in inputs:
        if item is None or not Path(item).exists():
            continue
        source = Path(item).resolve()
        if target == source or source in target.parents:
            where = "is the input" if target == source else "is inside the input"
            raise ValueError(f"{what} {out} {where} {item}; lsr never writes into its inputs: "
                             "choose an output path outside it")


def check_replaceable(path: str | os.PathLike, is_ours: Callable[[str], bool], kind: str) -> None:
    """Before ``overwrite`` replaces the folder ``path`` (as a whole): it must be empty or hold only entries
    ``is_ours`` accepts (an lsr ``kind``'s files); a user's file in it would be deleted with it."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"refusing to overwrite {path}: it is not an lsr {kind} directory")
    foreign = sorted(p.name for p in path.iterdir() if not is_ours(p.name))
    if foreign:
        raise ValueError(f"refusing to overwrite {path}: it holds {foreign[0]!r}, which is not part of an lsr {kind} "
                         "(replacing the folder would delete it); move it away or choose another --out")


def file_in_the_way(path: str | os.PathLike) -> Path | None:
    """The nearest existing parent of ``path`` when it is a file (``notes.txt`` for ``notes.txt/run/x``): nothing
    can be written below it. None when the parents are (or can be made) folders."""
    for parent in Path(path).parents:
        if parent.exists() or parent.is_symlink():
            return None if parent.is_dir() else parent
    return None
