"""The field rules of lsr's frozen config dataclasses, in one place for the YAML loader and for Python callers.

A config field says what it accepts in its declaration: ``choice`` (one of some names), ``at_least`` / ``within``
(a number in a ``NumberRange``) and its type hint (``int | None``, ``bool``, ``float``, ``tuple[str, ...]`` ...).
``lsr.config``'s loader checks each YAML or ``--set`` value against them (``check_type``, ``check_value``) before it
builds a section; a schema built in Python (``lsr.search.config.SearchConfig(...)``) checks itself with the same two
functions (``check_fields``), so both paths refuse a bad value with the same one line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from lsr.utils.ranges import NumberRange

__all__ = ["at_least", "check_fields", "check_type", "check_value", "choice", "type_hints", "within"]


def choice(default: str | None, options: Sequence[str]) -> Any:
    """A field whose value must be one of ``options`` (None passes where the type allows it)."""
    return field(default=default, metadata={"choices": tuple(options)})


def at_least(default: float | None, minimum: float) -> Any:
    """A field whose value must be >= ``minimum`` (None passes where the type allows it)."""
    return within(default, NumberRange(low=minimum))


def within(default: float | None, allowed: NumberRange) -> Any:
    """A field whose value must lie in ``allowed`` (None passes where the type allows it); the field's type
    decides int or float, ``allowed`` its bounds."""
    return field(default=default, metadata={"range": allowed})


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, once per class (it evaluates every annotation string)."""
    return typing.get_type_hints(cls)


def check_type(value: Any, hint: Any, where: str) -> Any:
    """``value`` if it has the type ``hint`` (int accepted for float, a string for a list of strings), else a
    ValueError naming ``where``."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return value
        base = typing.get_origin(option) or option
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):   # YAML's .nan / .inf: every comparison with them passes or fails silently
                raise ValueError(f"{where} must be a finite number, got {value!r}")
            return float(value)
        if base is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if base in (str, bool) and isinstance(value, base):
            return value
        if base is tuple and isinstance(value, str):
            return (value,)
        if base is tuple and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        if base is Mapping and isinstance(value, Mapping) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value.values()):
            return {str(k): float(v) for k, v in value.items()}
    names = {type(None): "null", tuple: "a list of strings", Mapping: "a mapping of names to finite numbers"}
    want = " or ".join(names.get(typing.get_origin(o) or o, getattr(o, "__name__", str(o))) for o in options)
    raise ValueError(f"{where} must be {want}, got {value!r}")


def check_value(value: Any, f: dataclasses.Field, kind: type, where: str) -> None:
    """``value`` (already of the field's type ``kind``) against the field's choices or range."""
    options, allowed = f.metadata.get("choices"), f.metadata.get("range")
    if options is not None and value is not None and value not in options:
        raise ValueError(f"{where} must be one of {', '.join(options)}, got {value!r}")
    if allowed is not None and value is not None:
        why = dataclasses.replace(allowed, kind=kind).problem(value)
        if why is not None:
            raise ValueError(f"{where} {why}")


def check_fields(obj: Any, where: str) -> None:
    """Check every plain field of the frozen dataclass ``obj`` (type, then choices or range) and store the value as
    ``check_type`` returns it (an int given for a float field becomes a float); nested dataclasses check themselves.
    ``where`` names ``obj`` in the errors ("SearchConfig.triton")."""
    hints = type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            continue
        checked = check_type(value, hints[f.name], f"{where}.{f.name}")
        check_value(checked, f, type(checked), f"{where}.{f.name}")
        if checked is not value:
            object.__setattr__(obj, f.name, checked)
