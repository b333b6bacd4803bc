"""Short query batches encoded by replaying a CUDA graph: a few host calls instead of hundreds of small ops.

    runner = QueryGraphs(encoder)                          # SpladeEncoder.encode_query uses one of its own
    vectors = runner.encode(texts, ids, device_output=True)   # None where the batch does not fit a bucket
    packed = runner.pack(texts)                            # or in two steps: tokenize (host), then encode
    vectors, lengths = runner.encode_packed(packed, device_output=True)

Why: the GPU runs a batch of a few short queries in far less time than the host takes to issue its
backbone, Sparton head and extraction eagerly (dozens of small kernels and several host syncs;
scripts/profile_serve.py times both paths), and in the server every torch call also hands the GIL to the
event loop and waits to get it back. Here the device work of one batch, from packed token ids to the CSR
rows of its vectors, is captured once per bucket and replayed: one copy of the inputs, one replay, one copy
of the row lengths back (the only host sync, waited on with the GIL released), three slices.

Buckets: the batch is packed back to back in input order (the padding-free body, ``lsr.encode.backbone.varlen_body``)
and padded to ``slots`` texts (a power of two) and ``tokens`` tokens (``TOKEN_BUCKETS``, <= 25% apart). The
padding tokens form extra texts of at most ``max_length_query`` tokens after the real ones; the unused text
slots are empty (flash attention and the packed head skip them). Every row of the body's GEMMs is computed
at the bucket's row count, whatever the batch's real token count, so the eager run of the same bucketed
batch (``graphs=False``, and what ``encode_query`` does wherever no graph is used for a bucketable batch) runs
the same kernels on the same shapes and gives the same bits; a batch beyond the largest bucket runs the
unbucketed eager path. Outside the buckets nothing changes.

Extraction in the graph: ``nonzero_static`` with room for ``ROW_CAP`` terms per text slot (row-major, so
the real texts come first); a batch whose vectors hold more falls back to ``nonzero`` on the graph's output.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from lsr.encode.sparton import packed_tokens_sparton_head
from lsr.encode.splade.checkpoint import MaskedLMTower
from lsr.encode.splade.extract import to_csr
from lsr.encode.splade.st_checkpoint import StaticTower, activate
from lsr.sparse import SparseVectors
from lsr.utils.cuda_graphs import GraphPolicy, GraphSet, capture_graph
from lsr.utils.runtime import failure_memory

__all__ = ["CAPTURE_FAILED", "EXTRACT_FAILED", "GRAPH_CACHE", "MAX_SLOTS", "ROW_CAP", "TOKEN_BUCKETS", "QueryEncoder", "QueryGraphs", "QueryPack",
           "pack_queries", "slot_bucket", "token_bucket"]

MAX_SLOTS = 64       # texts per graph batch (the server's default max_batch); larger batches run eagerly
ROW_CAP = 1024       # terms per text slot the in-graph extraction holds (more: nonzero after the replay)
GRAPH_CACHE = 96     # graphs kept per encoder (least recently used dropped)

CAPTURE_FAILED = failure_memory("encode.query_graphs", "a CUDA graph capture of the query encoder",
                                "the batches of that bucket run eagerly (same bits)", category=RuntimeWarning)
EXTRACT_FAILED = failure_memory("encode.query_graphs.extract", "the in-graph extraction (nonzero_static) of a query "
                                "bucket", "its terms are extracted after the replay", category=RuntimeWarning)


def _token_buckets(first: int = 16, last: int = 4096, step: int = 16) -> tuple[int, ...]:
    """Multiples of ``step`` from ``first`` to ``last``, each at most 25% above the one before."""
    out = [first]
    while out[-1] < last:
        out.append(min(last, max(out[-1] + step, out[-1] * 5 // 4 // step * step)))
    return tuple(out)


TOKEN_BUCKETS = _token_buckets()


def slot_bucket(n_texts: int) -> int | None:
    """Text slots of the bucket holding ``n_texts`` texts (the next power of two), None beyond MAX_SLOTS."""
    if not 1 <= n_texts <= MAX_SLOTS:
        return None
    return 1 << (n_texts - 1).bit_length()


def token_bucket(n_tokens: int) -> int | None:
    """The smallest of TOKEN_BUCKETS holding ``n_tokens`` tokens, None beyond the largest."""
    i = int(np.searchsorted(TOKEN_BUCKETS, n_tokens))
    return TOKEN_BUCKETS[i] if n_tokens >= 1 and i < len(TOKEN_BUCKETS) else None


@dataclass
class QueryPack:
    """A batch packed for the bucket (``slots``, ``tokens``): ``host`` int64 [3·tokens + n_seqs + 1] holds
    token ids, positions, the text of each token and the cumulative sequence starts, back to back."""

    n: int
    slots: int
    tokens: int
    n_seqs: int
    host: np.ndarray

    @property
    def key(self) -> tuple[int, int]:
        return self.slots, self.tokens


def n_sequences(slots: int, tokens: int, max_len: int) -> int:
    """Sequences of a bucket's body: its text slots and room for the padding tokens in texts of <= max_len
    (a batch in this bucket has more than the previous bucket's tokens, so less padding than the gap)."""
    i = TOKEN_BUCKETS.index(tokens)
    gap = tokens - (TOKEN_BUCKETS[i - 1] if i else 0)
    return slots + -(-gap // max_len)


def pack_queries(flat: np.ndarray, lengths: np.ndarray, pad_id: int, max_len: int) -> QueryPack | None:
    """Token ids of n texts (``flat`` [sum lengths], ``lengths`` [n], each <= max_len) -> their bucketed
    pack, or None when the batch fits no bucket."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n, T = len(lengths), int(lengths.sum())
    slots, tokens = slot_bucket(n), token_bucket(T)
    if slots is None or tokens is None or (n and int(lengths.max()) > max_len) or lengths.min(initial=1) < 1:
        return None
    S = n_sequences(slots, tokens, max_len)
    pad = tokens - T
    chunks = np.full(-(-pad // max_len), max_len, dtype=np.int64)
    if pad % max_len:
        chunks[-1] = pad % max_len
    seq_len = np.zeros(S, dtype=np.int64)  # real texts, empty slots, padding texts, empty rest
    seq_len[:n] = lengths
    seq_len[slots:slots + len(chunks)] = chunks
    host = np.empty(3 * tokens + S + 1, dtype=np.int64)
    ids, pos, seg, cu = host[:tokens], host[tokens:2 * tokens], host[2 * tokens:3 * tokens], host[3 * tokens:]
    ids[:T] = flat
    ids[T:] = pad_id
    cu[0] = 0
    np.cumsum(seq_len, out=cu[1:])
    seg[:] = np.repeat(np.arange(S, dtype=np.int64), seq_len)
    pos[:] = np.arange(tokens, dtype=np.int64) - cu[seg]
    return QueryPack(n, slots, tokens, S, host)


class QueryEncoder(Protocol):
    """What this module needs of its encoder (``SpladeEncoder`` has it; named here so that the encoder module,
    which creates runners, is not imported back)."""

    device: torch.device
    dtype: torch.dtype
    backend: str
    max_length_query: int
    vocab_size: int

    def tower(self, kind: str) -> MaskedLMTower | StaticTower: ...

    def runs_packed(self, kind: str) -> bool: ...

    def tokenize(self, texts: Sequence[str], kind: str = "doc") -> tuple[Any, Any]: ...


class _Body:
    """The device work of one bucket: packed inputs (one int64 buffer) -> (row summary int64 [2, slots]:
    terms per text and 1 where a weight is not finite; indptr [slots + 1]; term ids int32 and weights float32
    [slots·ROW_CAP] of the first slots' nonzeros, row-major (None without ``extract``); the weights [slots, V])."""

    def __init__(self, encoder: QueryEncoder, slots: int, tokens: int, n_seqs: int, extract: bool = True,
                 row_cap: int = ROW_CAP) -> None:
        self.tower = encoder.tower("query")
        self.backend, self.max_len = encoder.backend, encoder.max_length_query
        self.slots, self.tokens, self.n_seqs, self.extract, self.row_cap = slots, tokens, n_seqs, extract, row_cap

    def __call__(self, buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t, tower = self.tokens, self.tower
        seg, cu = buf[2 * t:3 * t].to(torch.int32), buf[3 * t:].to(torch.int32)
        states = tower.varlen(buf[:t], buf[t:2 * t], cu, self.max_len, seg)
        y = packed_tokens_sparton_head(states, seg, self.n_seqs, tower.weight, tower.bias, backend=self.backend)
        y = activate(y, tower.activation)[:self.slots]
        counts = (y != 0).sum(1)
        summary = torch.stack([counts, (~torch.isfinite(y)).any(1).to(torch.int64)])
        indptr = torch.zeros(self.slots + 1, dtype=torch.int64, device=y.device)
        torch.cumsum(counts, 0, out=indptr[1:])
        if not self.extract:  # (capture fallback: the terms are extracted after the replay)
            return summary, indptr, None, None, y
        nz = torch.nonzero_static(y, size=self.slots * self.row_cap, fill_value=0)
        return summary, indptr, nz[:, 1].to(torch.int32), y[nz[:, 0], nz[:, 1]].float(), y


class _Graph:
    """One bucket's body captured as a CUDA graph on fixed buffers (inputs staged through pinned memory)."""

    def __init__(self, body: _Body, size: int, device: torch.device, pool: Any) -> None:
        self.host = torch.empty(size, dtype=torch.int64, pin_memory=True)
        self.buf = torch.zeros(size, dtype=torch.int64, device=device)
        # warm-up (compile / tune every kernel), then the capture; capture_graph neither synchronises the device nor
        # empties the allocator's caches (dozens of buckets are captured at warm-up)
        self.graph, self.out = capture_graph(lambda: body(self.buf), device, pool=pool)

    def __call__(self, packed: np.ndarray) -> tuple[torch.Tensor, ...]:
        self.host.numpy()[:] = packed  # the previous call has synchronised: its copy is done
        self.buf.copy_(self.host, non_blocking=True)
        self.graph.replay()
        return self.out


class QueryGraphs:
    """Bucketed query encoding for one SpladeEncoder (see the module doc); thread-safe.

    Args:
        encoder: a SpladeEncoder whose query tower has the padding-free body and max pooling.
        graphs: capture and replay CUDA graphs (default and possible: on CUDA in fp16 / bf16); False runs the
            bucketed body eagerly.
        row_cap: terms per text slot the in-graph extraction holds (a batch with more is extracted after the run).
    """

    def __init__(self, encoder: QueryEncoder, graphs: bool | None = None, *, row_cap: int = ROW_CAP) -> None:
        self.encoder, self.row_cap = encoder, row_cap
        self.device = encoder.device
        # graphs hold the flash-attention body (fp16 / bf16); in fp32 the attention twin runs, which the
        # capture's warm-up on an all-zero input drives out of bounds (a device-side assert, seen on an H100)
        capturable = self.device.type == "cuda" and encoder.dtype in (torch.float16, torch.bfloat16)
        self.graphs = capturable if graphs is None else bool(graphs) and capturable
        # one shared pool: the runner's lock serialises every replay and copy
        self.cache: GraphSet[_Graph] = GraphSet(CAPTURE_FAILED, GraphPolicy(max_graphs=GRAPH_CACHE))
        self._lock = threading.Lock()
        self._summary = torch.empty(2 * MAX_SLOTS, dtype=torch.int64, pin_memory=self.device.type == "cuda")
        self._done = torch.cuda.Event() if self.device.type == "cuda" else None
        self.failures: list[str] = []  # why captures failed (the batches of those buckets run eagerly)
        self._captured_with: tuple = ()  # the weights' signature the cached graphs were captured with

    def describe(self) -> dict[str, Any]:
        """Whether graphs are on, how many are held (per text slots) and why captures failed (if any)."""
        held: dict[str, int] = {}
        for (slots, _), graph in list(self.cache.graphs.items()):
            if graph is not None:
                held[str(slots)] = held.get(str(slots), 0) + 1
        return {"graphs": self.graphs, "held": sum(held.values()), "held_by_slots": held,
                "failures": self.failures[:5]}

    @staticmethod
    def applies(encoder: QueryEncoder) -> bool:
        """Whether the encoder's query tower runs the padding-free body this path captures."""
        return encoder.runs_packed("query")   # (a static tower has no body: varlen None)

    def pack(self, texts: Sequence[str]) -> QueryPack | None:
        """Tokenize ``texts`` as queries (with the encoder's prompt) and pack them for their bucket."""
        enc = self.encoder
        flat, lengths = enc.tokenize(texts, "query")
        return pack_queries(flat, lengths, enc.tower("query").pad_id, enc.max_length_query)

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], ids: Sequence[str] | None = None, *,
               device_output: bool = False) -> SparseVectors | None:
        """``encode_query(texts, ids)`` through the bucket's graph; None when the batch fits no bucket."""
        packed = self.pack(texts)
        return None if packed is None else self.encode_packed(packed, ids, device_output=device_output)[0]

    @torch.inference_mode()
    def encode_packed(self, packed: QueryPack, ids: Sequence[str] | None = None, *, device_output: bool = False,
                      copy: bool = True) -> tuple[SparseVectors, np.ndarray]:
        """The vectors of a ``pack`` result, SparseVectors in input order on the CPU (``device_output``: on the
        encoder's device, without the copy back), and their row lengths (int64 [n], on the host).
        ``copy=False`` (with ``device_output``): views of the graph's output buffers, which this runner's next
        call overwrites: for a caller that consumes them first (the server's device thread)."""
        ids = [str(i) for i in range(packed.n)] if ids is None else [str(i) for i in ids]
        if len(ids) != packed.n or len(set(ids)) != len(ids):
            raise ValueError(f"got {len(ids)} ids for {packed.n} texts; they must be unique")
        with self._lock:
            summary, indptr, terms, values, y = self._run(packed)
            n = packed.n
            host = self._summary[:2 * packed.slots].view(2, packed.slots)
            host.copy_(summary, non_blocking=True)
            if self.device.type == "cuda":
                self._done.record()
                self._done.synchronize()  # the batch's one host sync; waits without holding the GIL
            row_counts, row_bad = host.numpy()  # (numpy from here: every torch call is a GIL hand-off)
            counts = row_counts[:n].copy()
            if row_bad[:n].any():
                raise FloatingPointError(f"the model produced NaN/Inf SPLADE weights in {self.encoder.dtype}; "
                                         "try dtype=torch.float32")
            nnz = int(counts.sum())
            if terms is not None and nnz <= packed.slots * self.row_cap:
                own = copy and device_output  # (without device_output, .to("cpu") below copies)
                parts = [t.clone() if own else t for t in (indptr[:n + 1], terms[:nnz], values[:nnz])]
                vectors = SparseVectors(*parts, ids, self.encoder.vocab_size, validate=False)
            else:
                _, t, v = to_csr(y[:n], None)
                vectors = SparseVectors(indptr[:n + 1].clone(), t, v, ids, self.encoder.vocab_size, validate=False)
        return (vectors if device_output else vectors.to("cpu")), counts

    def _drop_stale_graphs(self) -> None:
        """Drop the graphs after a change of the query tower's weights (an optimizer step, a reload: their
        addresses or version counters): a graph reads the tensors it was captured with, among them the
        padding-free body's Q/K/V copy, which that body rebuilds on such a change."""
        tower = self.encoder.tower("query")
        params = [*tower.model.parameters(), tower.weight] + ([tower.bias] if tower.bias is not None else [])
        weights = tuple((p.data_ptr(), p._version) for p in params)
        if weights != self._captured_with:
            self.cache.clear()
            self._captured_with = weights

    def _run(self, packed: QueryPack) -> tuple[torch.Tensor, ...]:
        body_args = (packed.slots, packed.tokens, packed.n_seqs)
        if self.graphs:
            self._drop_stale_graphs()
        graph = self._graph(packed.key, body_args) if self.graphs else None
        if graph is not None:
            return graph(packed.host)
        buf = torch.from_numpy(packed.host).to(self.device)
        return _Body(self.encoder, *body_args, row_cap=self.row_cap)(buf)

    def _graph(self, key: tuple[int, int], body_args: tuple[int, int, int]) -> _Graph | None:
        return self.cache.lookup(key, lambda pool: self._capture(key, body_args, pool))

    def _capture(self, key: tuple[int, int], body_args: tuple[int, int, int], pool: Any) -> _Graph:
        """The bucket's graph; without the extraction where nonzero_static cannot be captured. Raises where neither
        can be captured (the cache records it: the bucket runs eagerly)."""
        try:
            return self._new_graph(key, body_args, pool, extract=True)
        except Exception as e:  # noqa: BLE001 - retried without the extraction, then recorded by the cache
            EXTRACT_FAILED.record(e)
        return self._new_graph(key, body_args, pool, extract=False)

    def _new_graph(self, key: tuple[int, int], body_args: tuple[int, int, int], pool: Any, extract: bool) -> _Graph:
        body = _Body(self.encoder, *body_args, extract=extract, row_cap=self.row_cap)
        try:
            return _Graph(body, 3 * key[1] + body_args[2] + 1, self.device, pool)
        except Exception as e:
            self.failures.append(f"{key} extract={extract}: {type(e).__name__}: {str(e)[:300]}")
            raise

    def warmup(self, max_batch: int = MAX_SLOTS, tokens_per_text: tuple[int, int] = (3, 24)) -> int:
        """Capture the graphs of the buckets that batches of up to ``max_batch`` texts of ``tokens_per_text``
        tokens each (a range, special tokens included) fall into; returns how many graphs are held."""
        if not self.graphs:
            return 0
        max_len, (lo, hi) = self.encoder.max_length_query, tokens_per_text
        keys = set()
        for n in range(1, min(max_batch, MAX_SLOTS) + 1):
            keys |= {(slot_bucket(n), token_bucket(t)) for t in range(n * lo, n * min(hi, max_len) + 1)}
        with self._lock, torch.inference_mode():
            self._drop_stale_graphs()
            # the largest buckets first: the shared pool grows to the largest graph's temporaries once, and the
            # smaller graphs captured after reuse those freed blocks (in ascending order each capture outgrows them)
            for slots, tokens in sorted((k for k in keys if k[1] is not None), reverse=True):
                self._graph((slots, tokens), (slots, tokens, n_sequences(slots, tokens, max_len)))
        return len(self.cache.held())
