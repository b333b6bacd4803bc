"""argparse value types of lsr's commands: a bad value exits 2 with argparse's one-line message naming the
flag, the value and the allowed range ("argument --port: must be an integer in [1, 65535], got 99999") before
any work starts. Every numeric flag is a ``ranged(NumberRange)`` (``integer`` and ``number`` are its short
forms); the config's ``--set`` values are checked against the same ranges (``lsr.utils.schema.within``).

A flag names one thing in every command that has it: ``--dataset`` a dataset to read, ``--queries`` the
queries to search (vectors, topics or a dataset; ``lsr encode --what queries`` encodes a dataset's
queries), ``--index`` an index folder to read, ``--out`` what the command writes, ``--model``,
``--device``, ``--k`` (results per query), ``--batch-size`` (texts per encoder batch), ``--metrics``,
``--json`` ({metric: value} written there), ``--overwrite``, ``--backend`` (the search backend, as the
config's ``search.backend``); ``--set section.key=value`` overrides a config key (``lsr.config``)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from lsr.errors import UsageError
from lsr.utils.devices import DEVICE_HELP, is_device_name
from lsr.utils.ranges import NumberRange

if TYPE_CHECKING:  # pragma: no cover
    from lsr.config import EncoderConfig
    from lsr.encode.base import Encoder

__all__ = ["DEVICE_HELP", "HelpFormatter", "add_device_arg", "add_encoder_args", "check_bm25_model", "check_json_out",
           "device", "encoder_config", "encoder_from_args", "integer", "number", "positive_float", "print_metrics", "ranged"]


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


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device, default="auto", help=DEVICE_HELP)


def add_encoder_args(p: argparse.ArgumentParser) -> None:
    add_device_arg(p)
    p.add_argument("--encoder", choices=("bm25", "splade"), default="bm25", help="encoder kind")
    p.add_argument("--model", help="SPLADE: Hugging Face id or local path; bm25: folder of a fitted encoder")
    p.add_argument("--batch-size", type=integer(1), default=None, help="texts per batch (default: the encoder's own)")
    p.add_argument("--max-length-query", type=integer(1), default=None,
                   help="SPLADE: query tokens kept (default: the checkpoint's, 64 for a plain masked LM)")
    p.add_argument("--max-length-doc", type=integer(1), default=None,
                   help="SPLADE: document tokens kept (default: the checkpoint's, 256 for a plain masked LM)")
    p.add_argument("--split", default=None, help="dataset split (e.g. test, dev) for local BEIR folders")
    p.add_argument("--compile", action="store_true", help="SPLADE: torch.compile the backbone (long corpora)")
    p.add_argument("--attention", choices=("causal", "bidirectional"), default=None,
                   help="SPLADE decoder LLMs (Qwen3, Llama, ...): attention (default: the model's own, causal)")


def encoder_config(args: argparse.Namespace) -> EncoderConfig:
    """The encoder options as a config. BM25: ``--model`` is a fitted encoder folder; SPLADE: a Hugging Face
    id or local path."""
    from lsr.config import EncoderConfig

    if args.encoder == "bm25" and getattr(args, "attention", None) is not None:  # it would be silently ignored
        raise UsageError(f"--attention {args.attention} sets a SPLADE decoder LLM's attention; BM25 has none: drop "
                         "it, or pass --encoder splade --model MODEL")
    corpus = {k: getattr(args, k) for k in ("doc_top_k", "shard_rows", "tokenize_workers") if hasattr(args, k)}
    return EncoderConfig(kind=args.encoder, model=args.model, batch_size=args.batch_size,
                         max_length_query=args.max_length_query, max_length_doc=args.max_length_doc,
                         compile=args.compile, attention=getattr(args, "attention", None), **corpus)


def check_bm25_model(args: argparse.Namespace, what: str) -> None:
    """``--encoder bm25`` (the default) encodes ``what`` only with ``--model``, the statistics a corpus was fitted with."""
    if args.encoder == "bm25" and not args.model:
        raise UsageError(f"{what} with --encoder bm25 (the default) needs --model FOLDER, the fitted BM25 encoder: "
                         "lsr encode --dataset DATA --out VECTORS writes it as VECTORS/encoder (or pass --encoder "
                         "splade --model MODEL)")


def encoder_from_args(args: argparse.Namespace, device: str) -> Encoder:
    from lsr.encode.factory import open_encoder

    return open_encoder(encoder_config(args), device)


def check_json_out(path: str | None, inputs: list[str | None]) -> None:
    """``--json``: never inside an input, and an existing file only if it is a metrics JSON (lsr's own)."""
    if path is None:
        return
    from lsr.storage.provenance import check_not_inside

    check_not_inside(path, inputs, "--json")
    p = Path(path)
    if p.exists():
        try:
            old = json.loads(p.read_text(encoding="utf-8"))
            ours = isinstance(old, dict) and all(isinstance(v, (int, float)) for v in old.values())
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise FileExistsError(f"--json {path} exists and is not a metrics file lsr wrote; choose another path")


def print_metrics(metrics: dict[str, float], json_out: str | None) -> None:
    from lsr.storage.files import atomic_write_text

    for name, value in metrics.items():
        print(f"{name}\t{value:.4f}")
    if json_out:
        atomic_write_text(json_out, json.dumps(metrics, indent=1))
