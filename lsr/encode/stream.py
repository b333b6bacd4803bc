"""Keeping the model busy while the CPU prepares the next texts: a bounded prefetch thread and a lazily
started tokenizer pool, shared by corpus encoding (``lsr.encode.corpus``) and in-memory encoding of long
text lists (``encode_windows``, behind ``SpladeEncoder.encode_document`` / ``encode_query``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["LazyPool", "Prefetch", "encode_windows"]

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
            item = self._q.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)  # it may sit in a slow document iterator; it is a daemon anyway


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class LazyPool:
    """What ``start()`` returns (a TokenizerPool or None), created on first ``get``; ``close`` also
    stops a later ``get`` (from a prefetch thread that outlived its consumer) from starting one."""

    def __init__(self, start: Callable[[], Any]) -> None:
        self._start, self._pool, self._closed = start, None, False
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._pool is None and not self._closed:
                self._pool = self._start()
                self._closed = self._pool is None  # nothing to start: do not ask again
            return self._pool

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._pool is not None:
                self._pool.close()
                self._pool = None




WINDOW = 32_768  # texts tokenized together: sorted by length into batches, and the unit of overlap


def encode_windows(encoder: Any, texts: Sequence[str], ids: Sequence[str] | None, kind: str,
                   batch_size: int | None = None, *, window: int = WINDOW, tokenize_workers: int | None = None,
                   on_batch: Callable[[int], None] | None = None) -> Any:
    """``encoder.encode_prepared(encoder.prepare(texts))`` for a long list, a window at a time: the next
    window is tokenized (in worker processes on CUDA) while the model encodes this one, as corpus
    encoding does. Returns SparseVectors in input order. ``encoder``: a SpladeEncoder."""
    from lsr.encode.tokenize_pool import default_workers
    from lsr.sparse import SparseVectors

    n = len(texts)
    ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in ids]
    if len(ids) != n:
        raise ValueError(f"got {len(ids)} ids for {n} texts")
    if len(set(ids)) != n:
        raise ValueError("ids must be unique")
    if tokenize_workers is None:
        tokenize_workers = default_workers() if encoder.device.type == "cuda" else 0
    pool = LazyPool(lambda: encoder.tokenizer_pool(kind, tokenize_workers) if tokenize_workers > 0 else None)
    first = [True]

    def prepare(start: int) -> tuple[int, Any]:
        # the first window is tokenized in-process on every core (the model has nothing to do yet)
        workers, first[0] = (None if first[0] else pool.get()), False
        return start, encoder.prepare(texts[start:start + window], kind, batch_size, pool=workers)

    prefetch = Prefetch(iter(range(0, n, window)), prepare, depth=2)
    try:
        parts = [encoder.encode_prepared(prepared, ids[start:start + window], on_batch=on_batch)
                 for start, prepared in prefetch]
    finally:
        prefetch.close()
        pool.close()
    return SparseVectors.concat(parts)
