"""The one rule for query and document ids that go into run files: non-empty and printable, no whitespace.

``check_id`` raises for one id; ``first_bad_id`` / ``first_bad_arrow_id`` find the first bad one of many in one pass.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ID_RULE", "check_id", "first_bad_arrow_id", "first_bad_id", "id_problem"]

ID_RULE = ("ids in TREC / MS MARCO run and qrels files are whitespace-separated columns, so an id must be "
           "non-empty and printable (no whitespace, control, invisible or unassigned characters); fix the id "
           "in the input (e.g. replace those characters with '_')")


def _clean(text: str) -> bool:
    # str.isprintable() is False for every Unicode separator (Z*) but the ASCII space, and for every
    # control, format (invisible), surrogate, private-use or unassigned code point (C*).
    return text.isprintable() and " " not in text


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a query or document id in a run file, or None when it can."""
    if not value:
        return "is empty"
    if _clean(value):
        return None
    pos, c = next((i, c) for i, c in enumerate(value) if not _clean(c))
    category = unicodedata.category(c)
    name = unicodedata.name(c, "control character" if category == "Cc" else f"category {category}").lower()
    return f"contains U+{ord(c):04X} ({name}) at position {pos}"


def check_id(value: str, what: str, where: str) -> None:
    """Raise ValueError ``"<where>: <what> <value> <problem>; <rule and fix>"`` for an invalid id."""
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(f"{where}: {what} {value!r} {problem}; {ID_RULE}")


def first_bad_id(ids: Sequence[str]) -> int | None:
    """Position of the first id that fails :func:`id_problem`, or None; one C-level pass over all ids."""
    if not ids:
        return None
    if all(ids) and _clean("".join(ids)):
        return None
    return next(i for i, v in enumerate(ids) if id_problem(v) is not None)


def first_bad_arrow_id(ids: Any) -> int | None:
    """:func:`first_bad_id` for a pyarrow string array: a numpy pass over Arrow's byte buffer vouches
    for plain printable-ASCII ids without making Python strings; anything else is judged in Python."""
    import pyarrow as pa

    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    n = len(ids)
    if n == 0:
        return None
    if ids.null_count == 0 and ids.type in (pa.string(), pa.large_string()):
        _, offsets_buf, data_buf = ids.buffers()
        width = 8 if ids.type == pa.large_string() else 4
        offsets = np.frombuffer(offsets_buf, np.int32 if width == 4 else np.int64, count=n + 1,
                                offset=ids.offset * width)
        data = np.frombuffer(data_buf, np.uint8)[offsets[0]:offsets[-1]] if data_buf is not None else np.empty(0)
        if (offsets[1:] > offsets[:-1]).all() and ((data > 0x20) & (data < 0x7F)).all():
            return None
    return first_bad_id([v or "" for v in ids.to_pylist()])
