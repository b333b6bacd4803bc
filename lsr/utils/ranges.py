"""The allowed values of a numeric option, in one place for the command line (``lsr.cli.args``) and the config
(``lsr.config``): an out-of-range value is refused with one line naming the value and the range
("must be an integer in [1, 65535], got 99999"); the caller adds the flag or key."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["BLOCK_SIZES", "INT64_MAX", "PARTITIONS", "WORKERS", "NumberRange"]

INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class NumberRange:
    """Integers (``kind=int``) or finite numbers (``kind=float``) from ``low`` to ``high`` (None: unbounded);
    ``low_open`` excludes ``low`` itself (``> 0``); ``power_of_two`` keeps only 1, 2, 4, ..."""

    kind: type = int
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    power_of_two: bool = False

    def describe(self) -> str:
        """What the range accepts: "an integer in [1, 65535]", "a number in (0, 1000]", ">= 1" or
        "a finite number > 0"."""
        what = "a power of two" if self.power_of_two else "an integer" if self.kind is int else "a number"
        low, high = _text(self.low), _text(self.high)
        if self.low is not None and self.high is not None:
            return f"{what} in {'(' if self.low_open else '['}{low}, {high}]"
        if self.low is not None:
            bound = f"{'>' if self.low_open else '>='} {low}"
            return bound if self.kind is int else f"a finite number {bound}"
        return f"{what} <= {high}" if self.high is not None else what

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not in the range ("must be ..., got ..."), or None when it is."""
        if self._holds(value):
            return None
        shown = _shorten(_show(value))
        if not self._is_kind(value):   # ">= 1" alone would not say why 2.5 is refused
            allowed = self.describe()
            return f"must be {allowed if allowed.startswith('a') else self._noun() + ' ' + allowed}, got {shown}"
        beyond_64_bits = self.high is None and isinstance(value, numbers.Integral) and value > INT64_MAX
        limit = f" and <= {INT64_MAX}" if beyond_64_bits else ""
        return f"must be {self.describe()}{limit}, got {shown}"

    def _noun(self) -> str:
        return "an integer" if self.kind is int else "a number"

    def _is_kind(self, value: object) -> bool:
        # numpy's integers and floats count; bool does not, and a float (2.5, or YAML's 3.0) is not an integer
        return isinstance(value, numbers.Integral if self.kind is int else numbers.Real) and not isinstance(value, bool)

    def _holds(self, value: object) -> bool:
        if not self._is_kind(value):
            return False
        if not isinstance(value, numbers.Integral) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (value == self.low and self.low_open)):
            return False
        if value > self._upper():
            return False
        return not self.power_of_two or int(value) & (int(value) - 1) == 0

    def _upper(self) -> float:
        if self.high is not None:
            return self.high
        return INT64_MAX if self.kind is int else math.inf   # an integer still fits the int64 arrays it goes into

    def parse(self, text: str) -> int | float:
        """``text`` as a value of the range; ValueError ("must be ..., got ...") otherwise."""
        try:
            value: int | float = int(text) if self.kind is int else float(text)
        except ValueError:
            raise ValueError(f"expected {self._noun()} ({self.describe()}), got {_shorten(text)!r}") from None
        why = self.problem(value)
        if why is not None:
            raise ValueError(why.rsplit(", got ", 1)[0] + f", got {_shorten(text)}")
        return value


def _shorten(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _text(bound: float | None) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


BLOCK_SIZES = NumberRange(int, 1, 1 << 20, power_of_two=True)
"""Documents per posting block of an index (the kernels shift by log2 of it)."""
WORKERS = NumberRange(int, 0, 1024)
"""Worker processes or threads of one job (0: in-process where a command allows it)."""
PARTITIONS = NumberRange(int, 1, 65536)
"""Partitions of a sharded index (one or more per rank; lsr.parallel caps them at the number of documents)."""
