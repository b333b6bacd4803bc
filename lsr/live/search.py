"""``LiveSearcher``: exact search of a live index (``lsr.live.index``): the base with its deleted documents
filtered out, the delta segment of added documents beside it, the two merged exactly.

The hits are *slots* (the base's document indices, then the added documents'), which keep insertion order, so
the merge's ties (by slot) are an index rebuilt from ``LiveIndex.documents()``'s ties (by its document index):
the same documents, in the same order. The torch backend scores a document from its own terms alone, so the
scores are that rebuild's bits; the gpu backend's fixed-point scale comes from each segment's per-term maxima,
which changes a score's last bit only where it lies within one float64 rounding of a float32 rounding boundary
(``lsr.search.filtered`` says the same of filters).

Each search reads one consistent snapshot (taken under the index's lock): an update is visible to the next
search that starts after it returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lsr.live.index import LiveIndex, SlotDocnos
from lsr.search.config import SearchConfig
from lsr.search.filters import DocFilter, as_filter
from lsr.search.searcher import Searcher, check_request, run_depth
from lsr.search.sharded import merge_hit_lists, shift_ids
from lsr.sparse import SparseVectors

__all__ = ["LiveSearcher", "live_slot_mask"]


def live_slot_mask(flt: DocFilter, slot_docnos: Sequence[str], alive: np.ndarray) -> np.ndarray:
    """A docno filter's mask over the slots, resolved against the live documents only: a deleted document's slot,
    and a replaced one's old slot, name no document (a list naming a deleted one is refused as a rebuild would)."""
    import pyarrow as pa

    return flt.resolve(pa.array([d if a else None for d, a in zip(slot_docnos, alive, strict=True)],
                                type=pa.large_string()))


class LiveSearcher:
    """Searches a ``LiveIndex`` as ``Searcher`` searches an index (``search``, ``search_run``); doc indices are
    slots (``slot_docnos()`` maps them)."""

    def __init__(self, live: LiveIndex, device: str | torch.device | None = None, *,
                 config: SearchConfig | None = None) -> None:
        self.live, self.config = live, config or SearchConfig()
        self.device = torch.device(device) if device is not None else live.base.device
        self._base, self._base_of = Searcher(live.base, self.device, config=self.config), live.base

    def _snapshot(self) -> tuple[Any, np.ndarray, Any, np.ndarray, SlotDocnos]:
        live = self.live
        with live._mutex:
            if self._base_of is not live.base:   # a compaction: the new base
                self._base, self._base_of = Searcher(live.base, self.device, config=self.config), live.base
            return (self._base, live.base_alive.copy(), live.delta_segments(), live.delta_alive.copy(),
                    live.slot_docnos())

    def search(self, queries: SparseVectors, k: int | None = None, filter: Any = None,
               query_metadata: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k live documents of every query (among those ``filter`` allows: docno lists or a mask over slots;
        metadata expressions are not offered on a live index yet): (scores, slots). ``query_metadata``: the
        queries' encoder description, checked against the index's."""
        k = check_request(queries, self.config.k if k is None else k, query_metadata, self.live.base)
        return self._search(queries, k, filter)[:2]

    def _search(self, queries: SparseVectors, k: int, filter: Any) -> tuple[torch.Tensor, torch.Tensor, SlotDocnos]:
        """(scores, slots, the snapshot's docno of every slot)."""
        base, base_alive, delta, delta_alive, docnos = self._snapshot()
        allowed_base, allowed_delta = base_alive, delta_alive
        if filter is not None:
            flt = as_filter(filter)
            if flt.reads_metadata():
                raise ValueError("a live index has no metadata columns for its added documents: filter it by docnos")
            mask = live_slot_mask(flt, docnos, np.concatenate([base_alive, delta_alive]))
            allowed_base, allowed_delta = base_alive & mask[:len(base_alive)], delta_alive & mask[len(base_alive):]
        queries = queries.to(self.device)
        n_base = len(base_alive)
        parts = [base.search(queries, k, filter=None if allowed_base.all() else DocFilter.mask(allowed_base))]
        for first, segment in delta:   # each part of the delta with its live documents
            allowed = allowed_delta[first - n_base:first - n_base + segment.n_docs]
            if allowed.any():
                s, i = Searcher(segment, self.device, config=self.config).search(
                    queries, k, filter=None if allowed.all() else DocFilter.mask(allowed))
                parts.append((s, shift_ids(i, first)))
        return (*merge_hit_lists(parts, k, n_base + len(delta_alive)), docnos)

    def search_run(self, queries: SparseVectors, k: int | None = None, filter: Any = None,
                   query_metadata: Any = None) -> dict[str, dict[str, float]]:
        """A run {qid: {docno: score}}, best first, at most the live documents deep."""
        from lsr.data.runs import from_topk

        k = check_request(queries, self.config.k if k is None else k, query_metadata, self.live.base)
        k = run_depth(k, max(self.live.n_docs, 1))
        scores, slots, docnos = self._search(queries, k, filter)
        return from_topk(queries.ids, docnos, scores.cpu(), slots.cpu())
