"""The tokenizer workers' side of ``lsr.encode.tokenize.pool``: the tokenize functions, the wire format and
the worker's main loop.

A worker is ``python -I -c`` running this file by path (``tokenize_pool._worker_command``), so this module
imports nothing of lsr at load time (``tokenize_function`` imports ``lsr.encode.tokenize.wordpiece`` when called). The
wire: every message starts with two int64s. The pool sends a (max_length, n_bytes) header with the
tokenizer's JSON, then per chunk (n texts, n_bytes) with the texts' code-point lengths and their UTF-8 blob;
the worker answers (_READY, 0) once loaded, then per chunk (n texts, n ids) with the lengths and the ids, or
(_FAILED, n_bytes) with a one-line message.
"""

from __future__ import annotations

import functools
import itertools
import os
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import numpy as np

__all__ = ["load_tokenizer", "token_arrays", "tokenize_function"]

_HEADER = struct.Struct("=qq")  # every message starts with two int64s (the module docstring says what they mean)
_READY, _FAILED = -2, -1  # first number of a worker's "tokenizer loaded" / "this chunk failed" message


def load_tokenizer(tokenizer_json: str, max_length: int) -> Any:
    """A ``tokenizers.Tokenizer`` from its JSON, truncating to ``max_length``, never padding."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    tok.no_padding()
    tok.enable_truncation(max_length)
    return tok


def token_arrays(tokenizer: Any, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """A ``tokenizers.Tokenizer`` (truncation set) -> (flat int32 [sum lengths] ids, lengths int64 [n])."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets when available
    ids = [e.ids for e in encode(texts if isinstance(texts, list) else list(texts))]
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum())), lengths


def tokenize_function(tokenizer_json: str, max_length: int) -> Callable[[list[str]], tuple[np.ndarray, np.ndarray]]:
    """texts -> ``token_arrays`` of the tokenizer in ``tokenizer_json`` truncating to ``max_length``, by the
    fastest exact route: the bulk WordPiece path (``lsr.encode.tokenize.wordpiece``, several times faster per core on
    MS MARCO passages) where the tokenizer is BERT-like, handing Rust the texts it does not cover; else Rust."""
    from lsr.encode.tokenize.wordpiece import fast_token_arrays

    rust = load_tokenizer(tokenizer_json, max_length)
    fallback = functools.partial(token_arrays, rust)
    return fast_token_arrays(rust, max_length, fallback) or fallback


def _read_exact(stream: BinaryIO, buffer: Any) -> None:
    """Fill ``buffer`` (any writable buffer: a NumPy array, a bytearray) from ``stream``; EOFError if the
    stream ends first."""
    view = memoryview(buffer).cast("B")
    got = 0
    while got < len(view):
        n = stream.readinto(view[got:])
        if not n:
            raise EOFError(f"stream ended after {got} of {len(view)} bytes")
        got += n


def _read_header(stream: BinaryIO) -> tuple[int, int]:
    head = bytearray(_HEADER.size)
    _read_exact(stream, head)
    return _HEADER.unpack(head)


def _write(stream: BinaryIO, first: int, second: int, *payload: Any) -> None:
    stream.write(_HEADER.pack(first, second))
    for part in payload:
        stream.write(part)
    stream.flush()


def _texts_message(texts: list[str]) -> tuple[np.ndarray, bytes]:
    """A chunk as its code-point lengths int64 [n] and the UTF-8 of the texts joined (lone surrogates kept:
    ``surrogatepass``, the worker decodes the same code points)."""
    try:
        blob = "".join(texts).encode("utf-8", "surrogatepass")
    except TypeError as e:
        raise TypeError(f"texts must be strings: {e}") from None
    return np.fromiter(map(len, texts), np.int64, len(texts)), blob


def _receive_texts(stream: BinaryIO, n: int, n_bytes: int) -> list[str]:
    lengths = np.empty(n, np.int64)
    _read_exact(stream, lengths)
    blob = bytearray(n_bytes)
    _read_exact(stream, blob)
    joined = blob.decode("utf-8", "surrogatepass")
    ends = np.cumsum(lengths).tolist()
    return [joined[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _serve() -> None:
    """Worker main: a (max_length, tokenizer JSON) header, then text chunks -> token arrays, until the
    pool hangs up (EOF or a closed result pipe, possibly before the header arrived)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, not into the result stream
    try:
        _serve_loop(sys.stdin.buffer, out)
    except (EOFError, BrokenPipeError):
        os._exit(0)  # skip flushing a pipe nobody reads


def _serve_loop(inp: BinaryIO, out: BinaryIO) -> None:
    max_length, n_bytes = _read_header(inp)
    spec = bytearray(n_bytes)
    _read_exact(inp, spec)
    tokenize = tokenize_function(spec.decode("utf-8"), max_length)
    _write(out, _READY, 0)
    while True:
        texts = _receive_texts(inp, *_read_header(inp))
        try:
            flat, lengths = tokenize(texts)
            flat, lengths = np.ascontiguousarray(flat, np.int32), np.ascontiguousarray(lengths, np.int64)
        except Exception as e:  # noqa: BLE001 - reported to the caller, the worker stays usable
            message = f"tokenizer worker: {type(e).__name__}: {e}".encode("utf-8", "backslashreplace")
            _write(out, _FAILED, len(message), message)
            continue
        _write(out, len(lengths), len(flat), lengths, flat)
