"""SPLADE encoder: a Hugging Face masked LM cut into backbone + MLM transform, then the Sparton head.

    enc = SpladeEncoder.from_pretrained("naver/splade-cocondenser-ensembledistil")  # or a local directory
    docs = enc.encode_document(texts, ids)      # SparseVectors on the CPU, rows in input order
    queries = enc.encode_query(query_texts, qids)
    enc.decode(queries[:1])                      # [[("token", weight), ...]] best first

For every text Y[v] = max_s log1p(relu(T(H_s)·E_v + b_v)) over its unmasked positions s, where H are the
backbone's hidden states, T the checkpoint's own MLM transform (BERT ``cls.predictions.transform``,
DistilBERT ``vocab_transform → act → vocab_layer_norm``, RoBERTa/XLM-R ``lm_head.dense → gelu →
layer_norm``, ModernBERT ``head``) and (E, b) its decoder. T runs by calling the masked LM with its
output embedding replaced by an identity, so any head that ends in its decoder Linear works without
an architecture table; ``lsr.encode.sparton.sparton_head`` then pools without building [B, S, V].

Batch calls tokenize once (``lsr.encode.tokenize.wordpiece`` for BERT-like tokenizers, else the Rust one; truncation
to the query / document max length; on CUDA, lists of 2K+ texts in worker processes), sort the texts by
length so each batch pads little, and restore the input order at the end (``lsr.encode.splade.extract``).
``prepare`` / ``encode_prepared`` expose the two halves so ``lsr.encode.corpus`` can tokenize the
next window on a CPU thread while the GPU encodes this one. On CUDA with fp16/bf16, BERT and DistilBERT
checkpoints skip the padding altogether: ``lsr.encode.backbone.varlen_body`` runs them on the batch's packed
tokens and the packed head pools those directly (``varlen=False`` keeps HF's padded forward).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from lsr.encode.base import sparse_output
from lsr.encode.bm25.lexical import decode_rows, vocab_hash
from lsr.encode.splade.causal import load_tower
from lsr.encode.splade.checkpoint import MaskedLMTower, TextTokenizer, resolve_dtype
from lsr.encode.splade.extract import CountedRows, PendingVectors, rows_to_input_order
from lsr.encode.splade.forward import EncodePlan, encode_batch, plan_encode, uses_packed_body
from lsr.encode.splade.query_graphs import QueryGraphs
from lsr.encode.splade.st_checkpoint import StaticTower, find_st_folder, load_st_towers, read_st_checkpoint
from lsr.encode.stream import WINDOW, encode_windows, windows_pool
from lsr.encode.tokenize.batching import PreparedTexts, TokenBatch, length_sorted_batches
from lsr.encode.tokenize.pool import CHUNK, TokenizerPool
from lsr.sparse import SparseVectors

__all__ = ["PreparedTexts", "SpladeEncoder", "TokenBatch"]

_KEEP = object()  # "use the encoder's doc_top_k"
# sentence-transformers' activation names -> the per-position function, as describe() records it
_ACTIVATIONS = {"relu": "log1p_relu", "log1p_relu": "log1p_log1p_relu"}


class SpladeEncoder:
    """SPLADE document / query encoder (build it with ``from_pretrained``).

    Attributes: ``vocab`` (term id -> token), ``vocab_size``, ``device``, ``dtype``, ``max_length_query``,
    ``max_length_doc``, ``doc_top_k`` (documents keep their k largest weights; None keeps all),
    ``batch_size`` (texts per batch), ``max_tokens`` (padded tokens per batch; None: no budget),
    ``pad_multiple`` (batch widths are rounded up to it; 1 = no padding beyond the longest text), ``window``
    (longer text lists are tokenized and encoded a window at a time, the next window's tokens on their way meanwhile),
    ``packed`` (inference on the Triton path uses the packed head, which computes real tokens only, for
    batch widths where that pays: ``lsr.encode.sparton.fwd_packed.packing_pays``), ``varlen`` (None: the padding-free
    backbone ``lsr.encode.backbone.varlen_body`` where it has flash attention, i.e. CUDA with fp16/bf16, for the
    architectures it covers; True: wherever it covers the architecture; False: HF's padded forward).
    """

    def __init__(self, doc: MaskedLMTower, query: MaskedLMTower | StaticTower, *, device: torch.device,
                 dtype: torch.dtype, max_length_query: int, max_length_doc: int, doc_top_k: int | None, backend: str,
                 batch_size: int, max_tokens: int | None, packed: bool = True, varlen: bool | None = None,
                 prompts: dict[str, str] | None = None) -> None:
        if query.vocab != doc.vocab:
            raise ValueError(f"query model {query.name!r} and document model {doc.name!r} have different vocabularies")
        if doc_top_k is not None and doc_top_k <= 0:
            raise ValueError("doc_top_k must be positive (or None)")
        self._towers = {"doc": doc, "query": query}
        self.device, self.dtype, self.backend, self.packed, self.varlen = device, dtype, backend, packed, varlen
        self.max_length_query, self.max_length_doc, self.doc_top_k = max_length_query, max_length_doc, doc_top_k
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.pad_multiple = 1  # every extra position costs compute; sdpa and cuBLAS take any length
        self.window = WINDOW  # longer text lists are encoded a window at a time (``lsr.encode.stream``)
        self.tokenize_chunk = CHUNK  # texts per task of the tokenizer worker processes
        self.prompts = {"query": "", "doc": "", **(prompts or {})}  # prepended to texts (sentence-transformers prompts)
        self._tokenizers: dict[str, TextTokenizer] = {}
        self._lock = threading.Lock()
        self._pools: dict[str, tuple[int, int, TokenizerPool]] = {}  # kind -> (workers, pid, pool)
        self._pool_lock = threading.Lock()
        self.query_graphs: bool | None = None  # CUDA graphs for short query batches (None: on CUDA)
        self._query_runners: dict[bool | None, QueryGraphs] = {}  # by query_graphs setting

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, *, device: str | torch.device | None = None,
                        dtype: torch.dtype | str | None = None, query_model: str | os.PathLike | None = None,
                        max_length_query: int | None = None, max_length_doc: int | None = None,
                        doc_top_k: int | None = None,
                        backend: str = "auto", local_files_only: bool | None = None, revision: str | None = None,
                        batch_size: int | None = None, max_tokens: int | None = None,
                        attn_implementation: str | None = "sdpa", compile: bool = False,
                        packed: bool = True, varlen: bool | None = None, gelu_epilogue: bool = True,
                        attention: str | None = None, mask_special_tokens: bool = True) -> SpladeEncoder:
        """Load a masked-LM or decoder-LLM checkpoint (HF id or local directory) as a SPLADE encoder.

        A sentence-transformers SparseEncoder checkpoint (a folder or hub repository with ``modules.json``)
        loads with its pooling, activation, max length and prompts, including the inference-free layout
        whose queries are weighted by a token table (``lsr.encode.splade.st_checkpoint``). ``max_length_query`` /
        ``max_length_doc``: None = the checkpoint's (sentence-transformers) or 64 / 256 (plain checkpoints).
        ``device``: default CUDA when available. ``dtype``: default bf16 on CUDA, fp32 on CPU.
        ``query_model``: separate checkpoint for queries (same vocabulary). ``local_files_only``: None =
        only when HF_HUB_OFFLINE=1 or the hub is unreachable (a missing model then fails at once).
        ``backend``: Sparton head backend ("auto" = Triton on CUDA). ``packed``: on the Triton backend,
        encode with the packed head (texts share token tiles; same results). ``varlen``: run BERT / DistilBERT
        backbones on packed tokens with flash attention, no padding (None: where flash attention runs, i.e.
        CUDA fp16/bf16; True: also elsewhere, through an sdpa twin; False: never). ``gelu_epilogue``: in that
        backbone on CUDA fp16/bf16, each GELU feed-forward layer runs up-projection and GELU as one cuBLASLt GEMM
        (GELU in its tanh form, applied in fp32 before the one rounding: faster, and in bf16 closer to fp32 erf
        GELU than the separate call; ``lsr.encode.backbone.varlen_body``); False calls the model's own activation. ``batch_size`` / ``max_tokens``:
        batching defaults (CUDA: 1024 texts / 131072 padded tokens; CPU: 32 / none).
        ``compile``: torch.compile the backbone (dynamic shapes; the padding-free one when it is used); what
        it gains per backbone is measured in docs/performance/encode.md. Decoder LLMs (Qwen3, Llama, Mistral:
        ``...ForCausalLM`` checkpoints) pool their LM head's logits (``lsr.encode.splade.causal``): ``attention``
        "causal" (None: the model's own) or "bidirectional"; ``mask_special_tokens``: their special tokens and the
        embedding rows past the tokenizer get weight 0. ``explain()`` prints the routes a batch takes.
        """
        dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dt = resolve_dtype(dtype, dev)
        folder, found = find_st_folder(str(name_or_path), local_files_only, revision), {}
        if folder is not None:
            doc, query, found = load_st_towers(read_st_checkpoint(folder), dev, dt, attn_implementation,
                                               attention=attention, mask_special_tokens=mask_special_tokens)
            doc.name = str(name_or_path)
            if query is not doc:
                query.name = f"{name_or_path} (query route)"
        else:
            doc = query = load_tower(str(name_or_path), dev, dt, local_files_only, revision, attn_implementation,
                                     attention=attention, mask_special_tokens=mask_special_tokens)
        if query_model is not None:
            query = load_tower(str(query_model), dev, dt, local_files_only, None, attn_implementation,
                               attention=attention, mask_special_tokens=mask_special_tokens)
        max_length_doc = max_length_doc or found.get("max_length_doc", 256)
        max_length_query = max_length_query or found.get("max_length_query", 64)
        for tower, length in ((doc, max_length_doc), (query, max_length_query)):
            if tower.max_positions is not None and length > tower.max_positions:
                raise ValueError(f"{tower.name}: max_length {length} exceeds the model's {tower.max_positions} positions")
        for tower in {id(doc): doc, id(query): query}.values():
            if not tower.static and tower.varlen is not None:
                tower.varlen.gelu_epilogue = gelu_epilogue
        if compile:
            for tower in {id(doc): doc, id(query): query}.values():
                if tower.static:
                    continue
                tower.body = torch.compile(tower.body, dynamic=True)
                if tower.varlen is not None:
                    tower.varlen.compile()
        cuda = dev.type == "cuda"
        return cls(doc, query, device=dev, dtype=dt, max_length_query=max_length_query, max_length_doc=max_length_doc,
                   doc_top_k=doc_top_k, backend=backend, batch_size=batch_size or (1024 if cuda else 32),
                   max_tokens=max_tokens if max_tokens is not None else (131072 if cuda else None), packed=packed,
                   varlen=varlen, prompts=found.get("prompts"))

    # ------------------------------------------------------------------ facts
    @property
    def vocab(self) -> list[str]:
        return self._towers["doc"].vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def describe(self) -> dict[str, Any]:
        """JSON facts stored with the vectors (resume and search check them)."""
        doc, query = self._towers["doc"], self._towers["query"]
        extra = {"query_encoder": "static"} if query.static else {}
        if any(self.prompts.values()):
            extra["prompts"] = dict(self.prompts)
        if doc.attention is not None:  # a decoder LLM's: causal and bidirectional vectors do not mix
            extra["attention"] = doc.attention
        if query is not doc and not query.static and (query.pooling, query.activation) != (doc.pooling, doc.activation):
            extra["query_pooling"], extra["query_activation"] = query.pooling, _ACTIVATIONS[query.activation]
        return extra | {
            "kind": "splade", "model": doc.name, "revision": doc.revision, "architecture": doc.architecture,
            "query_model": None if query is doc else query.name, "query_revision": None if query is doc else query.revision,
            "max_length_query": self.max_length_query, "max_length_doc": self.max_length_doc,
            "doc_top_k": self.doc_top_k, "vocab_size": self.vocab_size, "vocab_hash": vocab_hash(self.vocab),
            "dtype": str(self.dtype).removeprefix("torch."), "pooling": doc.pooling,
            "activation": _ACTIVATIONS[doc.activation]}

    def tower(self, kind: str) -> MaskedLMTower | StaticTower:
        """The model that encodes ``kind`` texts: "doc" or "query" (the same object unless a query model is set)."""
        if kind not in self._towers:
            raise ValueError(f"kind must be 'query' or 'doc', got {kind!r}")
        return self._towers[kind]

    def runs_packed(self, kind: str) -> bool:
        """Whether inference runs ``kind`` batches padding-free (``forward.uses_packed_body``)."""
        return uses_packed_body(self.tower(kind), self.varlen, self.device, self.dtype)

    def explain(self, kind: str = "doc", batch: int = 32, seq: int | None = None, *, train: bool = False) -> EncodePlan:
        """The routes a [batch, seq] batch of ``kind`` texts takes: body and Sparton head, each with why (printable).
        ``seq``: default the kind's max length; ``train``: as ``TrainableEncoder`` runs it (bf16 autocast on CUDA)."""
        seq = seq or (self.max_length_doc if kind == "doc" else self.max_length_query)
        dtype = torch.bfloat16 if train and self.device.type == "cuda" else self.dtype
        plan = plan_encode(self.tower(kind), varlen=self.varlen, device=self.device, dtype=dtype, backend=self.backend,
                           packed=self.packed, batch=batch, seq=seq, train=train)
        return replace(plan, kind=kind)

    def __repr__(self) -> str:
        return (f"SpladeEncoder({self._towers['doc'].name!r}, device={self.device}, dtype={self.dtype}, "
                f"max_length_doc={self.max_length_doc}, max_length_query={self.max_length_query})")

    # ------------------------------------------------------------------ tokenize + batch (CPU, thread-safe)
    def _tokenizer(self, kind: str) -> TextTokenizer:
        with self._lock:
            if kind not in self._tokenizers:
                if kind not in self._towers:
                    raise ValueError(f"kind must be 'query' or 'doc', got {kind!r}")
                length = self.max_length_doc if kind == "doc" else self.max_length_query
                tower = self._towers[kind]
                self._tokenizers[kind] = TextTokenizer(tower.tokenizer, length, add_special_tokens=not tower.static)
            return self._tokenizers[kind]

    def tokenizer_pool(self, kind: str = "doc", workers: int = 8) -> TokenizerPool | None:
        """Worker processes that tokenize ``kind`` texts for ``prepare(..., pool=...)`` (close it after
        use), ``tokenize_chunk`` texts per task; None when the tokenizer is not a fast (Rust) one."""
        pool = self._tokenizer(kind).pool(workers, chunk=self.tokenize_chunk)
        if pool is not None:
            pool.tag = kind
        return pool

    def shared_tokenizer_pool(self, kind: str = "doc", workers: int = 8) -> TokenizerPool | None:
        """``tokenizer_pool(kind, workers)`` kept running for later calls (long ``encode_document`` lists,
        ``encode_corpus``), so that its processes start once; ``close()`` stops it (so do garbage
        collection and the interpreter's exit). Asking for another worker count replaces it."""
        with self._pool_lock:
            held = self._pools.get(kind)
            if held is not None and held[1] != os.getpid():  # a forked child: its parent's pipes are not its own
                held = None
            elif held is not None and held[0] != workers:
                held[2].close()
                held = None
            if held is None:
                pool = self.tokenizer_pool(kind, workers)
                if pool is None:
                    return None
                held = self._pools[kind] = (workers, os.getpid(), pool)
                weakref.finalize(self, pool.close)
            return held[2]

    def close(self) -> None:
        """Stop the tokenizer processes of ``shared_tokenizer_pool`` (the encoder stays usable)."""
        with self._pool_lock:
            pools, self._pools = self._pools, {}
        for _, pid, pool in pools.values():
            if pid == os.getpid():
                pool.close()

    def prepare(self, texts: Sequence[str], kind: str = "doc", batch_size: int | None = None,
                max_tokens: int | None = None, *, pool: TokenizerPool | None = None, join_pool: bool = False,
                ) -> PreparedTexts:
        """Tokenize ``texts`` and cut them into batches of similar length (longest first, so the peak
        memory shows up at once). Pure CPU work: safe to run on a worker thread. ``pool``: tokenize in
        the worker processes of ``tokenizer_pool(kind)`` (same result, without holding this process's GIL);
        ``join_pool``: this thread tokenizes chunks too (when nothing else needs it, e.g. the first window)."""
        tokens = self.tokenize_async(texts, kind, pool=pool)(join_pool)
        return self.prepare_tokens(tokens, kind, batch_size, max_tokens)

    def tokenize_async(self, texts: Sequence[str], kind: str = "doc", *, pool: TokenizerPool | None = None,
                       ) -> Callable[[bool], tuple[Any, Any]]:
        """``prepare`` in two halves, so that a pipeline can submit the next texts to the pool before it cuts
        these into batches: this starts tokenizing (in ``pool``'s workers; without a pool nothing starts yet)
        and returns ``finish(join_pool)`` -> (flat int32 ids, lengths int64) for ``prepare_tokens``."""
        texts = self._prompted(texts, kind, pool)
        tokenizer = self._tokenizer(kind)
        if pool is None:
            return lambda join_pool=False: tokenizer(texts)
        finish = pool.submit(texts)
        return lambda join_pool=False: finish(tokenizer if join_pool else None)

    def prepare_tokens(self, tokens: tuple[Any, Any], kind: str = "doc", batch_size: int | None = None,
                       max_tokens: int | None = None) -> PreparedTexts:
        """``prepare`` of texts already tokenized (``tokenize_async``): (flat ids, lengths) -> batches."""
        tower = self._towers[kind]
        return length_sorted_batches(kind, *tokens, batch_size or self.batch_size,
                                     max_tokens if max_tokens is not None else self.max_tokens,
                                     max(1, self.pad_multiple), tower.pad_id, pin=self.device.type == "cuda",
                                     padded=not self.runs_packed(kind))

    def tokenize(self, texts: Sequence[str], kind: str = "doc") -> tuple[Any, Any]:
        """Token ids of ``texts`` as ``kind`` texts (prompt prepended, truncated): (flat int32 ids, lengths int64)."""
        return self._tokenizer(kind)(list(self._prompted(texts, kind, None)))

    def _prompted(self, texts: Sequence[str], kind: str, pool: TokenizerPool | None) -> Sequence[str]:
        if pool is not None and getattr(pool, "tag", None) != kind:
            raise ValueError(f"this pool tokenizes {getattr(pool, 'tag', None)!r} texts, not {kind!r}; "
                             "use tokenizer_pool(kind)")
        prompt = self.prompts.get(kind, "")
        return [prompt + t for t in texts] if prompt else texts

    # ------------------------------------------------------------------ encode (device)
    def _encode_batch(self, tower: MaskedLMTower | StaticTower, batch: TokenBatch, head: bool = True) -> torch.Tensor:
        """One prepared batch -> [B, V] SPLADE weights through ``forward.encode_batch`` with this encoder's options
        (``head=False``: the transformed states, for profiling)."""
        return encode_batch(tower, batch, device=self.device, backend=self.backend, packed_head=self.packed,
                            packed_body=uses_packed_body(tower, self.varlen, self.device, self.dtype), head=head)

    def encode_prepared(self, prepared: PreparedTexts, ids: Sequence[str] | None = None, *, top_k: Any = _KEEP,
                        on_batch: Callable[[int], None] | None = None) -> SparseVectors:
        """Encode ``prepare``'s batches; returns SparseVectors on the CPU in the original text order.

        ``top_k``: keep each row's k largest weights (ties: lower term id); default: ``doc_top_k`` for
        documents, None for queries. ``on_batch(n_texts)`` is called after every batch (progress)."""
        return self.encode_prepared_async(prepared, ids, top_k=top_k, on_batch=on_batch).result()

    @torch.inference_mode()
    def encode_prepared_async(self, prepared: PreparedTexts, ids: Sequence[str] | None = None, *,
                              top_k: Any = _KEEP, on_batch: Callable[[int], None] | None = None) -> PendingVectors:
        """``encode_prepared`` that returns once the device work is queued: the vectors are then on their
        way to pinned host memory, and ``.result()`` (SparseVectors) or ``.wait()`` (pinned CSR arrays)
        waits for them, so the caller can queue the next window meanwhile. Batch i's non-zeros are
        read out after batch i+1's model is queued: the host never waits for an idle GPU."""
        tower = self._towers[prepared.kind]
        k = (self.doc_top_k if prepared.kind == "doc" else None) if top_k is _KEEP else top_k
        ids = [str(i) for i in range(prepared.n)] if ids is None else [str(i) for i in ids]
        if len(ids) != prepared.n:
            raise ValueError(f"got {len(ids)} ids for {prepared.n} texts")
        if len(set(ids)) != len(ids):
            raise ValueError("ids must be unique")
        if not prepared.batches:
            empty = torch.empty(0)
            return PendingVectors(torch.zeros(1, dtype=torch.int64), empty.to(torch.int32), empty, ids, self.vocab_size)
        lengths, indices, values, rows = [], [], [], []
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        counted: CountedRows | None = None
        for batch in prepared.batches:
            y = self._encode_batch(tower, batch)
            finite &= torch.isfinite(y).all()  # read with the result: no host sync per batch
            previous, counted = counted, CountedRows(y, k)
            if previous is not None:  # this batch's model is queued: the GPU stays busy while we wait
                for out, part in zip((lengths, indices, values), previous.csr()):
                    out.append(part)
            rows.append(batch.rows)
            if on_batch is not None:
                on_batch(len(batch.rows))
        for out, part in zip((lengths, indices, values), counted.csr()):
            out.append(part)
        cat = (torch.cat(parts) if len(parts) > 1 else parts[0] for parts in (lengths, indices, values, rows))
        return rows_to_input_order(*cat, ids, self.vocab_size, finite,
                                   f"the model produced NaN/Inf SPLADE weights in {self.dtype}; try dtype=torch.float32")

    def query_runner(self) -> QueryGraphs | None:
        """The bucketed query path (``lsr.encode.splade.query_graphs``; graphs per ``query_graphs``), None where the
        query tower does not run the padding-free body."""
        if not QueryGraphs.applies(self):
            return None
        if self.query_graphs not in self._query_runners:
            self._query_runners[self.query_graphs] = QueryGraphs(self, graphs=self.query_graphs)
        return self._query_runners[self.query_graphs]

    def _encode(self, texts: Sequence[str], ids: Sequence[str] | None, kind: str, batch_size: int | None,
                show_progress_bar: bool, convert_to_sparse_tensor: bool,
                device_output: bool = False) -> SparseVectors | torch.Tensor:
        runner = self.query_runner() if kind == "query" and len(texts) <= (batch_size or len(texts)) else None
        vectors = runner.encode(texts, ids, device_output=device_output) if runner is not None else None
        if vectors is not None:  # a short query batch: one bucket, replayed as a CUDA graph where it can be
            return sparse_output(vectors, convert_to_sparse_tensor)
        with tqdm(total=len(texts), unit="text", desc=f"encode {kind}", disable=not show_progress_bar) as bar:
            if len(texts) > self.window or windows_pool(self, kind, len(texts), None) is not None:
                # tokenized in worker processes, the next window while the model encodes this one
                vectors = encode_windows(self, texts, ids, kind, batch_size, on_batch=bar.update, window=self.window)
            else:
                vectors = self.encode_prepared(self.prepare(texts, kind, batch_size), ids, on_batch=bar.update)
            return sparse_output(vectors.to(self.device) if device_output else vectors, convert_to_sparse_tensor)

    def encode_document(self, texts: Sequence[str], ids: Sequence[str] | None = None, *,
                        batch_size: int | None = None, show_progress_bar: bool = False,
                        convert_to_sparse_tensor: bool = False) -> SparseVectors | torch.Tensor:
        """Document texts -> SparseVectors (CPU, input order), truncated to ``max_length_doc`` tokens,
        pruned to ``doc_top_k`` terms when set; ``convert_to_sparse_tensor``: a [n, V] torch sparse COO
        tensor instead (sentence-transformers' output)."""
        return self._encode(texts, ids, "doc", batch_size, show_progress_bar, convert_to_sparse_tensor)

    def encode_query(self, texts: Sequence[str], ids: Sequence[str] | None = None, *,
                     batch_size: int | None = None, show_progress_bar: bool = False,
                     convert_to_sparse_tensor: bool = False, device_output: bool = False) -> SparseVectors | torch.Tensor:
        """Query texts -> SparseVectors (CPU, input order), truncated to ``max_length_query`` tokens
        (``convert_to_sparse_tensor``: see ``encode_document``; ``device_output``: on the encoder's device).
        Up to 64 short texts run as one bucketed batch (``lsr.encode.splade.query_graphs``), a CUDA graph on CUDA."""
        return self._encode(texts, ids, "query", batch_size, show_progress_bar, convert_to_sparse_tensor,
                            device_output)

    def save_pretrained(self, folder: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write this encoder as a sentence-transformers SparseEncoder checkpoint that ``SparseEncoder(folder)``
        and ``SpladeEncoder.from_pretrained(folder)`` load (see ``lsr.encode.splade.st_save``); returns the folder."""
        from lsr.encode.splade.st_save import save_st_checkpoint

        return save_st_checkpoint(folder, self._towers["doc"], self._towers["query"], overwrite=overwrite,
                                  max_length_doc=self.max_length_doc, max_length_query=self.max_length_query,
                                  prompts=self.prompts)

    def decode(self, vectors: SparseVectors, top_k: int | None = None) -> list[list[tuple[str, float]]]:
        """Each row as [(token, weight)] by decreasing weight (ties: lower term id), at most ``top_k``."""
        return decode_rows(vectors, self.vocab, top_k)
