"""Bucket selection (lsr.search.kernels.bucket_select) and the one-launch query scales: each kernel against its
torch twin and against torch.topk / the exact k-th score, then through the block path's repair of a row
whose selection overflowed. Interpreter mode on the CPU (tests/conftest.py); ``gpu`` tests at real sizes."""

from __future__ import annotations

import functools

import pytest
import torch

from lsr.index.inverted import InvertedIndex
from lsr.search.config import SearchConfig
from lsr.search.gpu_search import gpu_search
from lsr.search.kernels import bucket_select, topk
from lsr.search.kernels.fixed import query_scales, triton_query_scales
from lsr.search.select import row_topk
from lsr.testing import assert_exact_topk, float64_scores, random_dense_rows, seeded_generator

DEV = "cuda" if torch.cuda.is_available() else "cpu"
rand_vectors = functools.partial(random_dense_rows, device=DEV)


@pytest.fixture
def gen() -> torch.Generator:
    return seeded_generator()  # fresh data every run; the seed is printed with a failure


def random_keys(gen: torch.Generator, B: int, C: int, empty: float, ties: bool) -> torch.Tensor:
    """int64 keys [B, C] of random scores (-1 for a share ``empty`` of them), docs in random order."""
    scores = torch.rand(B, C, generator=gen) * 30
    if ties:
        scores = (scores * 2).round() / 2        # 60 distinct scores: large tie groups
    scores[torch.rand(B, C, generator=gen) < empty] = 0.0
    docs = torch.randperm(C, generator=gen)
    return topk.pack_keys(scores, docs.unsqueeze(0)).to(DEV).contiguous()


CASES = [(1, 5000, 1000, 0.7, False), (3, 3000, 10, 0.5, True), (2, 700, 1000, 0.2, False),
         (5, 4100, 64, 0.95, False), (2, 300, 7, 1.0, False)]


@pytest.mark.parametrize("by_rank", [False, True])   # the gathered slots through torch.topk / the rank kernel
@pytest.mark.parametrize("B,C,k,empty,ties", CASES)
def test_bucket_topk_is_torch_topk(gen, B, C, k, empty, ties, by_rank):
    """The k largest keys, sorted, -1 padded; no row of these flags an overflow."""
    keys = random_keys(gen, B, C, empty, ties)
    top, overflow = bucket_select.bucket_topk(keys, k, slots=bucket_select.select_slots(k), by_rank=by_rank)
    assert not bool(overflow.any())
    assert torch.equal(top, row_topk(keys, k))


@pytest.mark.parametrize("B,C,k,empty,ties", CASES)
def test_bucket_levels_match_twin_and_bound_the_kth_score(gen, B, C, k, empty, ties):
    keys = random_keys(gen, B, C, empty, ties)
    if C < k:
        assert torch.equal(bucket_select.bucket_theta(keys, k), torch.zeros(B, device=DEV))
        return
    got = bucket_select._levels(keys, k)
    want = bucket_select.torch_bucket_levels(keys, k)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), "kernels == twin"
    theta, kth = got[2], topk.kth_threshold(keys, k)
    assert bool((theta <= kth).all()), "a lower bound"
    assert bool((theta >= kth * (1 - 2.0 ** -15)).all()), "and a tight one"
    assert bool(((kth == 0) == (theta == 0)).all()), "0.0 exactly where a row has fewer than k keys"


def test_bucket_topk_flags_rows_whose_ties_overflow(gen):
    """A row with more keys tied at its k-th score than the slots hold is flagged; the others are right."""
    keys = random_keys(gen, 2, 6000, 0.1, False)
    tied = topk.pack_keys(torch.full((1, 6000), 7.0), torch.arange(6000).unsqueeze(0)).to(DEV)
    keys[1] = tied[0]
    top, overflow = bucket_select.bucket_topk(keys, 10, slots=bucket_select.select_slots(10), by_rank=True)
    assert overflow.tolist() == [False, True]
    assert torch.equal(top[0], row_topk(keys[:1], 10)[0])


@pytest.mark.slow
def test_block_search_reselects_overflowed_rows(gen):
    """Rows flagged by the bucket selection are selected again with torch.topk: the search stays exact."""
    docs = rand_vectors(300, 20, 0.3, gen, quantized=True)        # few distinct scores: ties at the k-th
    q = rand_vectors(4, 20, 0.4, gen, quantized=True, empty_rows=1)
    index = InvertedIndex.build(docs, device=DEV, block_size=32)
    # fewer slots than k: rows of more keys overflow
    cfg = SearchConfig(route="block", triton={"span": 32}, selection={"slots": 16})
    for cfg in (cfg.replace(coarse={"enabled": False}), cfg):
        trace = []
        s, d = gpu_search(index, q, 30, cfg, trace=trace)
        assert_exact_topk(s, d, float64_scores(q, docs), 30)
        assert trace[0].reselect > 0, "the reselect fallback ran"


def query_csr(gen: torch.Generator, lens: list[int], vocab: int, tail: int):
    ip = torch.zeros(len(lens) + 1, dtype=torch.int64)
    ip[1:] = torch.tensor(lens).cumsum(0)
    n = int(ip[-1]) + tail                      # a graph's buffer may run past the last query
    terms = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int32)
    scale = 10.0 ** float(torch.randint(-20, 20, (1,), generator=gen))
    weights = torch.rand(n, generator=gen) * scale
    return ip.to(DEV), terms.to(DEV), weights.to(DEV)


@pytest.mark.parametrize("lens", [[5, 0, 130, 1], [300], [0], [1, 2, 3, 4, 5, 6, 7, 8]])
def test_triton_query_scales_is_query_scales(gen, lens):
    max_scores = (torch.rand(500, generator=gen) * 3).to(DEV)
    max_scores[::7] = 0.0                       # empty posting lists
    csr = query_csr(gen, lens, 500, tail=9)
    got, want = triton_query_scales(*csr, max_scores), query_scales(*csr, max_scores)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize("by_rank", [False, True])
@pytest.mark.parametrize("B,C,k", [(1, 68800, 1000), (1, 17408, 10), (64, 68864, 1125), (500, 17408, 1000),
                                   (500, 17408, 1500)])
def test_gpu_bucket_selection_at_search_shapes(gen, B, C, k, by_rank):
    keys = random_keys(gen, B, C, 0.75, False)
    top, overflow = bucket_select.bucket_topk(keys, k, slots=bucket_select.select_slots(k), by_rank=by_rank)
    assert not bool(overflow.any()) and torch.equal(top, row_topk(keys, k))
    got = bucket_select._levels(keys, k)
    assert all(torch.equal(a, b) for a, b in zip(got, bucket_select.torch_bucket_levels(keys, k)))
    assert bool((got[2] <= topk.kth_threshold(keys, k)).all())


@pytest.mark.gpu
@pytest.mark.parametrize("B,C,empty,ties", [(3, 5000, 0.5, True), (500, 8704, 0.0, False), (2, 70000, 0.9, True),
                                            (4, 1, 0.0, False)])
def test_gpu_cuda_histogram_is_the_triton_one(gen, B, C, empty, ties):
    """Both levels of the CUDA histogram (shared-memory counts, warp-aggregated) equal the Triton kernel's, on rows
    whose keys crowd into a few bins (ties) and rows that span several CTAs; a row whose pick is -1 counts nothing."""
    from lsr.search.kernels import select_cuda
    keys = random_keys(gen, B, C, empty, ties)
    pick = torch.where(keys.amax(1) >= 0, keys.amax(1) >> bucket_select.SHIFT1, -1)
    pick[0] = -1
    for level2 in (False, True):
        got = torch.zeros((B, bucket_select.BINS), dtype=torch.int32, device=DEV)
        want = torch.zeros_like(got)
        select_cuda.cuda_bucket_hist(keys, got, pick, level2)
        bucket_select._hist_kernel[(B, -(-C // bucket_select._BLOCK))](keys, C, want, pick, LEVEL2=level2, BLOCK=bucket_select._BLOCK)
        assert torch.equal(got, want) and bool((got.sum(1)[1:] > 0).any() or C == 1)
        if level2:
            assert int(got[0].sum()) == 0


@pytest.mark.gpu
def test_gpu_triton_query_scales_is_query_scales(gen):
    max_scores = (torch.rand(30522, generator=gen) * 3).to(DEV)
    for lens in ([40], [0, 300, 12] * 100):
        csr = query_csr(gen, lens, 30522, tail=64)
        got, want = triton_query_scales(*csr, max_scores), query_scales(*csr, max_scores)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_gpu_graphs_keep_their_work_items():
    """A captured graph reads the cached work items; dropping the cache (and reusing its memory) must not
    change what the graph's replays return."""
    from lsr.benchmarks.synth import synth_docs, synth_queries
    from lsr.search.index_cache import index_cache
    docs = synth_docs(40_000, device="cuda")
    index = InvertedIndex.build(docs, device="cuda", block_size=2048)
    q = synth_queries(3, device="cuda")
    want = gpu_search(index, q[:1], 100, SearchConfig(route="block", graphs={"enabled": False}))
    gpu_search(index, q[:1], 100, SearchConfig(route="block"))         # captures the graph
    index_cache(index).items_small.cache_clear()       # the items' blocks go back to the allocator ...
    clobber = [torch.full((n,), 7, dtype=torch.int64, device="cuda") for n in (8, 16, 32, 64) for _ in range(500)]
    got = gpu_search(index, q[:1], 100, SearchConfig(route="block"))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    del clobber
