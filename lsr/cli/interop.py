"""``lsr export-ciff`` / ``lsr import-ciff``: CIFF files to and from lsr index and vector directories."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lsr.cli.args import DEVICE_HELP, device, positive_float

_HELP_VOCAB = ("vocab.txt, tokenizer folder or fitted BM25 encoder folder (lexical.json) giving the term strings "
               "(default: the model folder in the index metadata, else decimal term ids)")


def cmd_export_ciff(args: argparse.Namespace) -> int:
    from lsr.interop.ciff import export_ciff
    from lsr.storage.provenance import check_not_inside

    check_not_inside(args.out, [args.source, args.vocab], "--out")
    header = export_ciff(args.source, args.out, vocab=args.vocab, scale=args.scale, overwrite=args.overwrite)
    print(f"wrote {args.out}: {header.get('num_postings_lists', 0)} postings lists, "
          f"{header.get('num_doc_records', 0)} docs, impacts = round(weight * {args.scale:g})")
    return 0


def cmd_import_ciff(args: argparse.Namespace) -> int:
    from lsr.interop.ciff import import_ciff
    from lsr.utils.devices import resolve_device

    device = resolve_device(args.device) if args.index else "cpu"
    info = import_ciff(args.ciff, args.out, index=args.index, vocab=args.vocab, scale=args.scale, device=device,
                       overwrite=args.overwrite)
    what = "index" if args.index else "vectors"
    print(f"wrote {what} {args.out}: {info['header'].get('num_doc_records', 0)} docs, weight = tf / {info['scale']:g}")
    return 0


def register(sub: argparse._SubParsersAction, command: Callable[..., Any]) -> None:
    p = command(sub, "export-ciff", "write an lsr index or vector directory as a CIFF file (quantised impacts)")
    p.add_argument("source", help="index directory (lsr index) or vector directory (lsr encode)")
    p.add_argument("--out", required=True, help="CIFF file to write")
    p.add_argument("--scale", type=positive_float, default=100.0, help="impact = round(weight * scale), recorded in the header")
    p.add_argument("--vocab", default=None, help=_HELP_VOCAB)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.set_defaults(func=cmd_export_ciff)

    p = command(sub, "import-ciff", "read a CIFF file into an lsr vector directory or index")
    p.add_argument("ciff", help="CIFF file (Anserini, PISA, Terrier or lsr export)")
    p.add_argument("--out", required=True, help="directory to write")
    p.add_argument("--index", action="store_true", help="build an index directory instead of a vector directory")
    p.add_argument("--scale", type=positive_float, default=None,
                   help="weight = tf / scale (default: the scale an lsr export recorded, else 1)")
    p.add_argument("--vocab", default=None, help="vocab.txt / tokenizer / BM25 encoder folder mapping terms to ids "
                                                 "(needed unless the terms are decimal ids)")
    p.add_argument("--device", type=device, default="auto", help=f"{DEVICE_HELP} (index build)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    p.set_defaults(func=cmd_import_ciff)
