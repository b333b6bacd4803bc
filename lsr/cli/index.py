"""``lsr index``: an inverted index (or a sharded one, ``--partitions``) from document vectors; ``--metadata``
attaches filter columns from the corpus to it (or, without ``--vectors``, to the existing index at ``--out``).
``--live`` makes a live index (``lsr.live``) instead, which ``--add`` / ``--upsert`` / ``--delete`` / ``--compact``
update in place."""

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


UPDATE_FLAGS = ("add", "upsert", "delete", "compact")


def _check_live_flags(args: argparse.Namespace) -> None:
    """``--live`` and the update flags: the combinations they refuse, one line each, before any work."""
    updates = [f"--{f}" for f in UPDATE_FLAGS if getattr(args, f) not in (None, False)]
    if args.delete_missing is not None and args.delete is None:
        raise UsageError("--delete-missing says what --delete FILE does with docnos the index lacks: give --delete FILE")
    if len([u for u in updates if u != "--compact"]) > 1:
        raise UsageError(f"{' and '.join(u for u in updates if u != '--compact')}: one update a command (each is "
                         "one logged update): run lsr index once for each")
    if updates:
        for flag, value in (("--vectors", args.vectors), ("--metadata", args.metadata), ("--partitions", args.partitions)):
            if value is not None:
                raise UsageError(f"{' / '.join(updates)} changes the live index at --out {args.out}; {flag} builds a "
                                 f"new index: drop {flag} (updates take their vectors with --add / --upsert V)")
        return
    if args.live:
        for flag, value in (("--partitions", args.partitions), ("--metadata", args.metadata)):
            if value is not None:
                raise UsageError(f"--live makes one live index without metadata columns; {flag} is not offered on "
                                 f"live indexes yet: drop {flag} or --live")
        if args.vectors is None:
            raise UsageError("--live needs --vectors V: the documents the live index starts from")
        if args.overwrite:
            raise UsageError(f"--live never replaces a folder: remove --out {args.out} yourself, or give a new --out")


def _create_live(args: argparse.Namespace, device: str) -> int:
    """``lsr index --vectors V --out L --live``: a new live index over V (its base; no update yet)."""
    from pathlib import Path

    from lsr.index.inverted import InvertedIndex
    from lsr.live import LiveIndex

    if Path(args.out).exists():   # before the build, which would be lost time
        raise FileExistsError(f"--out {args.out} already exists: --live makes a new folder; update a live index "
                              f"with --add / --upsert / --delete, or give a new --out")
    base = InvertedIndex.build(args.vectors, device=device, block_size=args.block_size, postings=args.postings)
    with LiveIndex.create(args.out, base) as live:
        print(f"made live index {args.out}: {live.n_docs:,} documents, {base.n_postings:,} postings "
              f"({base.postings} layout); update it with lsr index --out {args.out} --add / --upsert / --delete")
    return 0


def _update_vectors(args: argparse.Namespace, flag: str, base_metadata: Any) -> Any:
    """The document vectors of ``--add`` / ``--upsert`` V, checked against the live index's encoder."""
    from lsr.interop.vectors import read_doc_vectors, recorded_encoder
    from lsr.search.searcher import check_compatible

    path = getattr(args, flag)
    vectors = read_doc_vectors(path)
    try:
        check_compatible(recorded_encoder(path), base_metadata)
    except ValueError as e:   # its text speaks of queries: say it of these documents
        detail = str(e)[str(e).find("(") + 1:str(e).rfind(")")].replace("queries ", "documents ")
        raise ValueError(f"--{flag} {path} was encoded differently from the live index ({detail}): encode the "
                         "documents with the index's encoder") from None
    return vectors


def _apply_update(args: argparse.Namespace, live: Any) -> str:
    """Apply the one ``--add`` / ``--upsert`` / ``--delete`` given; what it did, as the printed line."""
    before = live.n_docs
    if args.delete is not None:
        from lsr.search.filters import read_docnos

        docnos = read_docnos(args.delete)
        if not docnos:
            raise ValueError(f"--delete {args.delete} holds no docnos: give one docno per line")
        try:
            seq = live.delete(docnos, missing=args.delete_missing or "error")
        except KeyError as e:   # (a KeyError's str() quotes its text)
            raise ValueError(f"--delete {args.delete}: {str(e.args[0]).split('; pass')[0]}; pass --delete-missing "
                             "ignore to skip them") from None
        gone = before - live.n_docs
        skipped = len(set(docnos)) - gone
        done, note = f"deleted {gone:,} documents from", f"; {skipped:,} listed not in it, ignored" if skipped else ""
    else:
        flag = "add" if args.add is not None else "upsert"
        vectors = _update_vectors(args, flag, live.base.metadata)
        try:
            seq = live.add(vectors) if flag == "add" else live.upsert(vectors)
        except KeyError as e:
            raise ValueError(f"--add {args.add}: {str(e.args[0]).replace('use upsert', 'use --upsert')}") from None
        new, note = live.n_docs - before, ""
        done = (f"added {new:,} documents to" if flag == "add" else
                f"upserted {len(vectors):,} documents ({len(vectors) - new:,} replaced, {new:,} new) in")
    return f"{done} {args.out} (update {seq}; {live.n_docs:,} live documents{note})"


def _update_live(args: argparse.Namespace, device: str) -> int:
    """``lsr index --out L --add / --upsert / --delete / --compact``: the update, then the compaction."""
    from lsr.live import LiveIndex, is_live

    if not is_live(args.out):
        given = " / ".join(f"--{f}" for f in UPDATE_FLAGS if getattr(args, f) not in (None, False))
        raise UsageError(f"--out {args.out} is not a live index (no live.json), and {given} works on a live index only: "
                         f"make one with lsr index --vectors V --out {args.out} --live")
    with LiveIndex.open(args.out, device=device) as live:
        if any(getattr(args, f) is not None for f in ("add", "upsert", "delete")):
            print(_apply_update(args, live))
        if args.compact:
            live.compact()
            print(f"compacted {args.out} into generation {live.generation} ({live.n_docs:,} documents; update "
                  f"{live.seq} is the last it holds)")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from lsr.index.inverted import InvertedIndex
    from lsr.utils.devices import resolve_device

    _check_live_flags(args)
    if any(getattr(args, f) not in (None, False) for f in UPDATE_FLAGS):
        return _update_live(args, resolve_device(args.device))
    if args.live:
        return _create_live(args, resolve_device(args.device))
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
    p.add_argument("--live", action="store_true", help="make a live index at --out (a new folder) from --vectors: "
                   "documents added, replaced and deleted later without a rebuild (docs/guide/filters.md)")
    # (one of --add / --upsert / --delete a command: checked in _check_live_flags, for a one-line error)
    p.add_argument("--add", metavar="V", default=None,
                        help="add the documents of vector folder V (new docnos) to the live index at --out")
    p.add_argument("--upsert", metavar="V", default=None,
                        help="add the documents of vector folder V to the live index at --out, replacing those "
                             "whose docnos it holds (a replaced document moves to the end)")
    p.add_argument("--delete", metavar="FILE", default=None,
                        help="delete these documents (one docno per line) from the live index at --out")
    p.add_argument("--delete-missing", choices=("error", "ignore"), default=None,
                   help="docnos of --delete FILE that the index lacks: an error (the default), or skipped")
    p.add_argument("--compact", action="store_true", help="fold the live index's updates into a new base (after the "
                   "update given with it, if any)")
    add_device_arg(p)
