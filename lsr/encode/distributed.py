"""Corpus encoding over the ranks of a torchrun job: one vector directory, identical to one process's.

The stream of n documents is cut into blocks of ``shard_rows`` (the shards a single process would
write); rank r of W encodes the contiguous blocks [nb * r // W, nb * (r + 1) // W) into its own resumable
vector directory ``OUT/rank-RRRRR-of-WWWWW/`` (``encode_corpus`` with ``stream_offset``, so its windows
and batches are the single-process run's). After a barrier rank 0 writes ``OUT/manifest.json`` listing
every rank's shards in stream order (``rank-00000-of-00002/part-00000.parquet``, ...): readers see one
ordinary vector directory. A killed job resumes rank by rank when restarted with the same world size.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lsr.encode.base import Encoder
from lsr.encode.corpus import encode_corpus
from lsr.io import atomic_write_text
from lsr.shards import MANIFEST, read_manifest

__all__ = ["encode_corpus_distributed", "merge_rank_manifests", "rank_slice"]


def rank_slice(n_docs: int, shard_rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Docs [start, stop) of ``rank``: whole blocks of ``shard_rows``, contiguous, in rank order."""
    n_blocks = -(-n_docs // shard_rows)
    b0, b1 = n_blocks * rank // world_size, n_blocks * (rank + 1) // world_size
    return b0 * shard_rows, min(n_docs, b1 * shard_rows)


def _rank_dir(rank: int, world_size: int) -> str:
    return f"rank-{rank:05d}-of-{world_size:05d}"


def merge_rank_manifests(out_dir: str | os.PathLike, world_size: int) -> dict[str, Any]:
    """Write ``out_dir/manifest.json`` from the complete rank directories; returns it."""
    out = Path(out_dir)
    merged: dict[str, Any] | None = None
    for r in range(world_size):
        sub = _rank_dir(r, world_size)
        m = read_manifest(out / sub)
        if not m.get("complete"):
            raise ValueError(f"{out / sub} is unfinished: rerun the job to resume it")
        if merged is None:
            merged = {**m, "n_rows": 0, "nnz": 0, "shards": [], "complete": True}
        elif (m["vocab_size"], m.get("metadata")) != (merged["vocab_size"], merged.get("metadata")):
            raise ValueError(f"{out / sub} was written with other encoder settings than {_rank_dir(0, world_size)}")
        merged["shards"] += [{**s, "file": f"{sub}/{s['file']}"} for s in m["shards"]]
        merged["n_rows"] += m["n_rows"]
        merged["nnz"] += m["nnz"]
    assert merged is not None
    atomic_write_text(out / MANIFEST, json.dumps(merged, indent=1))
    return merged


def encode_corpus_distributed(encoder: Encoder, docs: Iterable[tuple[str, str]], out_dir: str | os.PathLike,
                              n_docs: int, *, shard_rows: int = 100_000, **kwargs: Any) -> dict[str, Any]:
    """``encode_corpus`` on every rank of the current process group (a plain call outside one).

    Collective: every rank calls it with the same documents (each skips to its slice), ``n_docs`` and
    settings; ``kwargs`` go to ``encode_corpus``. Returns the merged manifest on every rank.
    """
    from lsr.distributed import agree, rank_and_size

    rank, world = rank_and_size()
    if world == 1:
        return encode_corpus(encoder, docs, out_dir, shard_rows=shard_rows, **kwargs)
    out = Path(out_dir)
    done = (out / MANIFEST).exists() and read_manifest(out).get("complete", False)
    if not done:
        start, stop = rank_slice(n_docs, shard_rows, rank, world)
        with agree(f"encode documents [{start}, {stop})"):
            part = encode_corpus(encoder, itertools.islice(iter(docs), start, stop), out / _rank_dir(rank, world),
                                 shard_rows=shard_rows, stream_offset=start, n_docs=stop - start, **kwargs)
            if part["n_rows"] != stop - start:
                raise ValueError(f"rank {rank} got {part['n_rows']} documents for [{start}, {stop}): the corpus "
                                 f"holds fewer than n_docs={n_docs}")
        with agree("write the manifest"):
            if rank == 0:
                merge_rank_manifests(out, world)
    return read_manifest(out)


def encode_command(args: Any, dataset: Any, device: str, make_encoder: Any) -> int:
    """``lsr encode`` (documents) on every rank of a torchrun job: rank 0 fits BM25 statistics when
    they are needed and the others load them, then ``encode_corpus_distributed``."""
    import torch.distributed as dist

    from lsr.distributed import agree, init_distributed

    dev = str(init_distributed(device))
    rank = dist.get_rank()
    out = Path(args.out)
    try:
        fit = args.encoder == "bm25" and not args.model
        with agree("build the encoder"):
            enc = make_encoder(args, dev)
            if fit and rank == 0:
                enc.fit(text for _, text in dataset.docs_iter())
                enc.save(out / "encoder")
        if fit and rank != 0:
            from lsr.encode.lexical import LexicalEncoder

            enc = LexicalEncoder.load(out / "encoder")
        n_docs = dataset.n_docs if dataset.n_docs is not None else sum(1 for _ in dataset.docs_iter())
        encode_corpus_distributed(enc, dataset.docs_iter(), out, n_docs, batch_size=args.batch_size,
                                  shard_rows=args.shard_rows, resume=True, doc_top_k=args.doc_top_k,
                                  tokenize_workers=args.tokenize_workers, show_progress_bar=rank == 0)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(f"document vectors in {out} ({dist_note(out)})")
    return 0


def dist_note(out: Path) -> str:
    m = read_manifest(out)
    return f"{m['n_rows']} documents in {len(m['shards'])} shards"
