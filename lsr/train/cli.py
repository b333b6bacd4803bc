"""``lsr train CONFIG.yaml [--set key=value ...]``: train a SPLADE model (see lsr.train.config)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def cmd_train(args: argparse.Namespace) -> int:
    from lsr.cli import UsageError
    from lsr.train.config import load_train_config

    overrides = list(args.set or ())
    if args.device:
        overrides.append(f"device={args.device}")
    if args.resume:
        overrides.append(f"resume={args.resume}")
    try:
        cfg = load_train_config(args.config, overrides)
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise UsageError(str(e)) from e
    from lsr.train.trainer import Trainer

    path = Trainer(cfg).run()
    print(f"trained model written to {path}")
    return 0


def register(sub: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command(sub, "train", "train a SPLADE model from a YAML config (Sparton head, lsr-mined hard negatives)")
    p.add_argument("config", help="YAML training config (see configs/train-*.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N (overrides the config)")
    p.add_argument("--resume", default=None, help="'auto' (newest checkpoint under the output) or a checkpoint folder")
    p.set_defaults(func=cmd_train)
