"""``lsr train CONFIG.yaml [--set section.key=value ...]``: train a SPLADE model (keys: lsr.train.config); under
``torchrun`` every rank trains its part of each global batch (``lsr.train.global_batch``) and rank 0 reports."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from lsr.cli.args import DEVICE_HELP, device

if TYPE_CHECKING:  # pragma: no cover
    from lsr.train.config import TrainConfig


def cmd_train(args: argparse.Namespace) -> int:
    from lsr.errors import UsageError
    from lsr.parallel.topology import is_distributed, launch_rank
    from lsr.train.config import load_train_config
    from lsr.train.graph_step import plan_train_step
    from lsr.utils.devices import resolve_device

    overrides = list(args.set or ())
    if args.device:
        overrides.append(f"device={args.device}")
    if args.resume:
        overrides.append(f"resume={args.resume}")
    if args.overwrite:
        overrides.append("overwrite=true")
    try:
        cfg = load_train_config(args.config, overrides)
        # (optim.cuda_graph=on where the graph cannot run is a config error too: it depends on the device)
        plan_train_step(cfg, resolve_device(cfg.device), is_distributed())
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise UsageError(str(e)) from e
    if args.explain:
        return _explain_training(cfg, resolve_device(cfg.device), is_distributed())
    from lsr.train.trainer import train

    path = train(cfg)
    if launch_rank() == 0:  # one rank of a torchrun job reports
        print(f"trained model written to {path}")
    return 0


def _explain_training(cfg: TrainConfig, device: str, distributed: bool) -> int:
    """``lsr train --explain``: the encode plans of training batches and the step plan; nothing is trained."""
    from lsr.parallel.topology import launch_rank
    from lsr.train.explain import explain_training
    from lsr.utils.plans import explain
    from lsr.utils.runtime import failures_block

    text = explain(explain_training(cfg, device, distributed))
    if launch_rank() == 0:
        print("\n".join(part for part in (text, failures_block()) if part))
    return 0


def register(sub: argparse._SubParsersAction, command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command(sub, "train", "train a SPLADE model from a YAML config (Sparton head, lsr-mined hard negatives)")
    p.add_argument("config", help="YAML training config (see configs/train-*.yaml)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. optim.max_steps=100 (repeatable)")
    p.add_argument("--device", type=device, default=None, help=f"{DEVICE_HELP} (overrides the config's device)")
    p.add_argument("--resume", default=None, help="'auto' (newest checkpoint under the output) or a checkpoint folder")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run in the config's output folder")
    p.add_argument("--explain", action="store_true",
                   help="print the plans training follows (encoder routes, CUDA graph or eager step) and exit")
    p.set_defaults(func=cmd_train)
