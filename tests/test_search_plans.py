"""The block path's plan cache (lsr.search.block_path._make_plan): a search reuses the plan of an earlier one with
the same index, batch size, k, config and query-length bucket, keeps at most PLAN_CACHE per index, and holds
the index only weakly. (tests/conftest.py turns the cache off for the other tests.)"""

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
    b = bp._make_plan(index, 4, 10, cfg, 16)
    assert a.span_off is b.span_off and a.scorer is b.scorer and a.index is index
    assert bp._make_plan(index, 4, 11, cfg, 16).k == 11, "another k: another plan"
    for B in (1, 2, 3):
        bp._make_plan(index, B, 10, cfg, 16)
    assert len(bp._PLANS[index]) == 3
    assert (4, 10, cfg, 16) not in bp._PLANS[index], "the oldest plans went first"
    want = triton_search(index, q, 5, path="block", config=cfg)
    assert all(torch.equal(x, y) for x, y in zip(want, triton_search(index, q, 5, path="block", config=cfg)))
    ref = weakref.ref(index)
    del index, a, b
    gc.collect()
    assert ref() is None, "the cache keeps no index alive"
