"""argparse value types of lsr's commands: a bad value exits 2 with argparse's one-line message
("argument --k: must be >= 1, got 0") before any work starts.

A flag names one thing in every command that has it: ``--dataset`` a dataset to read, ``--queries`` the
queries to search (vectors, topics or a dataset; ``lsr encode --what queries`` encodes a dataset's
queries), ``--index`` an index folder to read, ``--out`` what the command writes, ``--model``,
``--device``, ``--k`` (results per query), ``--batch-size`` (texts per encoder batch), ``--metrics``,
``--json`` ({metric: value} written there), ``--overwrite``, ``--backend`` (the search backend, as the
config's ``search.backend``); ``--set section.key=value`` overrides a config key (``lsr.config``)."""

from __future__ import annotations

import argparse
import math
from typing import Callable

from lsr.utils.devices import DEVICE_HELP, is_device_name

__all__ = ["DEVICE_HELP", "device", "integer", "positive_float"]


def integer(minimum: int) -> Callable[[str], int]:
    """An integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if not is_device_name(text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use {DEVICE_HELP}")
    return text
