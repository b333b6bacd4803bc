"""Rerank the top-k of a run with a late-interaction model: encode queries, fetch (or encode and cache) the
candidates' token embeddings, score every (query, candidate) with the fused MaxSim kernel.

Scores are computed from the cached float16 document embeddings, so a run reranked from a warm cache is
identical to one that encoded its documents afresh.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lsr.rerank.cache import DocEmbeddingCache

__all__ = ["candidates_of", "encode_missing", "rerank_run", "rerank_stage"]

log = logging.getLogger("lsr")


def candidates_of(run: Mapping[str, Mapping[str, float]], k: int) -> dict[str, list[str]]:
    """Each query's k best documents (by score, ties in the run's order)."""
    out = {}
    for qid, docs in run.items():
        ranked = sorted(enumerate(docs.items()), key=lambda t: (-t[1][1], t[0]))
        out[qid] = [docno for _, (docno, _) in ranked[:k]]
    return out


def encode_missing(needed: Iterable[str], docs_iter: Callable[[], Iterable[tuple[str, str]]], encoder: Any,
                   cache: DocEmbeddingCache, batch_size: int = 32, part_docs: int = 20_000) -> int:
    """Encode the documents of ``needed`` that ``cache`` lacks (texts streamed from ``docs_iter``) and add
    them to it, one cache part per ``part_docs`` documents; returns how many were encoded."""
    missing = {d for d in needed if d not in cache}
    if not missing:
        return 0
    texts: dict[str, str] = {}
    for doc_id, text in docs_iter():
        if doc_id in missing:
            texts[doc_id] = text
    absent = missing - texts.keys()
    if absent:
        raise ValueError(f"{len(absent)} document(s) of the run are not in the dataset (e.g. {sorted(absent)[0]!r}): "
                         "rerank a run made from the same collection")
    order = sorted(texts, key=lambda d: len(texts[d]))  # similar lengths per batch: little padding
    for p0 in range(0, len(order), part_docs):
        ids = order[p0:p0 + part_docs]
        embs: list[torch.Tensor] = []
        for b0 in range(0, len(ids), batch_size):
            embs += encoder.encode_documents([texts[d] for d in ids[b0:b0 + batch_size]])
        cache.add(ids, embs)
        log.info("encoded %d / %d documents", min(p0 + part_docs, len(order)), len(order))
    return len(order)


def _padded(embs: Sequence[torch.Tensor], dim: int, dtype: torch.dtype, device: str | torch.device):
    """[U, Lmax, dim] on device and int lengths [U]."""
    if not embs:
        return torch.zeros(0, 1, dim, dtype=dtype, device=device), torch.zeros(0, dtype=torch.int64, device=device)
    lengths = torch.tensor([e.shape[0] for e in embs], dtype=torch.int64)
    out = torch.nn.utils.rnn.pad_sequence([e.reshape(-1, dim) for e in embs], batch_first=True)
    return out.to(device=device, dtype=dtype), lengths.to(device)


def rerank_run(run: Mapping[str, Mapping[str, float]], queries: Mapping[str, str],
               docs_iter: Callable[[], Iterable[tuple[str, str]]], encoder: Any, cache: DocEmbeddingCache,
               k: int = 100, query_batch: int = 64, doc_batch: int = 32, maxsim: str = "auto") -> dict[str, dict[str, float]]:
    """The reranked run: for each query of ``run``, its top-k documents ordered by MaxSim score. ``maxsim``:
    the MaxSim kernel's implementation ("auto": Triton on CUDA, "triton", "torch")."""
    from lsr.rerank.kernels import maxsim as kernels

    absent = [q for q in run if q not in queries]
    if absent:
        raise ValueError(f"{len(absent)} query id(s) of the run are not in the dataset (e.g. {absent[0]!r}): "
                         "pass the dataset (and --split) the run was made from")
    cands = candidates_of(run, k)
    encode_missing({d for ds in cands.values() for d in ds}, docs_iter, encoder, cache, doc_batch)
    device = encoder.device
    dtype = torch.float16 if device.type == "cuda" else torch.float32  # the cache's fp16, or fp32 on the CPU
    qids = list(cands)
    out: dict[str, dict[str, float]] = {}
    for b0 in range(0, len(qids), query_batch):
        batch = qids[b0:b0 + query_batch]
        q, q_mask = encoder.encode_queries([queries[x] for x in batch])
        docs = sorted({d for x in batch for d in cands[x]})
        slot = {d: i for i, d in enumerate(docs)}
        width = max(1, max(len(cands[x]) for x in batch))
        cand = torch.full((len(batch), width), -1, dtype=torch.int64)
        for i, x in enumerate(batch):
            cand[i, : len(cands[x])] = torch.tensor([slot[d] for d in cands[x]], dtype=torch.int64)
        d, d_len = _padded(cache.get(docs), encoder.dim, dtype, device)
        with torch.no_grad():
            scores = kernels.maxsim(q.to(dtype), d, q_mask, d_len, cand.to(device), backend=maxsim).cpu()
        for i, x in enumerate(batch):
            n = len(cands[x])
            order = sorted(range(n), key=lambda j: (-float(scores[i, j]), j))  # ties keep the first stage's order
            out[x] = {cands[x][j]: float(scores[i, j]) for j in order}
    return out


def rerank_stage(cfg: Any, first: Mapping[str, Mapping[str, float]], dataset: Any, device: str, out: Path,
                 metrics: Sequence[str]) -> dict[str, float]:
    """The ``rerank:`` stage of ``lsr run``: rerank ``first`` (a run), write ``out/rerank.trec``, return its
    metrics. ``cfg`` is a ``lsr.config.RerankConfig``."""
    from lsr.data import runs
    from lsr.evaluation.measures import evaluate
    from lsr.rerank.encoder import ColbertEncoder

    encoder = ColbertEncoder(cfg.model, device=device, dtype=cfg.dtype)
    cache = DocEmbeddingCache(cfg.cache or out / "doc-embeddings", encoder.fingerprint)
    reranked = rerank_run(first, dataset.queries, dataset.docs_iter, encoder, cache, k=cfg.k,
                          query_batch=cfg.query_batch, doc_batch=cfg.batch_size, maxsim=cfg.maxsim)
    runs.write_trec(reranked, out / "rerank.trec", tag="lsr-rerank")
    return evaluate(reranked, dataset.qrels, metrics=tuple(metrics))
