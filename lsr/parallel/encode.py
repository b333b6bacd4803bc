"""Corpus encoding over the ranks of a torchrun job: one vector directory, identical to one process's.

The stream of n documents is cut into blocks of ``shard_rows`` (the shards a single process would
write); rank r of W encodes the contiguous blocks [nb * r // W, nb * (r + 1) // W) into its own resumable
vector directory ``OUT/.rank-RRRRR-of-WWWWW/`` (``encode_corpus`` with ``stream_offset``, so its windows
and batches are the single-process run's). After a barrier rank 0 moves every rank's shards into OUT
under the names a single process gives them (``part-00000.parquet``, ... in stream order), writes
``OUT/manifest.json`` and deletes the rank folders: the result is the folder one process writes, file
for file. A killed job resumes when restarted with the same world size: finished rank folders are not
encoded again, and the move is idempotent (a shard already moved is checked by its checksum).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lsr.config import EncoderConfig
from lsr.data.dataset import Dataset
from lsr.encode.base import Encoder
from lsr.encode.corpus import encode_corpus
from lsr.storage.files import atomic_write_text, fsync_dir
from lsr.storage.shards import MANIFEST, read_manifest, sha256_file

__all__ = ["encode_corpus_distributed", "encode_dataset_distributed", "encode_on_ranks", "merge_rank_folders",
           "rank_dir", "rank_slice"]


def rank_slice(n_docs: int, shard_rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Docs [start, stop) of ``rank``: whole blocks of ``shard_rows``, contiguous, in rank order."""
    n_blocks = -(-n_docs // shard_rows)
    b0, b1 = n_blocks * rank // world_size, n_blocks * (rank + 1) // world_size
    return b0 * shard_rows, min(n_docs, b1 * shard_rows)


def rank_dir(rank: int, world_size: int) -> str:
    """The working folder of ``rank`` inside the output folder (hidden: not part of the result)."""
    return f".rank-{rank:05d}-of-{world_size:05d}"


def _move_shard(src: Path, dst: Path, sha256: str) -> None:
    """Rename ``src`` to ``dst`` unless an earlier, interrupted merge already did."""
    if src.exists():
        os.replace(src, dst)
    elif not dst.exists() or sha256_file(dst) != sha256:
        raise ValueError(f"shard {src} is missing and {dst} does not hold it: rerun the job in a new folder")


def merge_rank_folders(out_dir: str | os.PathLike, world_size: int) -> dict[str, Any]:
    """Move the complete rank folders' shards into ``out_dir`` (single-process names, stream order), write
    its manifest.json and delete the rank folders; returns the manifest."""
    out = Path(out_dir)
    merged: dict[str, Any] | None = None
    subs = [out / rank_dir(r, world_size) for r in range(world_size)]
    for sub in subs:
        m = read_manifest(sub)
        if not m.get("complete"):
            raise ValueError(f"{sub} is unfinished: rerun the job to resume it")
        if merged is None:
            merged = {**m, "n_rows": 0, "nnz": 0, "shards": [], "complete": True}
        elif (m["vocab_size"], m.get("metadata")) != (merged["vocab_size"], merged.get("metadata")):
            raise ValueError(f"{sub} was written with other encoder settings than {subs[0]}")
        for s in m["shards"]:
            name = f"part-{len(merged['shards']):05d}.parquet"
            _move_shard(sub / s["file"], out / name, s["sha256"])
            merged["shards"].append({**s, "file": name})
        merged["n_rows"] += m["n_rows"]
        merged["nnz"] += m["nnz"]
    assert merged is not None
    fsync_dir(out)
    atomic_write_text(out / MANIFEST, json.dumps(merged, indent=1))
    for sub in subs:
        shutil.rmtree(sub)
    return merged


def encode_corpus_distributed(encoder: Encoder, docs: Iterable[tuple[str, str]], out_dir: str | os.PathLike,
                              n_docs: int, *, shard_rows: int = 100_000, **kwargs: Any) -> dict[str, Any]:
    """``encode_corpus`` on every rank of the current process group (a plain call outside one).

    Collective: every rank calls it with the same documents (each skips to its slice), ``n_docs`` and
    settings; ``kwargs`` go to ``encode_corpus``. Returns the merged manifest on every rank.
    """
    from lsr.parallel.topology import agree, rank_and_size

    rank, world = rank_and_size()
    if world == 1:
        return encode_corpus(encoder, docs, out_dir, shard_rows=shard_rows, **kwargs)
    out = Path(out_dir)
    with agree("check the output folder"):
        if (out / MANIFEST).exists() and not read_manifest(out).get("complete"):
            raise ValueError(f"{out} holds an unfinished single-process encoding: resume it with one process, "
                             "or encode into a new folder")
    if not (out / MANIFEST).exists():
        start, stop = rank_slice(n_docs, shard_rows, rank, world)
        sub = out / rank_dir(rank, world)
        with agree(f"encode documents [{start}, {stop})"):
            if not ((sub / MANIFEST).exists() and read_manifest(sub).get("complete")):
                part = encode_corpus(encoder, itertools.islice(iter(docs), start, stop), sub, shard_rows=shard_rows,
                                     stream_offset=start, n_docs=stop - start, **kwargs)
                if part["n_rows"] != stop - start:
                    raise ValueError(f"rank {rank} got {part['n_rows']} documents for [{start}, {stop}): the "
                                     f"corpus holds fewer than n_docs={n_docs}")
        with agree("merge the rank folders"):
            if rank == 0:
                merge_rank_folders(out, world)
    return read_manifest(out)


def encode_dataset_distributed(encoder: Encoder, dataset: Dataset, out_dir: str | os.PathLike,
                               **kwargs: Any) -> dict[str, Any]:
    """``encode_corpus_distributed`` over a dataset's documents (collective): counted first when the dataset
    does not say how many (every rank must cut the same slices), progress shown on rank 0."""
    from lsr.parallel.topology import rank_and_size

    n_docs = dataset.n_docs if dataset.n_docs is not None else sum(1 for _ in dataset.docs_iter())
    return encode_corpus_distributed(encoder, dataset.docs_iter(), out_dir, n_docs,
                                     show_progress_bar=rank_and_size()[0] == 0, **kwargs)


def encode_on_ranks(dataset: Dataset, out_dir: str | os.PathLike, encoder: EncoderConfig, device: str) -> dict[str, Any]:
    """``lsr encode`` (documents) on every rank of a torchrun job; returns the merged manifest on every rank.

    Joins the process group (and leaves it when done, unless the caller had joined). The encoder is
    ``open_encoder(encoder)`` on this rank's device; BM25 without a fitted ``model`` is fitted on rank 0 and
    saved in ``out_dir/encoder``, where the other ranks load it. Vectors already in ``out_dir`` must come from
    the same documents (checked before a new fit replaces the saved one). ``encoder``'s batch_size,
    shard_rows, doc_top_k and tokenize_workers set the encoding.
    """
    from lsr.parallel.topology import agree, built_on_rank0, process_group
    from lsr.pipeline.steps import corpus_settings, open_encoder

    out = Path(out_dir)
    fit = encoder.kind == "bm25" and not encoder.model
    with process_group(device) as dev:
        with agree("check where the documents come from"):
            if (out / MANIFEST).exists():
                from lsr.storage.provenance import check_same_origin

                check_same_origin(read_manifest(out).get("origin"), dataset.docs_origin, out)

        def build() -> Encoder:
            enc = open_encoder(encoder, str(dev))
            if fit:
                enc.fit(text for _, text in dataset.docs_iter())
                enc.save(out / "encoder")
            return enc

        def load() -> Encoder:  # BM25 statistics rank 0 fitted and saved
            from lsr.encode.bm25.lexical import LexicalEncoder

            return LexicalEncoder.load(out / "encoder")

        enc = built_on_rank0(build, load, "the encoder", rank0_only=fit)
        return encode_dataset_distributed(enc, dataset, out, **corpus_settings(encoder, dataset.docs_origin))
