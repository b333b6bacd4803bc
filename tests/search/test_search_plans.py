"""The plan cache (lsr.search.plan): a search reuses the plan of an earlier one with the same index, batch size, k,
config and query-length bucket, keeps at most ``SearchConfig.caches.plans`` per index (lsr.search.index_cache), and
holds the index only weakly; and the work-items cache (lsr.search.work_items) keeps to its count and byte bounds."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from lsr.index.inverted import InvertedIndex
from lsr.search.config import SearchConfig
from lsr.search.gpu_search import gpu_search
from lsr.search.index_cache import index_cache
from lsr.search.plan import plan_search
from lsr.sparse import SparseVectors
from lsr.testing import random_dense_rows, seeded_generator
from tests.conftest import DEV


def queries_of(lengths: list[int], vocab: int) -> SparseVectors:
    """Queries with the given term counts (the block route on the Triton kernel plans for the longest)."""
    dense = torch.zeros(len(lengths), vocab)
    for row, n in enumerate(lengths):
        dense[row, :n] = 1.0
    return SparseVectors.from_dense(dense.to(DEV))


@pytest.mark.slow
def test_plans_are_reused_bounded_and_hold_the_index_weakly():
    gen = seeded_generator()
    docs = random_dense_rows(200, 50, 0.2, gen, device=DEV)
    q = random_dense_rows(4, 50, 0.3, gen, device=DEV)
    index = InvertedIndex.build(docs, device=DEV, block_size=64)
    cfg = SearchConfig(route="block", triton={"span": 64}, caches={"plans": 3})
    a = plan_search(index, queries_of([16, 3, 3, 3], 50), 10, cfg).block
    b = plan_search(index, queries_of([40, 3, 3, 3], 50), 10, cfg).block   # another length, the same bucket (64)
    assert a is b and a.index.n_docs == index.n_docs, "the cached plan"
    assert plan_search(index, queries_of([16, 3, 3, 3], 50), 11, cfg).k == 11, "another k: another plan"
    for B in (1, 2, 3):
        plan_search(index, queries_of([16] * B, 50), 10, cfg)
    assert [key[:2] for key in index_cache(index).plan_keys()] == [(1, 10), (2, 10), (3, 10)], \
        "at most caches.plans plans, the least recently used went first"
    cached = [gpu_search(index, q, 5, cfg) for _ in range(2)]
    fresh = gpu_search(index, q, 5, cfg.replace(caches={"plans": 0}))
    assert index_cache(index).plan_keys() == [], "caches.plans=0 keeps none"
    assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(fresh, *cached))
    ref = weakref.ref(index)
    del index, a, b
    gc.collect()
    assert ref() is None, "the cache keeps no index alive"


def test_work_items_cache_is_bounded_by_count_and_bytes():
    from lsr.search import work_items

    cache = work_items.ItemsCache()
    dev = torch.device(DEV)

    def get(B: int) -> tuple[torch.Tensor, ...]:
        return cache.get((B, 10, 10, 1, 8, dev), 2, max_bytes=16 * 40)

    a = get(4)                                            # 40 items of 16 B: kept
    assert get(4) is a
    assert torch.equal(a[0], work_items.make_span_items(4, 10, 10, 1, 8, dev)[0])
    big = get(8)                                          # 80 items: over the byte bound, made but not kept
    assert get(8) is not big and len(cache.entries) == 1
    get(2)
    get(1)
    assert list(cache.entries) == [(2, 10, 10, 1, 8, dev), (1, 10, 10, 1, 8, dev)], "the least recently used went"
