"""Tokenization in worker processes, so the encoding process keeps its GIL for launching GPU work.

Turning the Rust tokenizer's output into Python lists of ids holds the GIL for ~10 µs per passage;
on a thread that starves the thread that launches the model's kernels. Workers are started with
"spawn" (safe next to CUDA) and import only numpy and tokenizers.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

__all__ = ["TokenizerPool", "encode_ids"]

_WORKER: Any = None  # the worker process's tokenizer


def encode_ids(tokenizer: Any, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Rust tokenizer -> (flat int64 [sum lengths] ids, lengths int64 [n]) for ``texts``."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets when available
    ids = [e.ids for e in encode(list(texts))]
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum())), lengths


def _init(tokenizer_json: str, max_length: int) -> None:
    from tokenizers import Tokenizer

    global _WORKER
    _WORKER = Tokenizer.from_str(tokenizer_json)
    _WORKER.no_padding()
    _WORKER.enable_truncation(max_length)


def _work(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return encode_ids(_WORKER, texts)


class TokenizerPool:
    """``workers`` processes tokenizing slices of a text list; results equal ``encode_ids``."""

    def __init__(self, tokenizer_json: str, max_length: int, workers: int) -> None:
        self.workers = workers
        self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_init, initargs=(tokenizer_json, max_length))

    def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        texts = list(texts)
        step = -(-len(texts) // (2 * self.workers))  # two slices per worker evens out long and short texts
        parts = list(self._pool.map(_work, [texts[i:i + step] for i in range(0, len(texts), step)]))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
