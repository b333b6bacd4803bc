"""The dev evaluation during training: the dev corpus (judged documents + ``schedule.eval_max_docs``
others) and queries encoded with the current weights, searched exactly with lsr's own index, scored."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from lsr.train.config import TrainConfig

__all__ = ["evaluate_encoder", "load_dev_data"]


def load_dev_data(cfg: TrainConfig) -> dict[str, Any]:
    """{"docs": {docid: text}, "qids", "queries" (texts), "qrels"} of ``cfg.eval_data``."""
    from lsr.data.sources import load_dataset

    max_others = cfg.schedule.eval_max_docs
    ds = load_dataset(cfg.eval_data.dataset, cfg.eval_data.split)
    judged = {d for j in ds.qrels.values() for d in j}
    docs, others = {}, 0
    for docid, text in ds.docs_iter():
        if docid in judged or max_others is None or others < max_others:
            others += docid not in judged
            docs[docid] = text
    qids = [q for q in ds.queries if q in ds.qrels]
    return {"docs": docs, "qids": qids, "queries": [ds.queries[q] for q in qids], "qrels": ds.qrels}


@torch.no_grad()
def evaluate_encoder(enc: Any, dev: dict[str, Any], metrics: Sequence[str], device: torch.device,
                     autocast: Callable[[], AbstractContextManager] = nullcontext) -> dict[str, float]:
    """``metrics`` of ``enc`` (a ``SpladeEncoder``) on ``dev`` (``load_dev_data``), top 1000 searched exactly;
    ``autocast()`` is entered around the encoding only (the search stays exact)."""
    from lsr.evaluation.topk import evaluate_topk
    from lsr.index.inverted import InvertedIndex
    from lsr.search.searcher import Searcher

    with autocast():
        docs = enc.encode_document(list(dev["docs"].values()), ids=list(dev["docs"]))
        queries = enc.encode_query(dev["queries"], ids=dev["qids"])
    index = InvertedIndex.build(docs, device=device, metadata=enc.describe())
    k = min(1000, len(docs))
    scores, idx = Searcher(index, device=device).search(queries.to(device), k=k, query_metadata=enc.describe())
    return evaluate_topk(dev["qids"], idx.cpu(), index.docnos, dev["qrels"], metrics, scores=scores.cpu())
