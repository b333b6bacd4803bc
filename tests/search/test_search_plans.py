"""The block path's plan cache (lsr.search.block_path._make_plan): a search reuses the plan of an earlier one with
the same index, batch size, k, config and query-length bucket, keeps at most PLAN_CACHE per index, and holds
the index only weakly (tests/conftest.py turns the cache off for the other tests); and the work-items cache
(lsr.search.work_items) keeps to its count and byte bounds."""

from __future__ import annotations

import gc
import weakref

import torch

import lsr.search.block_path as bp
from lsr.index.inverted import InvertedIndex
from lsr.search.triton_backend import BlockConfig, triton_search
from lsr.testing import random_dense_rows, seeded_generator
from tests.conftest import DEV


def test_plans_are_reused_bounded_and_hold_the_index_weakly(monkeypatch):
    monkeypatch.setattr(bp, "PLAN_CACHE", 3)
    gen = seeded_generator()
    docs = random_dense_rows(200, 50, 0.2, gen, device=DEV)
    q = random_dense_rows(4, 50, 0.3, gen, device=DEV)
    index = InvertedIndex.build(docs, device=DEV, block_size=64)
    cfg = BlockConfig(span=64)
    a = bp._make_plan(index, 4, 10, cfg, 16)
    b = bp._make_plan(index, 4, 10, cfg, 40)   # another length, the same bucket (64 terms)
    assert a.scorer is b.scorer and a.index is index, "the cached parts (a new scorer partial otherwise)"
    assert bp._make_plan(index, 4, 11, cfg, 16).k == 11, "another k: another plan"
    for B in (1, 2, 3):
        bp._make_plan(index, B, 10, cfg, 16)
    assert len(bp._PLANS[index]) == 3
    assert (4, 10, cfg, 64) not in bp._PLANS[index], "the least recently used plans went first"
    cached = [triton_search(index, q, 5, path="block", config=cfg) for _ in range(2)]
    monkeypatch.setattr(bp, "PLAN_CACHE", 0)
    fresh = triton_search(index, q, 5, path="block", config=cfg)
    assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(fresh, *cached))
    ref = weakref.ref(index)
    del index, a, b
    gc.collect()
    assert ref() is None, "the cache keeps no index alive"


def test_work_items_cache_is_bounded_by_count_and_bytes():
    from lsr.search import work_items

    cache = work_items.ItemsCache(2, max_bytes=16 * 40)
    dev = torch.device(DEV)
    a = cache(4, 10, 10, 1, 8, dev)                      # 40 items of 16 B: kept
    assert cache(4, 10, 10, 1, 8, dev) is a
    assert torch.equal(a[0], work_items.make_span_items(4, 10, 10, 1, 8, dev)[0])
    big = cache(8, 10, 10, 1, 8, dev)                    # 80 items: over the byte bound, made but not kept
    assert cache(8, 10, 10, 1, 8, dev) is not big and len(cache.entries) == 1
    cache(2, 10, 10, 1, 8, dev)
    cache(1, 10, 10, 1, 8, dev)
    assert list(cache.entries) == [(2, 10, 10, 1, 8, dev), (1, 10, 10, 1, 8, dev)], "the least recently used went"
