"""argparse value types of lsr's commands: a bad value exits 2 with argparse's one-line message naming the
flag, the value and the allowed range ("argument --port: must be an integer in [1, 65535], got 99999") before
any work starts. Every numeric flag is a ``ranged(NumberRange)`` (``integer`` and ``number`` are its short
forms); the config's ``--set`` values are checked against the same ranges (``lsr.config.within``).

A flag names one thing in every command that has it: ``--dataset`` a dataset to read, ``--queries`` the
queries to search (vectors, topics or a dataset; ``lsr encode --what queries`` encodes a dataset's
queries), ``--index`` an index folder to read, ``--out`` what the command writes, ``--model``,
``--device``, ``--k`` (results per query), ``--batch-size`` (texts per encoder batch), ``--metrics``,
``--json`` ({metric: value} written there), ``--overwrite``, ``--backend`` (the search backend, as the
config's ``search.backend``); ``--set section.key=value`` overrides a config key (``lsr.config``)."""

from __future__ import annotations

import argparse
import re
from typing import Callable

from lsr.utils.devices import DEVICE_HELP, is_device_name
from lsr.utils.ranges import NumberRange

__all__ = ["DEVICE_HELP", "HelpFormatter", "device", "integer", "number", "positive_float", "ranged"]


def ranged(allowed: NumberRange) -> Callable[[str], int | float]:
    """The argparse type of a numeric flag: a value outside ``allowed`` exits 2 with
    "argument --port: must be an integer in [1, 65535], got 99999"."""

    def parse(text: str) -> int | float:
        try:
            return allowed.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = allowed.describe()  # argparse names the type by it in some messages
    return parse


def integer(minimum: int, maximum: int | None = None, *, power_of_two: bool = False) -> Callable[[str], int]:
    """An integer in [``minimum``, ``maximum``]."""
    return ranged(NumberRange(int, minimum, maximum, power_of_two=power_of_two))  # type: ignore[return-value]


def number(minimum: float | None = None, maximum: float | None = None, *, above: float | None = None,
           ) -> Callable[[str], float]:
    """A finite number >= ``minimum`` (or > ``above``) and <= ``maximum``."""
    low, low_open = (above, True) if above is not None else (minimum, False)
    return ranged(NumberRange(float, low, maximum, low_open=low_open))  # type: ignore[return-value]


positive_float = number(above=0)
"""A finite number > 0."""


def device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if not is_device_name(text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use {DEVICE_HELP}")
    return text


# a help text that says what its flag does by default: "(default: the checkpoint's)", "...; the default)", "off by default"
STATES_DEFAULT = re.compile(r"\(default\b|\bthe default\b|\bby default\b", re.IGNORECASE)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with one default per flag: argparse's "(default: X)" is added only where it says something the help
    does not, i.e. not where the help already states the default, not for a required flag or a switch, and not
    for an unset value (None: the help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if (STATES_DEFAULT.search(action.help or "") or action.required or action.nargs == 0 or action.default is None
                or action.default is argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)
