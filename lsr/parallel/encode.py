"""Corpus encoding over the ranks of a torchrun job: one vector directory, identical to one process's.

The stream of n documents is cut into the windows ``encode_corpus`` cuts (``window_bounds``: at most
``sort_window`` documents, never across a shard); each is a unit of work. Every rank reads the stream
forward and takes the next unit no rank holds (``lsr.parallel.encode_units``: claims are files in
``OUT/.lsr-encode/``), so the work is balanced by what each unit really costs, not by a count: no rank
idles while another still has whole shards to do. A unit's vectors are those one process computes for
that window (the window's sort and batches are the same); the rank that finishes the last unit of a shard
writes that shard with the bytes one process writes; at the end rank 0 moves the shards into OUT and
writes its manifest: the result is the folder one process writes, file for file, for any world size.

The ranks first agree on the plan (the document count and settings) and the folder (``lsr.parallel.agreement``),
and rank 0 holds ``OUT/.lsr-encode.lock`` for the whole job (``lsr.parallel.joblock``): a second job into the
same folder is refused before it touches it.

Resume: finished units and shards stay in ``OUT/.lsr-encode/``; a restart with any world size (one process
too, through ``encode_corpus_distributed`` or ``lsr encode``) encodes only the rest. An unfinished
single-process folder is taken over the same way.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lsr.config import EncoderConfig
from lsr.data.dataset import Dataset
from lsr.encode.base import Encoder
from lsr.encode.corpus import DISTRIBUTED_WORK, CorpusRun, check_windows, encode_corpus, vector_metadata
from lsr.encode.stream import FIRST_WINDOW
from lsr.parallel.agreement import agreement, config_parts, corpus_part, output_part, settings_part
from lsr.parallel.encode_units import EncodeWork, UnitWriter, claimed_windows
from lsr.parallel.joblock import FolderLock
from lsr.parallel.jobs import rank_job
from lsr.parallel.topology import agree, rank_and_size
from lsr.storage.files import remove_dead_temporaries
from lsr.storage.shards import MANIFEST, read_manifest

__all__ = ["encode_corpus_distributed", "encode_dataset_distributed", "encode_on_ranks"]


def _start_job(work: EncodeWork, resume: bool) -> None:
    """Rank 0, before any rank takes a unit: check the output folder, take over an unfinished single-process
    folder, drop the claims of an earlier job. A complete folder of the same settings is left as it is."""
    out = work.out
    manifest = read_manifest(out) if (out / MANIFEST).exists() else None
    if manifest is not None and manifest.get("complete"):
        stored = (manifest["vocab_size"], manifest.get("metadata") or None, manifest.get("origin") or None)
        if stored != (work.plan["vocab_size"], work.plan["metadata"] or None, work.plan["origin"] or None):
            raise ValueError(f"{out} already holds vectors written with other settings or documents; choose "
                             "another output folder, or delete it")
        shutil.rmtree(work.root, ignore_errors=True)  # left by a publish stopped before its last step
        return
    if not resume and (manifest is not None or work.root.exists()):
        raise FileExistsError(f"{out} already holds vectors; pass resume=True or choose a new directory")
    remove_dead_temporaries(out)   # a killed single-process writer's half-written shard
    work.start_job()
    if manifest is not None:
        work.adopt(manifest)


def encode_corpus_distributed(encoder: Encoder, docs: Iterable[tuple[str, str]], out_dir: str | os.PathLike,
                              n_docs: int | None, *, shard_rows: int = 100_000, sort_window: int | None = None,
                              first_window: int = FIRST_WINDOW, batch_size: int | None = None,
                              doc_top_k: int | None = None, max_tokens: int | None = None,
                              tokenize_workers: int | None = None, prefetch: int = 2, resume: bool = True,
                              origin: dict[str, Any] | None = None, show_progress_bar: bool = True,
                              stats: dict[str, Any] | None = None) -> dict[str, Any]:
    """``encode_corpus`` on every rank of the current process group (one process outside one); returns the
    manifest on every rank.

    Collective: every rank calls it with the same documents (each reads them forward and encodes the units
    it takes), ``n_docs`` (their number: the units are cut from it) and settings; the settings mean what they
    mean for ``encode_corpus``. One process without a process group runs ``encode_corpus`` unless the folder
    holds an unfinished distributed encoding, which it finishes. ``stats`` (per rank): ``encode_corpus``'s
    and ``units`` (the units this rank encoded).
    """
    rank, world = rank_and_size()
    out = Path(out_dir)
    settings = {"batch_size": batch_size, "doc_top_k": doc_top_k, "max_tokens": max_tokens,
                "tokenize_workers": tokenize_workers}
    if world == 1 and not (out / DISTRIBUTED_WORK).is_dir():
        return encode_corpus(encoder, docs, out, shard_rows=shard_rows, sort_window=sort_window,
                             first_window=first_window, prefetch=prefetch, resume=resume, n_docs=n_docs,
                             origin=origin, show_progress_bar=show_progress_bar, stats=stats, **settings)
    if n_docs is None or n_docs < 0:
        raise ValueError(f"n_docs={n_docs}: the number of documents is needed to cut them into units for the ranks "
                         "(encode_dataset_distributed counts them)")
    plan = {"n_docs": n_docs, "shard_rows": shard_rows, "sort_window": check_windows(shard_rows, sort_window),
            "first_window": first_window, "vocab_size": encoder.vocab_size,
            "metadata": vector_metadata(encoder, doc_top_k), "origin": origin}
    work, lock, taken = EncodeWork(out, plan), FolderLock(out), False
    with agreement("plan the encoding") as parts:  # (a library caller's documents: their count and settings)
        # not compared: where the documents and the model were read (paths that may differ between hosts)
        facts = {k: v for k, v in plan["metadata"].items() if k not in ("model", "query_model")}
        parts += [settings_part("encoding plan", {**{k: v for k, v in plan.items() if k != "origin"}, "metadata": facts}),
                  output_part(out)]
    with agree(f"open the output folder {out}"):
        if rank == 0:
            taken = lock.acquire()  # one job at a time: a second one is refused before it touches the folder
            try:
                _start_job(work, resume)
            except BaseException:
                if taken:
                    lock.release()
                raise
    try:
        if work.root.is_dir():  # (else complete already)
            _run_units(encoder, docs, work, settings, prefetch, show_progress_bar, stats)
    finally:
        if taken:
            lock.release()
    return read_manifest(out)


def _run_units(encoder: Encoder, docs: Iterable[tuple[str, str]], work: EncodeWork, settings: dict[str, Any],
               prefetch: int, show_progress_bar: bool, stats: dict[str, Any] | None) -> None:
    """Every rank: its units, then the shards nobody wrote; rank 0 publishes the folder (each step agreed)."""
    rank, world = rank_and_size()
    with agree("encode the documents"):
        try:
            _encode_units(encoder, docs, work, settings, prefetch, show_progress_bar and rank == 0, stats)
        except Exception as e:
            work.fail(f"rank {rank}: {e}")  # the others stop at their next unit
            raise
    with agree("write the shards"):  # those whose last unit was written by a rank that was stopped
        for k in range(rank, work.n_shards, world):
            if not work.shard_done(k):
                work.merge_shard(k)
    with agree(f"publish the vectors in {work.out}"):
        if rank == 0:
            work.publish()


def _encode_units(encoder: Encoder, docs: Iterable[tuple[str, str]], work: EncodeWork, settings: dict[str, Any],
                  prefetch: int, show_progress_bar: bool, stats: dict[str, Any] | None) -> None:
    """This rank's share: the units it takes, through ``encode_corpus``'s pipeline."""
    from tqdm.auto import tqdm

    writer = UnitWriter(work)
    run = CorpusRun(encoder, writer, settings["batch_size"], settings["doc_top_k"], settings["max_tokens"],
                    settings["tokenize_workers"])
    left = sum(stop - start for u, (start, stop) in enumerate(work.units) if not work.unit_done(u))
    bar = tqdm(total=-(-left // rank_and_size()[1]), unit="doc", unit_scale=True, smoothing=0.05,
               disable=not show_progress_bar, desc="encode (this rank)", dynamic_ncols=True)
    try:
        run.run(claimed_windows(work, docs, writer), prefetch, bar)
    finally:
        bar.close()
    if stats is not None:
        stats.update(run.stats(), units=writer.written)


def encode_dataset_distributed(encoder: Encoder, dataset: Dataset, out_dir: str | os.PathLike,
                               **kwargs: Any) -> dict[str, Any]:
    """``encode_corpus_distributed`` over a dataset's documents (collective): counted first when the dataset
    does not say how many and the units need it; progress shown on rank 0."""
    rank, world = rank_and_size()
    n_docs = dataset.n_docs
    if n_docs is None and (world > 1 or (Path(out_dir) / DISTRIBUTED_WORK).is_dir()):
        n_docs = sum(1 for _ in dataset.docs_iter())
    return encode_corpus_distributed(encoder, dataset.docs_iter(), out_dir, n_docs,
                                     show_progress_bar=rank == 0, **kwargs)


def encode_on_ranks(dataset: Dataset, out_dir: str | os.PathLike, encoder: EncoderConfig, device: str) -> dict[str, Any]:
    """``lsr encode`` (documents) on every rank of a torchrun job; returns the merged manifest on every rank.

    One ``rank_job``: the process group joined (and left when done, unless the caller had joined), the ranks'
    agreement on the documents, the encoder and the folder, then the work. The encoder is
    ``open_encoder(encoder)`` on this rank's device; BM25 without a fitted ``model`` is fitted on rank 0 and
    saved in ``out_dir/encoder``, where the other ranks load it. Vectors already in ``out_dir`` must come from
    the same documents (checked before a new fit replaces the saved one). ``encoder``'s batch_size,
    shard_rows, doc_top_k and tokenize_workers set the encoding.
    """
    from lsr.encode.factory import corpus_settings, open_encoder

    out = Path(out_dir)
    fit = encoder.kind == "bm25" and not encoder.model
    with rank_job(device) as job:
        with job.agreement("check where the documents come from") as parts:  # the ranks agree before any work
            parts += [corpus_part(dataset), output_part(out), *config_parts({"encoder": dataclasses.asdict(encoder)})]
            if (out / MANIFEST).exists():
                from lsr.storage.provenance import check_same_origin

                check_same_origin(read_manifest(out).get("origin"), dataset.docs_origin, out)

        def build() -> Encoder:
            enc = open_encoder(encoder, str(job.device))
            if fit:
                enc.fit(text for _, text in dataset.docs_iter())
                enc.save(out / "encoder")
            return enc

        def load() -> Encoder:  # BM25 statistics rank 0 fitted and saved
            from lsr.encode.bm25.lexical import LexicalEncoder

            return LexicalEncoder.load(out / "encoder")

        lock = FolderLock(out)
        # before the fit saves into it: a second job is refused here
        taken = job.on_lead(f"lock the output folder {out}", lock.acquire)
        try:
            enc = job.built_on_lead(build, load, "the encoder", lead_only=fit)
            return encode_dataset_distributed(enc, dataset, out, **corpus_settings(encoder, dataset.docs_origin))
        finally:
            if taken:
                lock.release()
