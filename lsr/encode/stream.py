"""Keeping the model busy while the CPU prepares the next texts: a bounded prefetch thread and the
encoder's shared tokenizer pool, used by corpus encoding (``lsr.encode.corpus``) and in-memory encoding of long
text lists (``encode_windows``, behind ``SpladeEncoder.encode_document`` / ``encode_query``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["Pipeline", "Prefetch", "encode_windows", "window_spans", "windows_pool"]

_END = object()


class Prefetch:
    """Run ``fn`` over ``items`` on a daemon thread, at most ``depth`` results ahead of the consumer.
    Exceptions (from the document iterator too) are re-raised in the consumer."""

    def __init__(self, items: Iterator[Any], fn: Callable[[Any], Any], depth: int) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(items, fn), daemon=True, name="lsr-encode-prefetch")
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items: Iterator[Any], fn: Callable[[Any], Any]) -> None:
        try:
            for item in items:
                if not self._put(fn(item)):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer thread
            self._put(_Failure(e))
            return
        self._put(_END)

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                item = self._q.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():  # closed: nothing more comes
                    return
                continue
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)  # it may sit in a slow document iterator; it is a daemon anyway


class Pipeline:
    """Two ``Prefetch`` threads in a row: ``start`` runs ahead over ``items`` (e.g. submitting texts to the
    tokenizer pool, which returns at once), ``finish`` turns its results into what the consumer takes, at most
    ``depth`` ahead. So the worker processes tokenize the next window while ``finish`` cuts this one into
    batches, instead of waiting for it."""

    def __init__(self, items: Iterator[Any], start: Callable[[Any], Any], finish: Callable[[Any], Any],
                 depth: int) -> None:
        self._started = Prefetch(items, start, 1)
        self._finished = Prefetch(iter(self._started), finish, depth)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._finished)

    def close(self) -> None:
        self._started.close()  # (first: the finishing thread may be waiting for it)
        self._finished.close()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


WINDOW = 32_768  # texts tokenized together: sorted by length into batches, and the unit of overlap
FIRST_WINDOW = 4_096  # the first window of a long list (windows then double up to WINDOW)


def windows_pool(encoder: Any, kind: str, n: int, tokenize_workers: int | None) -> Any:
    """The encoder's shared tokenizer pool (``tokenize_workers`` processes; None: ``default_workers()`` on
    CUDA, none elsewhere) when ``n`` texts are worth it (two of its tasks: ``encoder.tokenize_chunk`` texts
    each), else None (tokenize in-process)."""
    from lsr.encode.tokenize.pool import CHUNK, default_workers

    if tokenize_workers is None:
        tokenize_workers = default_workers() if encoder.device.type == "cuda" else 0
    if tokenize_workers <= 0 or n < 2 * getattr(encoder, "tokenize_chunk", CHUNK):
        return None
    return encoder.shared_tokenizer_pool(kind, tokenize_workers)


def window_spans(n: int, window: int, first: int) -> list[tuple[int, int]]:
    """(start, size) of the windows of ``n`` texts: ``first``, twice that, ... up to ``window``. The model
    starts after a small first window, and each window is tokenized while the model runs the previous
    one, which is half its size (a full first window made the GPU wait ~0.5 s, docs/performance/encode.md)."""
    spans, start, size = [], 0, max(1, min(first, window))
    while start < n:
        spans.append((start, min(size, n - start)))
        start, size = start + size, min(window, 2 * size)
    return spans


def encode_windows(encoder: Any, texts: Sequence[str], ids: Sequence[str] | None, kind: str,
                   batch_size: int | None = None, *, window: int = WINDOW, tokenize_workers: int | None = None,
                   on_batch: Callable[[int], None] | None = None, first_window: int | None = None) -> Any:
    """``encoder.encode_prepared(encoder.prepare(texts))`` for a long list, a window at a time: the next
    windows are tokenized (in the encoder's shared worker processes on CUDA, see ``windows_pool``) while the
    model encodes this one, as corpus encoding does; the first window by the workers and this process
    together (the model has nothing to do yet). Windows grow from ``first_window`` (default ``FIRST_WINDOW``)
    to ``window`` texts (``window_spans``); vectors equal those of one window up to the rounding of other
    batch shapes. A helper thread copies each window's vectors from pinned
    memory into the result while the model runs the next (``lsr.encode.splade.extract.VectorsBuilder``: no final
    concatenation). Returns SparseVectors in input order. ``encoder``: a SpladeEncoder."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from lsr.encode.splade.extract import VectorsBuilder

    n = len(texts)
    ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in ids]
    if len(ids) != n:
        raise ValueError(f"got {len(ids)} ids for {n} texts")
    if len(set(ids)) != n:
        raise ValueError("ids must be unique")
    pool = windows_pool(encoder, kind, n, tokenize_workers)

    def start(span: tuple[int, int]) -> tuple[int, int, Any]:
        first, size = span
        return first, size, encoder.tokenize_async(texts[first:first + size], kind, pool=pool)

    def finish(started: tuple[int, int, Any]) -> tuple[int, int, Any]:
        first, size, tokenized = started
        return first, size, encoder.prepare_tokens(tokenized(first == 0), kind, batch_size)

    out = VectorsBuilder(n, ids, encoder.vocab_size)
    spans = window_spans(n, window, FIRST_WINDOW if first_window is None else first_window)
    prefetch = Pipeline(iter(spans), start, finish, depth=2)
    copier = ThreadPoolExecutor(1, thread_name_prefix="lsr-encode-copy")
    copying: Future | None = None
    try:
        for start, size, prepared in prefetch:
            pending = encoder.encode_prepared_async(prepared, ids[start:start + size], on_batch=on_batch)
            if copying is not None:
                copying.result()  # one window in flight: its pinned buffers go back to the cache
            copying = copier.submit(out.append, pending)
        if copying is not None:
            copying.result()
    finally:
        prefetch.close()
        copier.shutdown(wait=True)
    return out.result()
