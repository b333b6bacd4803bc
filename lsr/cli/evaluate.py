"""``lsr evaluate``: a run against qrels with ir-measures metric strings."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from lsr.cli.args import check_json_out, print_metrics
from lsr.errors import UsageError


def cmd_evaluate(args: argparse.Namespace) -> int:
    from lsr.evaluation.measures import evaluate, parse_metrics

    try:
        parse_metrics(tuple(args.metrics))
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_json_out(args.json, [args.run, args.qrels])
    print_metrics(evaluate(args.run, args.qrels, metrics=tuple(args.metrics), require_overlap=True), args.json)
    return 0


def register(sub: argparse._SubParsersAction, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(sub, "evaluate", "evaluate a run with ir-measures", cmd_evaluate)
    p.add_argument("--run", required=True, help="TREC or MS MARCO run file")
    p.add_argument("--qrels", required=True, help="qrels file, BEIR folder or ir_datasets id")
    p.add_argument("--metrics", nargs="+", default=["RR@10", "nDCG@10", "R@1000"], help="ir-measures metric strings")
    p.add_argument("--json", help="also write {metric: value} here")
