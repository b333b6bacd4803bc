"""``lsr encode``: a dataset's documents (or its queries) to Parquet vector shards, in one process or on every
rank of a torchrun job."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsr.cli.args import add_encoder_args, check_bm25_model, encoder_config, encoder_from_args, integer, ranged
from lsr.utils.ranges import WORKERS

if TYPE_CHECKING:  # pragma: no cover
    from lsr.encode.base import Encoder


def cmd_encode(args: argparse.Namespace) -> int:
    from lsr.data.sources import load_dataset
    from lsr.storage.shards import write_vectors
    from lsr.utils.devices import resolve_device

    device = resolve_device(args.device)
    ds = load_dataset(args.dataset, args.split)
    out = Path(args.out)
    _check_encode_out(out, args)
    if args.what == "queries":
        check_bm25_model(args, "--what queries")
        enc = encoder_from_args(args, device)
        qids = list(ds.queries)
        vecs = enc.encode_query([ds.queries[q] for q in qids], ids=qids)
        write_vectors(out, vecs, enc.describe())
        print(f"wrote {len(vecs)} query vectors to {out}")
        return 0
    from lsr.parallel.topology import is_distributed

    if is_distributed():  # every rank of a torchrun job encodes its slice
        from lsr.parallel.encode import encode_on_ranks
        from lsr.parallel.topology import launch_rank

        manifest = encode_on_ranks(ds, out, encoder_config(args), device)
        if launch_rank() == 0:
            print(f"document vectors in {out} ({manifest['n_rows']} documents in {len(manifest['shards'])} shards)")
        return 0
    from lsr.parallel.joblock import FolderLock

    enc = encoder_from_args(args, device)
    lock = FolderLock(out)
    taken = lock.acquire()   # a job writing this folder refuses us here, before a BM25 fit replaces its encoder
    try:
        _encode_documents_here(enc, ds, out, args)
    finally:
        if taken:
            lock.release()
    print(f"document vectors in {out}")
    return 0


def _encode_documents_here(enc: Encoder, ds: Any, out: Path, args: argparse.Namespace) -> None:
    """``lsr encode`` of documents in this one process (the folder's lock held)."""
    from lsr.parallel.encode import encode_dataset_distributed

    if (out / "manifest.json").exists():  # before a new BM25 fit replaces the one these vectors were made with
        from lsr.storage.provenance import check_same_origin
        from lsr.storage.shards import read_manifest

        check_same_origin(read_manifest(out).get("origin"), ds.docs_origin, out)
    if args.encoder == "bm25" and not args.model:
        enc.fit(text for _, text in ds.docs_iter())
        enc.save(out / "encoder")
        print(f"fitted BM25 statistics saved to {out / 'encoder'} (pass it as --model to encode queries)")
    # (encode_corpus, or the rest of an interrupted torchrun encoding of this folder)
    encode_dataset_distributed(enc, ds, out, batch_size=args.batch_size, shard_rows=args.shard_rows, resume=True,
                               doc_top_k=args.doc_top_k, tokenize_workers=args.tokenize_workers,
                               origin=ds.docs_origin)


def _check_encode_out(out: Path, args: argparse.Namespace) -> None:
    """``lsr encode --out``: not inside an input; a new or empty folder, or a vector folder to resume."""
    from lsr.storage.provenance import check_not_inside

    check_not_inside(out, [args.dataset, args.dataset.rsplit(":", 1)[0], args.model], "--out")
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; give a folder for the vectors")
    lsr_names = ("manifest.json", "encoder")
    foreign = [p.name for p in out.iterdir() if p.name not in lsr_names and not p.name.startswith(("part-", "."))]
    if foreign and not (out / "manifest.json").exists():
        raise FileExistsError(f"--out {out} holds files lsr did not write ({foreign[0]}, ...); choose a new or "
                              "empty folder")


def register(sub: argparse._SubParsersAction, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(sub, "encode", "encode a corpus (or its queries) to Parquet vector shards", cmd_encode)
    p.add_argument("--dataset", required=True, help="ir_datasets id or local folder")
    p.add_argument("--out", required=True, help="vector directory to write (resumed when it exists)")
    add_encoder_args(p)
    p.add_argument("--what", choices=("documents", "queries"), default="documents",
                   help="encode the dataset's documents, or its queries (for lsr search --queries)")
    p.add_argument("--shard-rows", type=integer(1), default=100_000, help="documents per shard (the resume granularity)")
    p.add_argument("--doc-top-k", type=integer(1), default=None, help="keep each document's k largest weights")
    p.add_argument("--tokenize-workers", type=ranged(WORKERS), default=None,
                   help="SPLADE: tokenizer processes (default on CUDA: min(8, cores - 4), none below 6 cores; "
                        "0 = in-process)")
