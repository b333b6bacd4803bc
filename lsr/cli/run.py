"""``lsr run CONFIG.yaml``: encode -> index -> search -> evaluate from one config (every rank of a torchrun job)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from lsr.cli.args import check_json_out, print_metrics
from lsr.config import RunConfig
from lsr.errors import UsageError


def cmd_run(args: argparse.Namespace) -> int:
    from lsr.config import load_config
    from lsr.pipeline import run_pipeline

    try:
        cfg = load_config(args.config, args.set or ())
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise UsageError(str(e)) from e
    check_json_out(args.json, [args.config, cfg.data.dataset, cfg.data.dataset.rsplit(":", 1)[0]])
    if args.check and cfg.evaluation.expected and not cfg.expected_holds():
        on = cfg.evaluation.expected_on
        raise UsageError(f"--check: the config's expected values were measured on {on.dataset} (split {on.split}), "
                         f"not on {cfg.data.dataset} (split {cfg.data.split}); drop --check, or set evaluation.expected "
                         "and evaluation.expected_on for this data")
    from lsr.parallel.topology import launch_rank

    if args.explain:
        return _explain_run(cfg)
    result = run_pipeline(cfg, overwrite=args.overwrite)  # under torchrun: every rank, rank 0's result
    if launch_rank() == 0:  # one rank of a torchrun job reports
        print(f"# {cfg.name}: {result['n_docs']} docs, {result['n_queries']} queries on {result['device']}; "
              f"run written to {result['files']['run_trec']}")
        print_metrics(result["metrics"], args.json)
    missed = cfg.evaluation.missed(result["metrics"]) if args.check else {}
    if missed:
        print(f"metrics differ from the config's expected values by more than {cfg.evaluation.tolerance}: {missed}",
              file=sys.stderr)
    return 1 if missed else 0


def _explain_run(cfg: RunConfig) -> int:
    """``lsr run --explain``: the run's plans (encode, ranks, search), one block each; nothing runs or is written."""
    import os

    from lsr.parallel.topology import launch_rank
    from lsr.pipeline.explain import explain_run
    from lsr.utils.plans import explain
    from lsr.utils.runtime import failures_block

    try:
        text = explain(explain_run(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1"))))
    except ValueError as e:   # a layout the ranks cannot share, a missing model or dataset: the user's to fix
        raise UsageError(str(e)) from e
    if launch_rank() == 0:
        print("\n".join(part for part in (text, failures_block()) if part))
    return 0


def register(sub: argparse._SubParsersAction, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(sub, "run", "encode -> index -> search -> evaluate from a YAML config", cmd_run)
    p.add_argument("config", help="YAML config (see configs/; every key: lsr/config.py)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. search.k=100 (repeatable)")
    p.add_argument("--json", help="also write {metric: value} here")
    p.add_argument("--check", action="store_true", help="exit 1 if metrics miss the config's expected values")
    p.add_argument("--explain", action="store_true",
                   help="print the plans the run follows (encoders, ranks, search) and exit; nothing is written")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an output folder lsr did not write, or one made for other documents")
