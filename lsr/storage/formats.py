"""The one check of a file's format version (index ``meta.json``, vector ``manifest.json``, BM25
``lexical.json``, ...): a file from a newer lsr is refused with one line saying so and what to do, never read
with rules it was not written for; a version that no lsr writes (0, -1, "2", true) marks the file corrupt."""

from __future__ import annotations

import os

__all__ = ["check_format_version"]


def check_format_version(file: str | os.PathLike, version: object, newest: int, oldest: int = 1,
                         rebuild: str = "rebuild it") -> int:
    """``version`` when ``oldest <= version <= newest``; else a one-line ValueError naming ``file``, the version
    found and the ones this lsr reads, ending in ``rebuild`` (how to make the file again)."""
    reads = f"format version {newest}" if oldest == newest else f"format versions {oldest} to {newest}"
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{file}: format version {version!r} is not one lsr writes (this lsr reads {reads}); "
                         f"the file is corrupt: {rebuild}")
    if version > newest:
        raise ValueError(f"{file} was written by a newer lsr (format version {version}); this lsr reads {reads}: "
                         f"upgrade lsr or {rebuild}")
    if version < oldest:
        raise ValueError(f"{file} was written by an older lsr (format version {version}); this lsr reads {reads}: "
                         f"{rebuild}")
    return version
