"""Tokenization in worker processes, so the encoding process's GIL stays with the thread that runs the model.

    pool = TokenizerPool(tokenizer_json, max_length=256, workers=8)
    flat, lengths = pool(texts)      # == token_arrays(tokenizer, texts), computed in 8 processes
    pool.close()

Why processes: the Rust tokenizer releases the GIL, but reading its output (``Encoding.ids``, one Python
list per text) holds the GIL for every passage. On a thread beside the model that starves the
launching thread: every torch op releases the GIL and then waits up to the switch interval to get
it back while the other thread loops in Python. Workers return NumPy arrays, which cross the process
boundary as flat buffers. Each worker tokenizes on one core (the pool is the parallelism; the Rust
thread pool would otherwise start one thread per core in every worker), with ``tokenize_function``: the
bulk WordPiece path of ``lsr.encode.tokenize.wordpiece`` for BERT-like tokenizers, else Rust.

Workers are plain isolated ``python -I -c`` subprocesses (see ``_worker_command``) that import only numpy and
tokenizers, not multiprocessing children: those would re-import the caller's ``__main__`` module (a script that
loads a model) and need a ``__main__`` guard in every script. They talk over their stdin / stdout in raw
buffers, no pickle: a chunk of texts goes as its code-point lengths and one UTF-8 blob, and its token arrays
come back as a two-number header and the arrays' bytes, read straight into NumPy arrays (``readinto``, which
releases the GIL); the pipes are enlarged to hold a whole chunk (``PIPE_BYTES``), so a round trip is a few
system calls. What this costs the encoding process per passage: ``scripts/bench_host_input.py``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import select
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from lsr.encode.tokenize import worker as tokenize_worker
from lsr.encode.tokenize.worker import (
    _FAILED,
    _HEADER,
    _READY,
    _read_exact,
    _read_header,
    _texts_message,
    _write,
    load_tokenizer,
    token_arrays,
    tokenize_function,
)

__all__ = ["CHUNK", "PIPE_BYTES", "TokenizerPool", "default_workers", "load_tokenizer", "token_arrays", "tokenize_function"]

Tokenize = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]  # texts -> (flat int32 ids, lengths int64)
_WORKER_FILE = Path(tokenize_worker.__file__).resolve()
CHUNK = 1024  # texts per task (a pool's default ``chunk``): balances 8-16 workers (and a helping caller) over a 32K window


def default_workers() -> int:
    """Worker processes worth starting on this machine: this process's share of the cores (the ranks of a
    torchrun job on one host, ``LOCAL_WORLD_SIZE``, share them) left after the launching, batching and
    writing threads (4), at most 8 (enough to feed one GPU on MS MARCO passages); 0 below 6 cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    cores //= max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return 0 if cores < 6 else min(8, cores - 4)


PIPE_BYTES = 1 << 20  # a chunk of 1,024 MS MARCO passages is ~0.6 MB of text and ~0.3 MB of ids


def _worker_command() -> list[str]:
    """``python -I`` (no cwd or script folder on sys.path, no PYTHON* variables) with the caller's
    absolute sys.path minus the working directory, running this file by path: a ``tokenizers.py`` (or
    ``numpy.py``) in the working directory is never imported by a worker. The folder holding this
    ``lsr`` package comes first, so the worker imports the caller's ``lsr.encode.tokenize.wordpiece``."""
    cwd = Path.cwd().resolve()
    paths = [str(Path(__file__).resolve().parents[3])]
    paths += [p for p in sys.path if p and os.path.isabs(p) and Path(p).resolve() not in (cwd, Path(paths[0]))]
    code = f"import runpy, sys; sys.path[:] = {paths!r}; runpy.run_path({str(_WORKER_FILE)!r})['_serve']()"
    return [sys.executable, "-I", "-c", code]


class _Worker:
    def __init__(self, tokenizer_json: str, max_length: int, pipe_bytes: int | None) -> None:
        env = dict(os.environ, RAYON_NUM_THREADS="1")
        self.proc = subprocess.Popen(_worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        _enlarge(self.proc.stdout, pipe_bytes)
        self.capacity = _enlarge(self.proc.stdin, pipe_bytes)  # bytes a request may have to be sent ahead (0: none)
        # the header (~1 MB of tokenizer JSON) fills the pipe until the worker has started and reads it:
        # send it from a thread, so that all workers start at once
        self._header_error: BaseException | None = None
        self.ready = False
        self._header = threading.Thread(target=self._send_header, args=(tokenizer_json, max_length), daemon=True)
        self._header.start()

    def _send_header(self, tokenizer_json: str, max_length: int) -> None:
        try:
            spec = tokenizer_json.encode("utf-8")
            _write(self.proc.stdin, max_length, len(spec), spec)
        except BaseException as e:  # noqa: BLE001 - re-raised by call()
            self._header_error = e

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds; None: until it is) for the worker to load the tokenizer;
        True once it has."""
        if not self.ready:
            self._header.join(timeout)
            if self._header.is_alive():
                return False
            if self._header_error is not None:
                raise self._header_error
            if timeout is not None and os.name == "posix" and not select.select([self.proc.stdout], [], [], timeout)[0]:
                return False
            with self._died():
                kind, _ = _read_header(self.proc.stdout)
            if kind != _READY:
                raise RuntimeError(f"tokenizer worker {self.proc.pid} sent {kind} instead of its ready message")
            self.ready = True
        return self.ready

    def send(self, message: tuple[np.ndarray, bytes]) -> None:
        """Queue a chunk (``_texts_message``); its result comes from ``receive``, in the order sent."""
        self.wait_ready()
        lengths, blob = message
        with self._died():
            _write(self.proc.stdin, len(lengths), len(blob), lengths, blob)

    def receive(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The (flat ids, lengths) of the oldest chunk sent, of ``n`` texts."""
        with self._died():
            got, size = _read_header(self.proc.stdout)
            if got == _FAILED:
                message = bytearray(size)
                _read_exact(self.proc.stdout, message)
                raise _WorkerError(message.decode("utf-8"))
            if got != n or size < 0:
                raise EOFError(f"a result of {got} texts and {size} tokens for {n} texts")
            lengths, flat = np.empty(n, np.int64), np.empty(size, np.int32)
            _read_exact(self.proc.stdout, lengths)
            _read_exact(self.proc.stdout, flat)
        return flat, lengths

    @contextlib.contextmanager
    def _died(self) -> Iterator[None]:
        try:
            yield
        except (OSError, EOFError, ValueError) as e:  # (ValueError: I/O on a pipe closed by close())
            raise RuntimeError(f"tokenizer worker {self.proc.pid} died (exit code {self.proc.poll()}); "
                               "its error, if any, is on stderr") from e

    def hang_up(self) -> None:
        """Close the pipes: the worker reads EOF and exits."""
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def join(self) -> None:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _WorkerError(RuntimeError):
    """A chunk the worker could not tokenize (the worker goes on serving)."""


def _enlarge(pipe: BinaryIO, pipe_bytes: int | None) -> int:
    """Let the pipe hold ``pipe_bytes`` (a whole chunk) where the system allows it (Linux ``F_SETPIPE_SZ``;
    elsewhere, or over the user's pipe quota, it keeps its size and messages just take more system calls);
    returns the bytes it holds (0 where that is not known, and for ``pipe_bytes=None``: the pipe is left alone,
    as where its size cannot be read, e.g. macOS)."""
    if pipe_bytes is None:
        return 0
    try:
        import fcntl

        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, pipe_bytes)
        return fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ)
    except (ImportError, AttributeError, OSError):
        return 0


class _Chunks:
    """A text list cut into ``chunk``-text parts that several threads take one at a time."""

    def __init__(self, texts: list[str], chunk: int) -> None:
        self.parts = [texts[i:i + chunk] for i in range(0, len(texts), chunk)]
        self.results: list[Any] = [None] * len(self.parts)
        self._next, self._lock = 0, threading.Lock()

    @property
    def exhausted(self) -> bool:
        return self._next >= len(self.parts)

    def _take(self) -> int | None:
        with self._lock:
            i, self._next = self._next, self._next + 1
        return i if i < len(self.parts) else None

    def drain(self, tokenize: Callable[[list[str]], Any]) -> None:
        """Tokenize parts until none is left."""
        while (i := self._take()) is not None:
            self.results[i] = tokenize(self.parts[i])

    def feed(self, worker: _Worker, done: Callable[[tuple[np.ndarray, np.ndarray]], Any]) -> None:
        """Hand parts to ``worker`` until none is left, the next one sent before the last one's result is read:
        the worker goes on as soon as it has answered, however long this thread then waits for the GIL. A
        part goes ahead only if it fits in the pipe (``worker.capacity``): the worker writes its answer only
        after reading the whole next request, so neither side then waits on a full pipe."""
        sent: collections.deque[int] = collections.deque()
        try:
            while (i := self._take()) is not None:
                message = _texts_message(self.parts[i])
                if sent and _HEADER.size + message[0].nbytes + len(message[1]) > worker.capacity:
                    self._collect(worker, sent, done, keep=0)
                worker.send(message)
                sent.append(i)
                self._collect(worker, sent, done, keep=1)
            self._collect(worker, sent, done, keep=0)
        except BaseException:
            _settle(worker, [len(self.parts[j]) for j in sent])
            raise

    def _collect(self, worker: _Worker, sent: collections.deque[int], done: Callable, keep: int) -> None:
        while len(sent) > keep:
            j = sent.popleft()  # (its answer is read below, an error message included)
            self.results[j] = done(worker.receive(len(self.parts[j])))


def _settle(worker: _Worker, owed: list[int]) -> None:
    """After an error, read the answers ``worker`` still owes (their text counts), so that its next request
    starts a fresh exchange; stop at the first sign that it died."""
    for n in owed:
        try:
            worker.receive(n)
        except _WorkerError:
            continue
        except Exception:  # noqa: BLE001 - it died: its next call reports that
            return


class TokenizerPool:
    """``workers`` processes, each holding the tokenizer serialised in ``tokenizer_json``
    (``tokenizers.Tokenizer.to_str()``) with truncation to ``max_length`` and no padding.
    Calling it with a text list returns what ``token_arrays`` returns for the same tokenizer;
    calls from several threads are safe (a worker serves one chunk at a time).

    ``chunk``: texts per task (an attribute: later calls use its new value); ``pipe_bytes``: what the pipes to
    the workers are enlarged to (None: left as they are, and nothing is sent ahead)."""

    def __init__(self, tokenizer_json: str, max_length: int, workers: int, *, chunk: int = CHUNK,
                 pipe_bytes: int | None = PIPE_BYTES) -> None:
        if workers <= 0:
            raise ValueError(f"workers must be positive, got {workers}")
        if chunk <= 0:
            raise ValueError(f"chunk must be positive, got {chunk}")
        self.workers, self.max_length, self.chunk = workers, max_length, chunk
        self.tag: str | None = None  # what the owner tokenizes with it (SpladeEncoder: "doc" / "query")
        self.texts_by_workers = 0  # texts the worker processes tokenized so far (the rest: by ``local``)
        self._lock = threading.Lock()
        self._all: list[_Worker] = []
        self._idle: queue.Queue[_Worker] = queue.Queue()
        try:
            for _ in range(workers):  # started now; they load the tokenizer while the caller sets up
                self._all.append(_Worker(tokenizer_json, max_length, pipe_bytes))
                self._idle.put(self._all[-1])
        except BaseException:
            self.close()
            raise
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="lsr-tokenize")

    def _drain_with_worker(self, chunks: _Chunks) -> None:
        worker = self._idle.get()
        try:
            while not worker.wait_ready(0.01):  # a worker still starting takes no chunk: the others go on
                if chunks.exhausted:
                    return
            chunks.feed(worker, self._count)
        finally:
            self._idle.put(worker)

    def _count(self, result: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            self.texts_by_workers += len(result[1])
        return result

    def __call__(self, texts: Sequence[str], local: Tokenize | None = None) -> tuple[np.ndarray, np.ndarray]:
        """texts [n] -> (flat int32 [sum lengths] token ids, lengths int64 [n]), in input order. Chunks of
        ``chunk`` texts go to whichever worker is free; ``local`` (an in-process tokenizer giving the same
        arrays): the calling thread tokenizes chunks too, e.g. while the workers start up."""
        return self.submit(texts)(local)

    def submit(self, texts: Sequence[str]) -> Callable[[Tokenize | None], tuple[np.ndarray, np.ndarray]]:
        """Start tokenizing ``texts`` and return at once a function ``finish(local)`` that returns what this
        pool's call returns (``local``: as there). The chunks of texts submitted later go to the workers as
        they finish these, so a caller can submit the next text list before it handles this one's arrays."""
        texts = texts if isinstance(texts, list) else list(texts)
        if not self._all:
            raise RuntimeError("this TokenizerPool is closed")
        chunks = _Chunks(texts, self.chunk)
        helpers = [self._threads.submit(self._drain_with_worker, chunks) for _ in range(min(self.workers, len(chunks.parts)))]

        def finish(local: Tokenize | None = None) -> tuple[np.ndarray, np.ndarray]:
            if local is not None:
                chunks.drain(local)
            for helper in helpers:
                helper.result()
            if not texts:
                return np.zeros(0, np.int32), np.zeros(0, np.int64)
            return np.concatenate([r[0] for r in chunks.results]), np.concatenate([r[1] for r in chunks.results])

        return finish

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        threads = getattr(self, "_threads", None)
        if threads is not None:
            threads.shutdown(wait=True)
        workers, self._all = self._all, []
        for worker in workers:  # all of them exit in parallel
            worker.hang_up()
        for worker in workers:
            worker.join()

    def __enter__(self) -> TokenizerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
