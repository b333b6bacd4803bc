"""CUDA graphs of the block route (lsr.search.graphs): replayed graphs give the eager path's bits (``gpu`` tests), and
the per-index graph cache keeps to its count and byte bounds, captures a large batch's shape once, and holds under
threads (captures faked by handing ``GraphCache`` a stand-in: the bookkeeping is what is tested)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lsr.index.inverted import InvertedIndex
from lsr.search.config import SearchConfig
from lsr.search.gpu_search import gpu_search
from lsr.search.index_cache import index_cache
from lsr.sparse import SparseVectors
from lsr.testing import assert_exact_topk, float64_scores

BLOCK = SearchConfig(route="block")
EAGER = BLOCK.replace(graphs={"enabled": False})


def build_index(docs: SparseVectors, block_size: int) -> InvertedIndex:
    return InvertedIndex.build(docs, device="cuda", block_size=block_size, postings="float32")


def fake_capture(made: list | None = None):
    """A stand-in for ``ChunkGraph``: records the batch size and reports B bytes."""
    def capture(body, B, n_terms, device, **_):
        if made is not None:
            made.append(B)
        return SimpleNamespace(bytes=B)
    return capture


@pytest.mark.gpu
def test_gpu_block_graphs_match_eager():
    """Batches up to graphs.max_batch replay a captured CUDA graph: same bits as the eager path, with the
    graph's buffers reused by queries of other lengths, and with overflowed spans rescored."""
    from lsr.benchmarks.synth import synth_docs, synth_queries
    docs = synth_docs(40_000, device="cuda")
    index = build_index(docs, 2048)
    queries = synth_queries(24, device="cuda")
    eager = EAGER
    for B, k in ((1, 10), (1, 10), (5, 100), (3, 1000)):
        for start in (0, 7):
            q = queries[start:start + B]
            got = gpu_search(index, q, k, BLOCK)
            want = gpu_search(index, q, k, eager)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            assert_exact_topk(*got, float64_scores(q, docs), k)
    # one long query among short ones: the graph's term buffer is sized by the mean length (terms_bound)
    long_row = torch.zeros(4, docs.vocab_size, device="cuda")
    long_row[0, torch.randperm(docs.vocab_size, device="cuda")[:400]] = 0.5
    long_row[1:, :3] = 1.0
    skewed = SparseVectors.from_dense(long_row)
    got = gpu_search(index, skewed, 50, BLOCK)
    want = gpu_search(index, skewed, 50, eager)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert_exact_topk(*got, float64_scores(skewed, docs), 50)
    # a batch split into one-query chunks: the long query's chunk holds more terms than its share of the mean
    # bound, so it runs eagerly instead of overrunning a graph's term buffer
    got = gpu_search(index, skewed, 50, BLOCK.replace(pass2={"candidate_budget": 1}))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    held = index_cache(index).graphs.graphs
    assert held and all(g is not None for g in held.values()), "captured, not eager"
    alone = [gpu_search(index, queries[i:i + 1], 50, BLOCK) for i in range(4)]
    batch = gpu_search(index, queries[:4], 50, BLOCK)
    assert torch.equal(torch.cat([a[0] for a in alone]), batch[0]) and torch.equal(torch.cat([a[1] for a in alone]), batch[1])
    q = queries[:2]   # 8 slots a span: most spans overflow, and the host-side fix runs
    got = gpu_search(index, q, 200, BLOCK.replace(pass2={"slots_per_span": 8}))
    want = gpu_search(index, q, 200, EAGER.replace(pass2={"slots_per_span": 8}))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert_exact_topk(*got, float64_scores(q, docs), 200)


@pytest.mark.gpu
def test_gpu_graphs_capture_on_every_gpu_of_one_process():
    """Graphs captured on cuda:0 and then on cuda:1 in one process (serving replicas are threads of one
    process): each GPU's replay equals its eager path. torch.cuda.graph's default capture stream belongs to
    the device of the process's first capture, so captures on another GPU must bring their own stream."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from lsr.benchmarks.synth import synth_docs, synth_queries
    docs = synth_docs(40_000, device="cuda:0")
    queries = synth_queries(8, device="cuda:0")
    for dev in ("cuda:0", "cuda:1"):
        index = InvertedIndex.build(docs.to(dev), device=dev, block_size=2048, postings="float32")
        with torch.cuda.device(dev):
            for B in (1, 4):
                got = gpu_search(index, queries[:B].to(dev), 100, BLOCK)
                want = gpu_search(index, queries[:B].to(dev), 100, EAGER)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (dev, B)
                assert_exact_topk(*(t.cpu() for t in got), float64_scores(queries[:B].to("cpu"), docs.to("cpu")), 100)


@pytest.mark.gpu
def test_gpu_block_graphs_share_one_pool():
    """With graph_shared_pool the graphs of an index share one memory pool and one lock: graphs of five batch
    sizes replayed in a shuffled order give the eager path's bits, and hold less memory than private pools."""
    import random

    from lsr.benchmarks.synth import synth_docs, synth_queries
    docs = synth_docs(200_000, device="cuda")
    queries = synth_queries(400, device="cuda")
    eager = EAGER
    # large batches, whose temporaries (candidate slots) dominate what a graph keeps: at B <= 64 on a small index
    # the graphs keep little else than their outputs, and five private pools hold what one shared pool holds
    sizes = (64, 128, 192, 256, 384)
    held = {}

    def pool_bytes(graphs) -> int:   # the segments of the pools these graphs were captured into
        pools = {tuple(g.graph.pool()) for g in graphs.graphs.values()}
        segments = torch.cuda.memory_snapshot()
        assert all("segment_pool_id" in seg for seg in segments)
        return sum(seg["total_size"] for seg in segments if tuple(seg["segment_pool_id"]) in pools)

    for shared in (False, True):
        graphed = BLOCK.replace(graphs={"shared_pool": shared, "bytes": 1 << 40})   # (none dropped)
        index = build_index(docs, 2048)
        for B in sizes:   # kernels compiled and tuned before any capture
            gpu_search(index, queries[:B], 1000, eager)
        for B in sizes:   # batches above graphs.capture_at_once are captured at their second search
            gpu_search(index, queries[:B], 1000, graphed)
            gpu_search(index, queries[:B], 1000, graphed)
        graphs = index_cache(index).graphs
        assert all(g is not None for g in graphs.graphs.values()) and len(graphs.graphs) == len(sizes)
        held[shared] = pool_bytes(graphs)
        assert (graphs.pool is not None) == shared
        assert all((g.lock is graphs.lock) == shared for g in graphs.graphs.values())
        order = [B for B in sizes for _ in range(3)]
        random.Random(7).shuffle(order)
        for i, B in enumerate(order):
            q = queries[i % 16:i % 16 + B]
            got = gpu_search(index, q, 1000, graphed)
            want = gpu_search(index, q, 1000, eager)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        del index, graphs
    assert 0 < held[True] < held[False], f"one pool should hold less than five: {held}"


def test_trim_graphs_keeps_count_and_bytes_within_bounds():
    """The graph cache drops its least recently used entries beyond graphs.cache graphs or graphs.bytes of kept
    memory; failed captures (None) count no bytes, and the newest graph stays even when it alone is over."""
    from collections import OrderedDict

    from lsr.utils.cuda_graphs import trim_graphs
    graphs = OrderedDict()
    for key, size in (("a", 10), ("b", None), ("c", 30), ("d", 20)):
        graphs[key] = None if size is None else SimpleNamespace(bytes=size)
        trim_graphs(graphs, 3, 100)
    assert list(graphs) == ["b", "c", "d"]        # four entries: the oldest dropped
    graphs["e"] = SimpleNamespace(bytes=60)       # 110 bytes: over the budget
    trim_graphs(graphs, 3, 100)
    assert list(graphs) == ["d", "e"]             # b (count) then c (bytes) dropped
    graphs["f"] = SimpleNamespace(bytes=500)      # alone over the budget: kept, everything older dropped
    trim_graphs(graphs, 3, 100)
    assert list(graphs) == ["f"]


@pytest.mark.gpu
def test_gpu_large_batch_graphs_match_eager_within_the_memory_budget():
    """Batches above 64 queries (up to graphs.max_batch) replay graphs too, captured at their shape's second search
    (the first runs eagerly), with the eager path's bits; the graphs of an index keep at most graphs.bytes (the
    least recently used dropped, the newest kept)."""
    import lsr.search.graphs as sg
    from lsr.benchmarks.synth import synth_docs, synth_queries
    docs = synth_docs(60_000, device="cuda")
    index = build_index(docs, 2048)
    queries = synth_queries(400, device="cuda")
    def search_and_compare(q: SparseVectors, k: int, cfg: SearchConfig = BLOCK) -> None:
        got = gpu_search(index, q, k, cfg)
        want = gpu_search(index, q, k, EAGER)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert_exact_topk(got[0][:4], got[1][:4], float64_scores(q[:4], docs), k)

    before = sg.captures()
    for B, k in ((100, 10), (300, 1000)):
        q = queries[B // 3:B // 3 + B]
        search_and_compare(q, k)
        assert sg.captures() == before, "a large batch's first search runs eagerly"
        search_and_compare(q, k)   # the same shape (batch size, query-length bucket, k): captured now
        before += 1
        assert sg.captures() == before
    held = index_cache(index).graphs.graphs
    assert len(held) == 2 and all(g is not None and g.bytes > 0 for g in held.values())
    search_and_compare(queries[33:133], 10)              # replayed: no capture
    assert sg.captures() == before
    for _ in range(2):   # graphs.bytes=1: every older graph is over the budget now
        search_and_compare(queries[:200], 100, BLOCK.replace(graphs={"bytes": 1}))
    assert len(held) == 1 and sg.captures() == before + 1


def test_graph_cache_bookkeeping_holds_under_threads():
    """Several threads looking graphs up, capturing and trimming one index's cache at once (captures faked: the
    bookkeeping is what is tested): no lookup fails, every answer is a graph of the key's batch size or None, and the
    cache ends within its bounds."""
    import random
    import sys
    import threading

    import lsr.search.graphs as sg

    cache, cfg = sg.GraphCache(fake_capture()), SearchConfig(graphs={"cache": 4, "bytes": 300}).graphs
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads as often as possible
    errors = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(3000):
                B = rng.choice([1, 8, 100, 200])
                graph = cache.lookup(None, B, 0, (B, rng.randrange(5)), cfg, torch.device("cpu"))
                assert graph is None or graph.bytes == B
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors[:3]
    kept = cache.graphs
    assert 1 <= len(kept) <= 4
    assert len(kept) == 1 or sum(g.bytes for g in kept.values()) <= 300


def test_a_large_batch_shape_is_captured_once():
    """A batch above CAPTURE_AT_ONCE_B queries runs eagerly at its shape's first search, is captured at its second, and
    once its graph is dropped (here by the memory budget) runs eagerly from then on instead of being captured again
    each time it comes back; a small batch is captured at its first search (captures faked)."""
    import lsr.search.graphs as sg

    made = []
    cache, cfg = sg.GraphCache(fake_capture(made)), SearchConfig(graphs={"bytes": 250}).graphs   # one large graph
    look = lambda B: cache.lookup(None, B, 0, ("shape", B), cfg, torch.device("cpu"))  # noqa: E731
    assert look(200) is None and made == []               # first search: eager
    assert look(200).bytes == 200 and made == [200]       # second: captured
    assert look(200).bytes == 200 and made == [200]       # replayed
    assert look(150) is None and look(150).bytes == 150   # another shape, captured: 350 bytes, 200 dropped
    assert list(cache.graphs) == [("shape", 150)]
    assert look(200) is None and look(200) is None and made == [200, 150]   # dropped: eager, no capture
    assert look(8).bytes == 8 and made == [200, 150, 8]   # small: captured at once


@pytest.mark.gpu
def test_gpu_search_graph_fallback_leaves_the_process_usable():
    """The block route's graph cache runs a body whose capture fails eagerly (with a warning); model
    initialisation in the same process (serve, then train, say) still works."""
    import warnings

    from lsr.search.graphs import GraphCache

    x = torch.ones(8, device="cuda")
    cache = GraphCache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = cache.lookup(lambda *_: x * float(x.sum().item()), 1, 8, "key", BLOCK.graphs,
                             torch.device("cuda"))
    assert graph is None and any("capture" in str(w.message) for w in caught)
    torch.nn.Linear(64, 32, device="cuda")
    torch.nn.functional.dropout(torch.ones(128, device="cuda"), 0.5)
