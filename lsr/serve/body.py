"""Request bodies as JSON: bytes -> the decoded object, with a one-line ``RequestError`` for anything else.

What the standard decoder would let through or word for Python programmers is caught here: a key given twice in
one object (JSON keeps the last silently), nesting beyond the recursion limit, and an integer of more digits than
``int()`` converts (its message advises ``sys.set_int_max_str_digits()``): such an integer is decoded as a
``LongInt``, which every field's range check refuses by its value ("'k' must be an integer in [1, 1000], got an
integer of 5000 digits"). ``request_timeout`` reads the optional ``timeout_ms`` field.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from lsr.utils.ranges import NumberRange

__all__ = ["EXAMPLE", "LongInt", "RequestError", "decode_json", "request_timeout", "shorten", "show_value"]

EXAMPLE = '{"query": "...", "k": 10}'


class RequestError(ValueError):
    """A bad request: ``status`` is the HTTP code (400 malformed, 413 too large, 422 invalid values)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class LongInt:
    """A JSON integer of more digits than Python converts (``sys.get_int_max_str_digits()``, 4,300 by default: the
    conversion takes quadratic time), kept as its digit count; as a number it is +-infinity, so a weight holding
    it is refused as not finite."""

    __slots__ = ("digits", "negative")

    def __init__(self, literal: str) -> None:
        self.negative = literal.startswith("-")
        self.digits = len(literal) - self.negative

    def __float__(self) -> float:
        return float("-inf") if self.negative else float("inf")

    def __str__(self) -> str:
        return f"{'a negative' if self.negative else 'an'} integer of {self.digits} digits"


def show_value(value: Any) -> str:
    """A request's value as an error message quotes it: JSON, at most 40 characters (a LongInt by its size)."""
    return str(value) if isinstance(value, LongInt) else json.dumps(value, default=str)[:40]


def shorten(text: str, limit: int = 200) -> str:
    """One line of at most ``limit`` characters (a decoder message can quote a megabyte of the body)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _RepeatedKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):   # JSON allows repeats and would keep the last one silently
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _RepeatedKey(f"the key {dup!r} is given twice in one object")
    return out


def _int(literal: str) -> int | LongInt:
    try:
        return int(literal)
    except ValueError:   # beyond int()'s digit limit (sys.get_int_max_str_digits())
        return LongInt(literal)


def decode_json(body: bytes) -> Any:
    """The body's JSON value; RequestError (400) for malformed JSON, invalid UTF-8, a repeated key or nesting
    beyond the recursion limit."""
    try:
        try:
            return json.loads(body, object_pairs_hook=_unique_keys)
        except (json.JSONDecodeError, UnicodeDecodeError, _RepeatedKey):
            raise
        except ValueError:  # only int() fails so: decoded again, reading integers one by one (rare, slower)
            return json.loads(body, object_pairs_hook=_unique_keys, parse_int=_int)
    except RecursionError:  # e.g. 100,000 '[': the decoder recurses once per level
        raise RequestError(f"the body nests arrays or objects too deeply (Python's limit is "
                           f"{sys.getrecursionlimit()} levels); send e.g. {EXAMPLE}", 400) from None
    except ValueError as e:  # malformed JSON, invalid UTF-8 (UnicodeDecodeError), a repeated key
        raise RequestError(f"the body is not valid JSON ({shorten(str(e))}); send e.g. {EXAMPLE}", 400) from None


def request_timeout(payload: Any, limit_s: float) -> float:
    """The seconds a request may wait for its answer: its ``timeout_ms`` (taken out of ``payload``), which may
    only shorten the server's ``limit_s``; ``limit_s`` without it. RequestError (422) naming the field and its
    range for any other value."""
    if not isinstance(payload, dict) or "timeout_ms" not in payload:
        return limit_s
    value = payload.pop("timeout_ms")
    allowed = NumberRange(float, 0, limit_s * 1000, low_open=True)
    if isinstance(value, LongInt) or allowed.problem(value) is not None:
        raise RequestError(f"'timeout_ms' must be a number in {allowed.describe().removeprefix('a number in ')} "
                           f"(at most the server's --request-timeout), got {show_value(value)}")
    return value / 1000
