"""``lsr index``: an inverted index (or a sharded one, ``--partitions``) from document vectors; ``--metadata``
attaches filter columns from the corpus to it (or, without ``--vectors``, to the existing index at ``--out``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lsr.cli.args import add_device_arg, integer, ranged
from lsr.errors import UsageError
from lsr.utils.ranges import BLOCK_SIZES, PARTITIONS, WORKERS


def _metadata_columns(args: argparse.Namespace) -> list[str] | None:
    """The checked ``--metadata`` / ``--metadata-columns`` / ``--vectors`` combination; the columns asked for."""
    if args.vectors is None and args.metadata is None:
        raise UsageError("--vectors is required (or --metadata FILE alone, to attach columns to the index at --out)")
    if args.metadata_columns is not None and args.metadata is None:
        raise UsageError("--metadata-columns needs --metadata FILE (the corpus file the columns come from)")
    if args.vectors is None and args.partitions is not None:
        raise UsageError("--partitions needs --vectors (attaching --metadata to an existing index keeps its layout)")
    if args.metadata is not None and args.partitions is not None:
        from lsr.parallel.topology import is_distributed

        if is_distributed():   # every rank would attach: build first, then attach once, from one process
            raise UsageError(f"--metadata with --partitions under torchrun: build the index first, then attach the "
                             f"columns from one process: lsr index --metadata {args.metadata} --out {args.out}")
    if args.metadata is not None:
        from pathlib import Path

        if not Path(args.metadata).is_file():   # before a build that would be lost time
            raise FileNotFoundError(f"--metadata {args.metadata}: no such file")
    if args.metadata_columns is None:
        return None
    columns = [c.strip() for c in args.metadata_columns.split(",")]
    if not all(columns):
        raise UsageError(f"--metadata-columns {args.metadata_columns!r}: a comma-separated list of column names, "
                         "such as year,lang")
    return columns


def _read_metadata(args: argparse.Namespace, columns: list[str] | None, docnos: list[str]) -> Any:
    """``--metadata``'s columns joined onto ``docnos`` (read before the index is saved: a bad file costs no build)."""
    from lsr.index.metadata import metadata_from_corpus

    return metadata_from_corpus(args.metadata, docnos, columns)


def _save_metadata(args: argparse.Namespace, table: Any, docnos: list[str]) -> None:
    from lsr.index.metadata import save_metadata

    missing = int(table.schema.metadata[b"lsr.missing"])
    target = save_metadata(args.out, table, overwrite=args.overwrite, docnos=docnos)
    note = f" ({missing} not in {args.metadata}: null)" if missing else ""
    print(f"attached metadata columns {', '.join(table.column_names)} of {len(docnos)} documents{note} -> {target}")


def _attach(args: argparse.Namespace, columns: list[str] | None) -> None:
    """Join ``--metadata``'s columns onto the existing index at ``--out`` and write them beside it."""
    from lsr.index.metadata import index_docnos

    docnos = index_docnos(args.out)
    _save_metadata(args, _read_metadata(args, columns, docnos), docnos)


def cmd_index(args: argparse.Namespace) -> int:
    from lsr.index.inverted import InvertedIndex
    from lsr.utils.devices import resolve_device

    columns = _metadata_columns(args)
    if args.vectors is None:
        _attach(args, columns)
        return 0
    device = resolve_device(args.device)
    if args.partitions is not None:  # under torchrun every rank builds its partitions on its own device
        from lsr.index.sharded import check_partition_count
        from lsr.parallel.sharded_build import build_sharded_index
        from lsr.storage.shards import read_manifest

        n_docs = int(read_manifest(args.vectors)["n_rows"])
        try:  # a count above the documents is a bad flag value: refused before any rank starts work
            check_partition_count(n_docs, args.partitions, args.vectors)
        except ValueError as e:
            raise UsageError(str(e)) from None

        n_p = build_sharded_index(args.vectors, args.partitions, args.out, device=device, block_size=args.block_size,
                                  overwrite=args.overwrite, workers=args.workers, postings=args.postings)
        print(f"indexed {args.vectors} into {n_p} partitions -> {args.out}")
        if args.metadata is not None:   # one file at the top, in global doc order
            _attach(args, columns)
        return 0
    # metadata from the manifest
    index = InvertedIndex.build(args.vectors, device=device, block_size=args.block_size, postings=args.postings)
    table = None if args.metadata is None else _read_metadata(args, columns, index.docnos)
    index.save(args.out, overwrite=args.overwrite)
    print(f"indexed {index.n_docs} documents, {index.n_postings} postings ({index.postings} layout) -> {args.out}")
    if table is not None:
        _save_metadata(args, table, index.docnos)
    return 0


def register(sub: argparse._SubParsersAction, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(sub, "index", "build a GPU inverted index from document vectors", cmd_index)
    p.add_argument("--vectors", default=None, help="vector directory written by lsr encode (required unless "
                   "--metadata attaches columns to the existing index at --out)")
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--metadata", default=None, metavar="FILE",
                   help="corpus file (.jsonl, .jsonl.gz, .parquet with an _id / docno / docid / id column) whose "
                        "columns filters can use: written as metadata.parquet beside the index, in doc order")
    p.add_argument("--metadata-columns", default=None, metavar="A,B",
                   help="with --metadata: the columns to keep (default: all but the id and text / title / contents / "
                        "body)")
    p.add_argument("--block-size", type=ranged(BLOCK_SIZES), default=65536, help="documents per posting block")
    p.add_argument("--postings", choices=("auto", "float32", "compact"), default="auto",
                   help="posting layout: compact (4 bytes a posting: 16-bit local doc ids and weights; needs weights "
                        "exact in bf16/fp16, e.g. vectors encoded in bf16), float32 (8 bytes), or auto (compact where "
                        "the weights allow it; the default); same results")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index at --out (without --vectors: its metadata.parquet)")
    p.add_argument("--partitions", type=ranged(PARTITIONS), default=None,
                   help="write a sharded index of P contiguous doc ranges (one per rank of a distributed search)")
    p.add_argument("--workers", type=integer(1, int(WORKERS.high)), default=1, help="with --partitions: partitions built at once (threads)")
    add_device_arg(p)
