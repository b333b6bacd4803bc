"""Settings read from environment variables, parsed in one place so that every variable accepts the same
values and a bad one gets the same one-line answer."""

from __future__ import annotations

import math
import os
from typing import overload

__all__ = ["env_seconds"]


@overload
def env_seconds(name: str, default: float, off: None = None) -> float: ...
@overload
def env_seconds(name: str, default: float, off: str) -> float | None: ...


def env_seconds(name: str, default: float, off: str | None = None) -> float | None:
    """The seconds environment variable ``name`` sets: ``default`` when it is unset or blank, else a positive
    finite number; with ``off`` (what 0 turns off, e.g. "the heartbeat") 0 gives None. Anything else is a
    one-line ValueError naming the variable, its value and the default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if off is not None and seconds == 0:
        return None
    if not 0 < seconds < math.inf:
        accepted = f"a number of seconds (0 turns {off} off; " if off is not None else "a positive number of seconds ("
        raise ValueError(f"{name}={raw!r} is not {accepted}unset it for the default {default:g})")
    return seconds
