"""ShardedSearcher: exact top-k over a ``ShardedIndex`` on one device, partition after partition.

Every partition is searched with a ``Searcher`` (same backend, same scores per doc: the partitions carry
the collection-wide ``max_scores``), its hits shifted to global doc indices and merged into the running
top-k with ``exact_topk``'s total order (score descending, doc index ascending). The global top-k is
contained in the union of the partitions' top-k lists, so the result equals the unsharded search bit
for bit.

Two modes:

* resident: every partition lives on the device (an index that fits; the same speed as one index,
  plus one merge per partition).
* streamed: partitions stay in host memory (pinned on CUDA) and go to the device one at a time, the
  next one copied on a side stream while the current one is searched. All queries of a ``search`` call
  are run against a partition before the next one comes, so the index crosses the bus once per call:
  an index larger than the device memory is searched exactly, at PCIe speed per call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lsr.index.build import POSTING_TENSORS
from lsr.index.inverted import InvertedIndex
from lsr.index.sharded import ShardedIndex
from lsr.search.config import SearchConfig
from lsr.search.filtered import per_query_filters
from lsr.search.filters import DocFilter, as_filter
from lsr.search.searcher import Searcher, check_request, exact_topk
from lsr.sparse import SparseVectors
from lsr.utils.devices import torch_device

__all__ = ["ShardedSearcher", "merge_hit_lists", "shift_ids"]


def slice_filters(masks: Any, offset: int, n_docs: int) -> Any:
    """A partition's filter(s): its documents' slice of a global mask, or of each per-query one."""
    if isinstance(masks, np.ndarray):
        return DocFilter.mask(masks[offset:offset + n_docs])
    return [None if m is None else DocFilter.mask(m[offset:offset + n_docs]) for m in masks]


def shift_ids(doc_idx: torch.Tensor, offset: int) -> torch.Tensor:
    """Local doc indices -> global ones (padding -1 stays -1)."""
    return torch.where(doc_idx >= 0, doc_idx + offset, doc_idx)


_KEY_ID_LIMIT = 1 << 32   # doc indices below this fit the low half of a merge key


def merge_hit_lists(parts: list[tuple[torch.Tensor, torch.Tensor]], k: int,
                    n_docs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact merge of [B, k_i] (scores, global doc idx) lists of partitions or ranks: top-k by (score desc,
    doc idx asc), ``exact_topk``'s order; padding (score <= 0 or doc -1) dropped. With ``n_docs`` (the
    collection's size, which bounds every doc index) below 2^32, one sort of 64-bit keys per row without a
    host sync (``_merge_by_keys``); otherwise ``exact_topk``."""
    if len(parts) == 1 and parts[0][0].shape[1] == k:
        return parts[0]
    scores, ids = torch.cat([s for s, _ in parts], 1), torch.cat([i for _, i in parts], 1)
    if n_docs is not None and n_docs <= _KEY_ID_LIMIT:
        return _merge_by_keys(scores, ids, k)
    return exact_topk(scores, k, ids)


def _merge_by_keys(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``exact_topk``'s result for doc indices below 2^32. A hit's key holds (0x7FFFFFFF minus the score's bit
    pattern) in its high half (positive float32 scores order as their bit patterns, so a smaller key is a higher
    score) and the doc index in its low half (ties: the lower index first); padding gets the largest high half.
    Sorting the keys of each row is then the exact order, on the device, with no host sync (exact_topk's nonzero
    needs one), which is most of a small batch's merge time."""
    B, n = scores.shape
    real = (scores > 0) & (ids >= 0)
    bits = scores.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    high = torch.where(real, 0x7FFFFFFF - bits, 0x7FFFFFFF)
    keys = torch.sort((high << 32) | torch.where(real, ids, 0), dim=1).values[:, :k]
    high = keys >> 32
    hit = high < 0x7FFFFFFF
    out_s = torch.where(hit, (0x7FFFFFFF - high).to(torch.int32).view(torch.float32), 0.0)
    out_i = torch.where(hit, keys & 0xFFFFFFFF, -1)
    if n < k:  # fewer candidates than k: padding columns
        out_s = torch.cat([out_s, out_s.new_zeros(B, k - n)], 1)
        out_i = torch.cat([out_i, out_i.new_full((B, k - n), -1)], 1)
    return out_s, out_i


def _to_device(index: InvertedIndex, device: torch.device, non_blocking: bool) -> InvertedIndex:
    """Copy of ``index`` on ``device`` (asynchronous from pinned host memory)."""
    moved = {f: getattr(index, f).to(device, non_blocking=non_blocking) for f in POSTING_TENSORS}
    d = index.docs
    docs = SparseVectors(d.indptr.to(device, non_blocking=non_blocking), d.indices.to(device, non_blocking=non_blocking),
                         d.values.to(device, non_blocking=non_blocking), d.ids, d.vocab_size, validate=False)
    return InvertedIndex(**moved, docs=docs, vocab_size=index.vocab_size, n_docs=index.n_docs,
                         block_size=index.block_size, n_blocks=index.n_blocks, metadata=index.metadata)


def _pinned(index: InvertedIndex) -> InvertedIndex:
    moved = {f: getattr(index, f).pin_memory() for f in POSTING_TENSORS}
    d = index.docs
    docs = SparseVectors(d.indptr.pin_memory(), d.indices.pin_memory(), d.values.pin_memory(), d.ids, d.vocab_size,
                         validate=False)
    return InvertedIndex(**moved, docs=docs, vocab_size=index.vocab_size, n_docs=index.n_docs,
                         block_size=index.block_size, n_blocks=index.n_blocks, metadata=index.metadata)


class ShardedSearcher:
    """Exact top-k over the loaded partitions of a ShardedIndex on one device (``Searcher``'s API).

    Args:
        index: the sharded index; partitions that are not loaded are skipped (a rank of a distributed
            search holds only its own).
        device: where to search, as ``Searcher`` (default: the first loaded partition's device).
        backend: as ``Searcher``.
        max_memory_bytes: as ``Searcher`` (per partition).
        config: as ``Searcher`` (every partition's search).
        metadata: the metadata columns of every document (global order), what filter expressions read.
        stream: keep partitions in host memory and copy each to the device when it is searched
            (default: on CUDA when the loaded partitions exceed half the free device memory).
    """

    def __init__(self, index: ShardedIndex, device: str | torch.device | None = None, backend: str | None = None,
                 max_memory_bytes: int | None = None, stream: bool | None = None, *,
                 config: SearchConfig | None = None, metadata: Any = None) -> None:
        device = torch_device(device) if device is not None else None  # a bad name fails before any work
        loaded = [(p, part) for p, part in enumerate(index.partitions) if part is not None]
        if not loaded:
            raise ValueError("the sharded index has no loaded partition to search")
        self.index = index
        self.device = device if device is not None else loaded[0][1].device
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if stream is None:
            stream = self.device.type == "cuda" and index.memory_bytes() > torch.cuda.mem_get_info(self.device)[0] // 2
        self.stream = bool(stream) and self.device.type == "cuda"
        self.config = config or SearchConfig()
        self.metadata = metadata   # global rows, document order (``DocFilter.where``)
        self._backend_args = {"backend": backend, "max_memory_bytes": max_memory_bytes, "config": config}
        self._parts: list[tuple[int, InvertedIndex]] = []
        for p, part in loaded:
            if self.stream:
                part = _pinned(part.to("cpu"))
            elif part.device != self.device:
                part = part.to(self.device)
            self._parts.append((index.doc_starts[p], part))
        # the backend a partition's Searcher resolves to on the device (a streamed one is still on the host)
        probe = self._parts[0][1]
        if self.stream:
            empty = SparseVectors(torch.zeros(1, dtype=torch.int64), [], [], [], index.vocab_size, device=self.device)
            probe = InvertedIndex.build(empty)
        self.backend = self._searcher(probe).backend

    def _searcher(self, part: InvertedIndex) -> Searcher:
        return Searcher(part, device=self.device, **self._backend_args)

    def search(self, queries: SparseVectors, k: int | None = None, query_batch: int | None = None,
               query_metadata: Mapping[str, Any] | None = None, show_progress_bar: bool | None = None,
               filter: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k documents of every query over the loaded partitions (see ``Searcher.search``; ``k`` None: the
        config's ``k``); doc indices are global. ``filter`` as in ``Searcher.search``, over the global document
        indices (every partition loaded); each partition searches its slice of it."""
        k = check_request(queries, self.config.k if k is None else k, query_metadata, self.index)
        queries = queries.to(self.device)
        masks = self._filter_masks(filter, len(queries))
        best: tuple[torch.Tensor, torch.Tensor] | None = None
        for offset, part in self._device_parts():
            part_filter = None if masks is None else slice_filters(masks, offset, part.n_docs)
            s, i = self._searcher(part).search(queries, k, query_batch, show_progress_bar=show_progress_bar,
                                               filter=part_filter)
            top = (s, shift_ids(i, offset))
            best = top if best is None else merge_hit_lists([best, top], k, self.index.n_docs)
            del part
        assert best is not None
        return best

    def _filter_masks(self, value: Any, n_queries: int) -> Any:
        """The global masks of a filter (one, or one per query with None where unfiltered), or None."""
        if value is None:
            return None
        if len(self._parts) != self.index.n_partitions:
            raise ValueError("a filtered search of a sharded index needs every partition loaded (a mask is over "
                             "the global document indices)")
        docnos = pa.array([d for _, part in self._parts for d in part.docnos], type=pa.large_string())
        per_query = per_query_filters(value, n_queries)
        if per_query is None:
            return as_filter(value).resolve(docnos, self.metadata)
        resolved: dict[int, np.ndarray] = {}
        for v in per_query:
            if v is not None and id(v) not in resolved:
                resolved[id(v)] = as_filter(v).resolve(docnos, self.metadata)
        return [None if v is None else resolved[id(v)] for v in per_query]

    def _device_parts(self):
        """(doc offset, partition on the device); streamed: the next copy overlaps the current search."""
        if not self.stream:
            yield from self._parts
            return
        copy_stream = torch.cuda.Stream(self.device)
        compute = torch.cuda.current_stream(self.device)

        def start(j: int) -> InvertedIndex:
            with torch.cuda.stream(copy_stream):
                return _to_device(self._parts[j][1], self.device, non_blocking=True)

        nxt = start(0)
        for j in range(len(self._parts)):
            cur = nxt
            compute.wait_stream(copy_stream)
            for t in [getattr(cur, f) for f in POSTING_TENSORS] + [cur.docs.indptr, cur.docs.indices, cur.docs.values]:
                t.record_stream(compute)  # freed only once the search that reads it is done
            nxt = start(j + 1) if j + 1 < len(self._parts) else None
            yield self._parts[j][0], cur
            del cur

    def search_run(self, queries: SparseVectors, k: int | None = None, query_batch: int | None = None,
                   query_metadata: Mapping[str, Any] | None = None, show_progress_bar: bool | None = None,
                   filter: Any = None) -> dict[str, dict[str, float]]:
        """Search and return a run: {qid: {docno: score}} with hits ordered best first."""
        from lsr.data.runs import from_topk

        scores, doc_idx = self.search(queries, k, query_batch, query_metadata, show_progress_bar, filter)
        return from_topk(queries.ids, self.index.docnos, scores.cpu(), doc_idx.cpu())
