"""Corpus encoding: a stream of (doc_id, text) pairs -> resumable Parquet shards of document vectors.

    manifest = encode_corpus(encoder, dataset.docs_iter(), "vectors/", batch_size=1024, shard_rows=100_000)

Design (simplest one that is resumable and exact):

* The stream is cut into windows at every multiple of ``sort_window`` *and* of ``shard_rows``
  (positions counted from the start of the stream). A window is tokenized, sorted by length into
  batches (little padding), encoded, put back in stream order and handed to ``ShardWriter``, which
  writes a shard whenever ``shard_rows`` rows are buffered. Shards therefore hold documents in stream
  order, and every shard boundary is a window boundary.
* A killed run leaves a manifest listing only complete shards. ``resume=True`` skips
  ``writer.rows_done`` documents of the stream (a shard boundary), so the rerun sees the very same
  windows and batches as an uninterrupted run: no document is lost or duplicated and the shards are
  identical (bit-exact on a deterministic device), not merely equivalent.
* A thread reads the next windows and submits them to a pool of worker processes (``tokenize_workers``), a
  second cuts each tokenized window into batches (in pinned memory; ``stream.Pipeline``: the workers tokenize
  the next window meanwhile) while the main thread runs the model; a writer
  thread takes each window's vectors once they are on the host (``encode_prepared_async``) and four threads
  write Parquet shards (at once, listed in the manifest in order; a row group per window, written as the
  window arrives), so the GPU does not wait on the CPU side. Processes, not threads: tokenizing holds the GIL, and a thread doing it beside the
  model slowed the launching thread by about a third (docs/performance/encode.md).

Encoders with ``prepare`` / ``encode_prepared`` (SpladeEncoder) take that fast path; any other encoder
with ``encode_document(texts, ids)`` (e.g. a fitted LexicalEncoder) is called per batch of the window.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from lsr.encode.base import Encoder
from lsr.encode.stream import FIRST_WINDOW, Pipeline, window_spans
from lsr.encode.tokenize.pool import default_workers
from lsr.sparse import SparseVectors
from lsr.storage.shard_writer import ShardWriter
from lsr.storage.shards import MANIFEST, read_manifest

__all__ = ["DISTRIBUTED_WORK", "CorpusRun", "check_windows", "encode_corpus", "take_docs", "vector_metadata", "window_bounds",
           "window_end"]

# the working folder of a distributed encoding inside its output folder (lsr.parallel.encode_units)
DISTRIBUTED_WORK = ".lsr-encode"

log = logging.getLogger(__name__)


def window_end(pos: int, shard_rows: int, sort_window: int, first_window: int = FIRST_WINDOW) -> int:
    """End of the window that starts at stream position ``pos``: the next multiple of either size; inside
    the stream's first window also at the ends of the in-memory path's growing windows (``window_spans`` from
    ``first_window``: 4,096, 12,288, 28,672...), so that the model starts early. Only positions matter, so a resume (always at
    a shard boundary, past the first window) or a slice of a longer stream cuts the windows of an
    uninterrupted run."""
    end = min((pos // sort_window + 1) * sort_window, (pos // shard_rows + 1) * shard_rows)
    first = min(sort_window, shard_rows)
    if pos >= first:
        return end
    return min(end, next(s + z for s, z in window_spans(first, sort_window, first_window) if s + z > pos))


def take_docs(docs: Iterator[Any], pos: int, count: int) -> tuple[list[str], list[str]]:
    """(ids, texts) of the next ``count`` documents of ``docs`` (fewer at its end), the first at stream
    position ``pos`` (named in errors); refuses items that are not (doc_id, str) pairs."""
    ids, texts = [], []
    for item in itertools.islice(docs, count):
        try:
            doc_id, text = item
        except (TypeError, ValueError):
            raise TypeError(f"documents must be (doc_id, text) pairs; item {pos + len(ids)} is {type(item).__name__}") from None
        if not isinstance(text, str):
            raise TypeError(f"document {doc_id!r}: text is {type(text).__name__}, not str")
        ids.append(str(doc_id))
        texts.append(text)
    return ids, texts


def window_bounds(n_docs: int, shard_rows: int, sort_window: int | None = None,
                  first_window: int = FIRST_WINDOW) -> list[tuple[int, int]]:
    """[start, stop) of every window ``encode_corpus`` cuts from a stream of ``n_docs`` documents (the
    defaults are its own): the units a distributed encoding hands out, since a window's vectors do not depend
    on the other windows."""
    sort_window = check_windows(shard_rows, sort_window)
    bounds, pos = [], 0
    while pos < n_docs:
        bounds.append((pos, min(n_docs, window_end(pos, shard_rows, sort_window, first_window))))
        pos = bounds[-1][1]
    return bounds


def _windows(docs: Iterator[Any], start: int, shard_rows: int, sort_window: int,
             first_window: int) -> Iterator[tuple[list[str], list[str]]]:
    """(ids, texts) windows of the stream from position ``start`` (``window_end``)."""
    pos = start
    while True:
        ids, texts = take_docs(docs, pos, window_end(pos, shard_rows, sort_window, first_window) - pos)
        if not ids:
            return
        yield ids, texts
        pos += len(ids)


def _skip_written(writer: ShardWriter, stream: Iterator[Any], skip: int) -> None:
    """Consume the ``skip`` documents already written. The last of them must be the last id of the
    last shard (a cheap guard against resuming with another corpus or another order)."""
    last_seen = None
    for item in itertools.islice(stream, skip):
        last_seen = item
    last_seen = None if last_seen is None else str(last_seen[0])
    shards = writer.manifest["shards"]
    if not shards:
        return
    stored = pq.read_table(writer.path / shards[-1]["file"], columns=["id"]).column("id")[-1].as_py()
    if last_seen is None or last_seen != stored:
        raise ValueError(f"cannot resume {writer.path}: it holds {skip} documents ending with {stored!r}, but the "
                         f"stream {'is shorter' if last_seen is None else f'has {last_seen!r} there'}; "
                         "pass the same documents in the same order, or start a new directory")


def _add(writer: ShardWriter, vectors: Any) -> int:
    """Hand a window to the writer (waiting for it first when it is still on its way from the GPU: a
    ``PendingVectors``); returns its non-zeros."""
    if not isinstance(vectors, SparseVectors):
        vectors = vectors.result()
    writer.add(vectors)
    return vectors.nnz


def _settle(writer: ShardWriter) -> None:
    """List the shards already being written (after an error: a resume then skips them). A failure here is
    mostly the error that stopped the run seen a second time (a full disk fails ``close`` and then this), so
    it is neither raised over that error nor printed beside it: the user gets the one line ``lsr.cli`` prints;
    ``-v`` shows this one too, with its traceback."""
    try:
        writer.settle()
    except Exception as e:  # noqa: BLE001 - the original error is the one to report
        log.info("could not finish writing a shard of %s: %s", writer.path, e, exc_info=True)


def encode_corpus(encoder: Encoder, docs: Iterable[tuple[str, str]], out_dir: str | os.PathLike, *,
                  batch_size: int | None = None, shard_rows: int = 100_000, resume: bool = True,
                  n_docs: int | None = None, show_progress_bar: bool = True, sort_window: int | None = None,
                  doc_top_k: int | None = None, max_tokens: int | None = None, prefetch: int = 2,
                  tokenize_workers: int | None = None, stats: dict[str, Any] | None = None,
                  origin: dict[str, Any] | None = None, stream_offset: int = 0,
                  first_window: int = FIRST_WINDOW) -> dict[str, Any]:
    """Encode a document stream into a vector directory (Parquet shards + manifest); returns the manifest.

    Args:
        encoder: SpladeEncoder (fast path) or any encoder with ``encode_document``, ``vocab_size`` and
            ``describe()`` (fit a LexicalEncoder first).
        docs: iterable of (doc_id, text); ids must be unique.
        out_dir: output directory.
        batch_size: texts per batch (default: the encoder's own, else 1024).
        shard_rows: documents per Parquet shard (the resume granularity).
        resume: continue an interrupted directory written with the same encoder settings (a complete
            one is returned as is); False refuses a non-empty directory.
        n_docs: total number of documents, for the progress bar's ETA only.
        show_progress_bar: show a tqdm bar (docs/s, ETA, padding waste).
        sort_window: documents sorted by length together (default: shard_rows split into equal windows
            of at most 65,536; larger windows pad less but delay the first batch).
        doc_top_k: keep each document's k largest weights (default: the encoder's setting).
        max_tokens: padded-token budget per batch (SpladeEncoder; default its own).
        prefetch: windows tokenized ahead of the model.
        tokenize_workers: processes that tokenize (SpladeEncoder with a fast tokenizer: its
            ``shared_tokenizer_pool``, kept for later calls); 0 tokenizes on the thread that cuts windows
            into batches. Default: ``tokenize_pool.default_workers()`` when the encoder runs on CUDA, else 0.
            That thread helps with the first window (the model has nothing to do yet).
        stats: if given, filled with docs, seconds, docs_per_s, nnz, tokens, padded_tokens and the main
            thread's time split (seconds): first_window_s (start to the first tokenized window),
            wait_input_s (blocked on the tokenizing thread, first window included), encode_s (the
            model), wait_writer_s (blocked on the shard writer) and close_s (the last shard files and the
            manifest, after the last window); tokenize_workers and
            tokenized_by_workers (documents the worker processes tokenized, the rest: the batching thread).
        origin: where the documents come from (``Dataset.docs_origin``): stored in the manifest; a
            folder made from other documents is refused instead of resumed or reused.
        stream_offset: position of ``docs``' first document in a longer stream that other processes
            encode in slices (``lsr.parallel.encode``); a multiple of ``shard_rows``. Windows are cut
            where the whole stream's would be, so the vectors equal a single-process run's.
        first_window: the stream's first window, after which windows double up to ``sort_window`` (the model
            starts after this many documents are tokenized).
    """
    sort_window = check_windows(shard_rows, sort_window, stream_offset)
    if (Path(out_dir) / DISTRIBUTED_WORK).is_dir():
        raise ValueError(f"{out_dir} holds an unfinished distributed encoding ({DISTRIBUTED_WORK}/): resume it with "
                         "lsr encode (any number of ranks) or lsr.parallel.encode_corpus_distributed")
    metadata = vector_metadata(encoder, doc_top_k)
    was_complete = resume and (Path(out_dir) / MANIFEST).exists() and read_manifest(out_dir).get("complete", False)
    # four writer threads keep up with the GPU (per-passage write cost: docs/performance/encode.md), and a row group
    # per window leaves only the last window to write after the last batch
    writer = ShardWriter(out_dir, encoder.vocab_size, metadata, shard_rows=shard_rows, resume=resume, origin=origin,
                         write_threads=4, row_group_rows=sort_window)
    if was_complete:  # the writer re-verified settings and checksums; nothing to do
        log.info("%s is already complete (%d documents)", out_dir, writer.rows_done)
        return writer.close()
    skip = writer.rows_done
    stream = iter(docs)
    if skip:
        log.info("resuming %s after %d documents", out_dir, skip)
        _skip_written(writer, stream, skip)
    run = CorpusRun(encoder, writer, batch_size, doc_top_k, max_tokens, tokenize_workers)
    from tqdm.auto import tqdm

    bar = tqdm(total=n_docs, initial=skip, unit="doc", unit_scale=True, smoothing=0.05, disable=not show_progress_bar,
               desc="encode", dynamic_ncols=True)
    try:
        manifest = run.run(_windows(stream, stream_offset + skip, shard_rows, sort_window, first_window), prefetch, bar)
    finally:
        bar.close()
    if stats is not None:
        stats.update(run.stats())
    return manifest


def vector_metadata(encoder: Encoder, doc_top_k: int | None) -> dict[str, Any]:
    """The manifest's ``metadata`` of vectors ``encoder`` writes (with ``doc_top_k`` when given)."""
    metadata = dict(encoder.describe())
    if doc_top_k is not None:
        metadata["doc_top_k"] = doc_top_k
    return metadata


def check_windows(shard_rows: int, sort_window: int | None, stream_offset: int = 0) -> int:
    """Refuse bad sizes; the sort window (default: shard_rows split into equal windows of <= 65,536)."""
    if shard_rows <= 0 or (sort_window is not None and sort_window <= 0):
        raise ValueError("shard_rows and sort_window must be positive")
    if stream_offset < 0 or stream_offset % shard_rows:
        raise ValueError(f"stream_offset {stream_offset} must be a non-negative multiple of shard_rows {shard_rows}")
    # windows of up to 65,536 documents pad little at MS MARCO-like lengths (docs/performance/encode.md)
    return sort_window or -(-shard_rows // -(-shard_rows // 65536))


class CorpusRun:
    """One pass of ``encode_corpus`` over the windows still to write: tokenizing ahead (``Pipeline``), the
    model on this thread, a writer thread behind it; counts and the main thread's time split for ``stats``.
    ``writer``: a ``ShardWriter``, or any object with its ``add(vectors)`` (a window at a time, in order, on the
    writer thread), ``settle()`` (after an error), ``close()`` (returns what ``run`` returns) and ``path``."""

    def __init__(self, encoder: Encoder, writer: Any, batch_size: int | None, doc_top_k: int | None,
                 max_tokens: int | None, tokenize_workers: int | None) -> None:
        self.encoder, self.writer, self.doc_top_k, self.max_tokens = encoder, writer, doc_top_k, max_tokens
        self.fast = hasattr(encoder, "prepare") and hasattr(encoder, "encode_prepared")
        self.batch_size = batch_size or getattr(encoder, "batch_size", None) or 1024
        self.totals = {"docs": 0, "nnz": 0, "tokens": 0, "padded_tokens": 0}
        self.clock = {"first_window_s": None, "wait_input_s": 0.0, "encode_s": 0.0, "wait_writer_s": 0.0,
                      "close_s": 0.0, "seconds": 0.0}
        if tokenize_workers is None:
            on_cuda = getattr(getattr(encoder, "device", None), "type", None) == "cuda"
            tokenize_workers = default_workers() if self.fast and on_cuda else 0
        self.workers = tokenize_workers if self.fast else 0
        self.tokenizers = encoder.shared_tokenizer_pool("doc", self.workers) if self.workers > 0 else None
        self.by_workers_before = self.tokenizers.texts_by_workers if self.tokenizers is not None else 0
        self.first = True
        self.counted_docs = 0   # documents whose non-zeros are in totals["nnz"]

    def start(self, window: tuple[list[str], list[str]]) -> tuple[list[str], Any]:
        ids, texts = window  # (read by this thread, which then submits the texts to the worker processes)
        return ids, self.encoder.tokenize_async(texts, "doc", pool=self.tokenizers) if self.fast else texts

    def prepare(self, started: tuple[list[str], Any]) -> tuple[list[str], Any]:
        ids, tokenized = started
        if not self.fast:
            return ids, tokenized
        # every window goes to the worker processes; the model waits for the first one anyway, so this
        # thread tokenizes part of it too (while the workers start, on a first call)
        join, self.first = self.first, False
        return ids, self.encoder.prepare_tokens(tokenized(join), "doc", self.batch_size, self.max_tokens)

    def encode(self, ids: list[str], payload: Any, bar: Any) -> Any:
        """A window's vectors: queued on the device (the writer thread waits for them and copies them) on
        the fast path, else the encoder's ``encode_document`` per batch."""
        if self.fast:
            run = getattr(self.encoder, "encode_prepared_async", self.encoder.encode_prepared)
            top_k = {} if self.doc_top_k is None else {"top_k": self.doc_top_k}
            self.totals["tokens"] += payload.n_tokens
            self.totals["padded_tokens"] += payload.n_slots
            return run(payload, ids, on_batch=bar.update, **top_k)
        parts = []
        for i in range(0, len(ids), self.batch_size):
            part = self.encoder.encode_document(payload[i:i + self.batch_size], ids=ids[i:i + self.batch_size])
            parts.append(part.prune_top_k(self.doc_top_k) if self.doc_top_k is not None else part)
            bar.update(len(part))
        return SparseVectors.concat(parts)

    def run(self, windows: Iterator[tuple[list[str], list[str]]], prefetch: int, bar: Any) -> dict[str, Any]:
        """Encode every window and close the writer; returns the manifest."""
        prefetcher = Pipeline(windows, self.start, self.prepare, prefetch)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lsr-shard-writer")
        pending: Future | None = None
        clock, totals = self.clock, self.totals
        t0 = mark = time.perf_counter()
        try:
            for ids, payload in prefetcher:
                start = time.perf_counter()
                clock["wait_input_s"] += start - mark
                if clock["first_window_s"] is None:
                    clock["first_window_s"] = start - t0
                vectors = self.encode(ids, payload, bar)
                encoded = time.perf_counter()
                clock["encode_s"] += encoded - start
                totals["docs"] += len(ids)
                if pending is not None:
                    totals["nnz"] += pending.result()  # one window in flight at most: bounded memory, errors surface
                    self.counted_docs = totals["docs"] - len(ids)
                    clock["wait_writer_s"] += time.perf_counter() - encoded
                pending = pool.submit(_add, self.writer, vectors)
                bar.set_postfix(self.postfix(), refresh=False)
                mark = time.perf_counter()
            end = time.perf_counter()
            clock["wait_input_s"] += end - mark  # waiting for the end of the stream
            if pending is not None:
                totals["nnz"] += pending.result()
                self.counted_docs = totals["docs"]
                clock["wait_writer_s"] += time.perf_counter() - end
                bar.set_postfix(self.postfix())
            closing = time.perf_counter()
            manifest = self.writer.close()  # waits for the shard-writer threads' last files, writes the manifest
            clock["close_s"] = time.perf_counter() - closing
        finally:
            prefetcher.close()
            pool.shutdown(wait=True)  # an in-flight shard is complete work: let it land
            _settle(self.writer)
            clock["seconds"] = time.perf_counter() - t0
        return manifest

    def postfix(self) -> dict[str, str]:
        # non-zeros are known once a window's vectors reach the writer: per document of those windows
        out = {"nnz/doc": f"{self.totals['nnz'] / self.counted_docs:.0f}" if self.counted_docs else "-"}
        if self.fast:
            out["pad"] = f"{self.totals['padded_tokens'] / max(self.totals['tokens'], 1) - 1:.1%}"
        return out

    def stats(self) -> dict[str, Any]:
        seconds = self.clock["seconds"]
        by_workers = self.tokenizers.texts_by_workers - self.by_workers_before if self.tokenizers else 0
        return {**self.totals, **self.clock, "tokenize_workers": self.workers, "tokenized_by_workers": by_workers,
                "docs_per_s": self.totals["docs"] / seconds if seconds > 0 else 0.0}
