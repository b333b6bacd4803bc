"""``lsr index``: an inverted index (or a sharded one, ``--partitions``) from document vectors."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from lsr.cli.args import add_device_arg, integer, ranged
from lsr.errors import UsageError
from lsr.utils.ranges import BLOCK_SIZES, PARTITIONS, WORKERS


def cmd_index(args: argparse.Namespace) -> int:
    from lsr.index.inverted import InvertedIndex
    from lsr.utils.devices import resolve_device

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
        return 0
    # metadata from the manifest
    index = InvertedIndex.build(args.vectors, device=device, block_size=args.block_size, postings=args.postings)
    index.save(args.out, overwrite=args.overwrite)
    print(f"indexed {index.n_docs} documents, {index.n_postings} postings ({index.postings} layout) -> {args.out}")
    return 0


def register(sub: argparse._SubParsersAction, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(sub, "index", "build a GPU inverted index from document vectors", cmd_index)
    p.add_argument("--vectors", required=True, help="vector directory written by lsr encode")
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--block-size", type=ranged(BLOCK_SIZES), default=65536, help="documents per posting block")
    p.add_argument("--postings", choices=("auto", "float32", "compact"), default="auto",
                   help="posting layout: compact (4 bytes a posting: 16-bit local doc ids and weights; needs weights "
                        "exact in bf16/fp16, e.g. vectors encoded in bf16), float32 (8 bytes), or auto (compact where "
                        "the weights allow it; the default); same results")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index at --out")
    p.add_argument("--partitions", type=ranged(PARTITIONS), default=None,
                   help="write a sharded index of P contiguous doc ranges (one per rank of a distributed search)")
    p.add_argument("--workers", type=integer(1, int(WORKERS.high)), default=1, help="with --partitions: partitions built at once (threads)")
    add_device_arg(p)
