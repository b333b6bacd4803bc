"""The block path's coarse pass (lsr.search.kernels.block coarse modes, the CUDA kernel's float32 coarse sums,
lsr.search.block_path's coarse passes 1 and 2): the twin against brute force, the exactness bounds
(``coarse_floor``, ``coarse_theta``), the fallbacks to the exact pass, and the CUDA kernel against the twin.

Runs under TRITON_INTERPRET=1 on the CPU (tests/conftest.py) with the twin standing in for the CUDA kernel
(``SearchConfig(scorer="torch")``, which runs the coarse pass too); the ``gpu`` tests compare the kernel itself.
What the fallback chain did is read from ``gpu_search``'s ``trace``.
"""

from __future__ import annotations

import functools

import pytest
import torch

from lsr.index.inverted import InvertedIndex
from lsr.search.config import CoarseTuning, SearchConfig
from lsr.search.gpu_search import gpu_search
from lsr.search.kernels import block, bucket_select, topk
from lsr.search.kernels.coarse import COARSE_KEY_SHIFT, COARSE_SHIFT, coarse_floor, coarse_theta, coarse_unusual
from lsr.search.kernels.fixed import query_scales
from lsr.search.spans import span_offsets
from lsr.sparse import SparseVectors
from lsr.testing import assert_exact_topk, float64_scores, random_dense_rows, seeded_generator
from tests.conftest import DEV

rand_vectors = functools.partial(random_dense_rows, device=DEV)


def build_index(docs: SparseVectors, block_size: int) -> InvertedIndex:
    return InvertedIndex.build(docs, device=DEV, block_size=block_size, postings="float32")


def csr_of(q: SparseVectors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.indptr, q.indices, q.values


# the block route on the Triton kernel (exact pass 2 only on the CPU), and the same with the twin scoring both
# passes on coarse sums (coarse pass 2 from one query on)
EXACT = SearchConfig(route="block", triton={"span": 64}, pass1={"sample_every": 2},
                     coarse={"sample_every": 2, "min_batch": 1}, graphs={"enabled": False})
COARSE = EXACT.replace(scorer="torch", coarse={"span": 128})


def sent(trace: list, field: str) -> int:
    """Queries the first chunk sent to a fallback (``redo`` or ``rescue``)."""
    got = getattr(trace[0], field)
    return (0 if got is None else got.numel()) if field == "redo" else got


def redone(trace: list) -> list[int]:
    return [] if trace[0].redo is None else trace[0].redo.tolist()


@pytest.fixture
def gen() -> torch.Generator:
    return seeded_generator()  # fresh data every run; the seed is printed with a failure


def test_coarse_twin_and_floor(gen):
    """Coarse mode of the block twin: the keys are (sum of contribution >> COARSE_SHIFT, doc) of exactly
    the docs reaching the floor; ``coarse_floor`` never drops a doc whose exact score reaches theta."""
    docs = rand_vectors(300, 40, 0.2, gen)
    q = rand_vectors(6, 40, 0.3, gen, empty_rows=1)
    index = build_index(docs, 64)
    off = span_offsets(index, 64)
    scale, inv = query_scales(*csr_of(q), index.max_scores)
    args = (index.doc_ids, index.scores, off, *csr_of(q), scale, inv, 64)
    n_spans = off.shape[1] - 1
    # coarse sums by brute force from the per-posting fixed-point contributions
    qd = q.to_dense(torch.float32)
    dd = docs.to_dense(torch.float32)
    contrib = (qd.double().unsqueeze(1) * dd.double().unsqueeze(0) * scale.view(-1, 1, 1)).to(torch.int64)
    coarse = (contrib >> COARSE_SHIFT).sum(2)                                   # [B, N]
    exact = (contrib.sum(2).double() * inv.view(-1, 1)).float()                      # the contract's scores
    theta = exact.sort(1, descending=True).values[:, 20].contiguous()
    floor = coarse_floor(theta, scale, q.indptr)
    reach = (exact >= theta.unsqueeze(1)) & (exact > 0)
    assert bool((coarse >= floor.unsqueeze(1))[reach].all()), "no doc reaching theta falls below the floor"
    cap = 64
    items = block.span_items(6, torch.arange(n_spans, device=DEV), 1, cap)
    got, counts = block.torch_block_candidates(*args, items, 6 * n_spans * cap, cap=cap, coarse_lo=floor)
    lo = floor.clamp_min(1).unsqueeze(1)
    want = torch.where(coarse >= lo, (coarse << COARSE_KEY_SHIFT) | (topk.DOC_MASK - torch.arange(300, device=DEV)), -1)
    got = got.view(6, -1)
    for b in range(6):
        assert torch.equal(got[b][got[b] >= 0].sort().values, want[b][want[b] >= 0].sort().values)
    assert torch.equal(counts.view(6, n_spans).sum(1), (coarse >= lo).sum(1).int())
    # pass 1 on coarse sums: every 32-doc row's best coarse key, and the theta it gives
    width = 64 // topk.ROW
    items = block.span_items(6, torch.arange(n_spans, device=DEV), 1, width)
    rows, _ = block.torch_block_candidates(*args, items, 6 * n_spans * width, coarse_rows=True)
    keys = torch.where(coarse > 0, (coarse << COARSE_KEY_SHIFT) | (topk.DOC_MASK - torch.arange(300, device=DEV)), -1)
    keys = torch.nn.functional.pad(keys, (0, 64 * n_spans - 300), value=-1)
    assert torch.equal(rows.view(6, -1), keys.view(6, -1, topk.ROW).amax(2))
    # theta: at most the k-th best row's exact score, and below it by at most the coarse losses (< n_q units of
    # 2**COARSE_SHIFT) and the bucket width (the selection's level-2 key bits: 2 units)
    k = 5
    theta = coarse_theta(bucket_select.bucket_edge(rows.view(6, -1), k), inv)
    row_best = torch.nn.functional.pad(exact, (0, 64 * n_spans - 300)).view(6, -1, topk.ROW).amax(2)
    kth = row_best.sort(1, descending=True).values[:, k - 1]
    has_k = (rows.view(6, -1) >= 0).sum(1) >= k
    bucket = 2 ** (bucket_select.SHIFT2 - COARSE_KEY_SHIFT)
    slack = ((bucket + q.indptr.diff() + 1) * 2 ** COARSE_SHIFT).double() * inv
    # random rows may be empty (and one is): two queries with k rows of docs keep the bound checks non-vacuous
    assert bool((theta <= kth).all()) and bool((theta[~has_k] == 0).all()) and bool(has_k.sum() >= 2)
    assert bool((theta.double() >= kth.double() - slack)[has_k].all()), "a tight bound where k rows have docs"


def test_coarse_sums_fit_16_bits(gen):
    """The CUDA kernel keeps two docs' coarse sums in one 32-bit word, so a sum must stay below 2**16 (a carry
    would corrupt the neighbouring doc). A doc holding every query term at that term's largest weight reaches
    the query's score bound, which the fixed-point scale maps just below 2**61: its coarse sum is the largest
    any doc can have, and it uses at least half of the 16 bits (the coarse resolution the margins assume)."""
    n_terms = 50
    q = SparseVectors.from_dense((torch.rand(5, n_terms, generator=gen) + 0.01).to(DEV))   # every term in every query
    docs = rand_vectors(40, n_terms, 0.5, gen)
    dd = docs.to_dense(torch.float32)
    dd[0] = dd.amax(0)                                     # the bound: every term at its largest weight
    docs = SparseVectors.from_dense(dd)
    index = build_index(docs, 64)
    scale, inv = query_scales(*csr_of(q), index.max_scores)
    off = span_offsets(index, 64)
    items = block.span_items(5, torch.arange(off.shape[1] - 1, device=DEV), 1, 64 // topk.ROW)
    args = (index.doc_ids, index.scores, off, *csr_of(q), scale, inv, 64)
    rows, _ = block.torch_block_candidates(*args, items, 5 * 2, coarse_rows=True)
    top = rows.view(5, -1).amax(1) >> COARSE_KEY_SHIFT      # each query's largest coarse sum (doc 0's)
    assert bool((top < 2 ** 16).all()) and bool((top >= 2 ** 15 - n_terms).all()), top.tolist()


def test_coarse_sum_at_a_bound_just_below_a_power_of_two():
    """The tightest case of the 16-bit packing: a query whose score bound is 2 - 2**-23, just below a power of
    two. ``query_scales`` rounds only when it multiplies the bound out, and rounding is monotonic with powers of
    two representable, so the bound keeps its binade: scale 2**60, the doc at the bound sums 2**61 - 2**37 and
    its coarse sum is 2**15 + (2**15 - 1) = 2**16 - 1, the largest value a 16-bit half holds."""
    q = SparseVectors.from_dense(torch.tensor([[1.0, 1.0]], device=DEV))
    docs = SparseVectors.from_dense(torch.tensor([[1.0, 1.0 - 2.0 ** -23], [0.5, 0.25]], device=DEV))
    index = build_index(docs, 64)
    scale, inv = query_scales(*csr_of(q), index.max_scores)
    assert scale.tolist() == [2.0 ** 60]
    off = span_offsets(index, 64)
    items = block.span_items(1, torch.arange(off.shape[1] - 1, device=DEV), 1, 64 // topk.ROW)
    rows, _ = block.torch_block_candidates(index.doc_ids, index.scores, off, *csr_of(q), scale, inv, 64, items, 2,
                                           coarse_rows=True)
    assert int(rows.max() >> COARSE_KEY_SHIFT) == 2 ** 16 - 1


@pytest.mark.slow
def test_search_coarse_pass_matches_exact(gen):
    """The block path's coarse pass 2 (CUDA in production; here the twin scores it) returns the exact
    pass's bits, also when its checks send queries back to the exact pass (margin 0, 2 slots); batches
    below ``coarse_min_batch`` skip it."""
    docs = rand_vectors(600, 30, 0.2, gen)
    q = rand_vectors(7, 30, 0.3, gen, empty_rows=1)
    index = build_index(docs, 64)
    k = 6     # pass 1 needs k row maxima (of 32 docs each) for a theta
    want = gpu_search(index, q, k, EXACT)
    assert_exact_topk(*want, float64_scores(q, docs), k)
    trace = []
    got = gpu_search(index, q, k, COARSE, trace=trace)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert sent(trace, "redo") <= 1, "only the empty query (no theta) needs the exact pass"
    no_margin = COARSE.replace(coarse={"margin_min": 0, "margin_share": 0})   # lists of exactly k: incomplete
    for cells in (CoarseTuning.rescue_cells, 0):   # settled from all candidates inside the chunk, then on the host
        trace = []
        got = gpu_search(index, q, k, no_margin.replace(coarse={"rescue_cells": cells}), trace=trace)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert sent(trace, "redo") <= 1
        assert (sent(trace, "rescue") >= 2) == (cells == 0), "incomplete lists are settled from their candidates"
    # and slots overflow: 2 per coarse span, while the first span holds 12 copies of a doc with every term at
    # the largest weight (each non-empty query's top k, so above its floor), whatever the random draw
    tight = no_margin.replace(coarse={"rescue_cells": 0}, pass2={"slots_per_span": 1})
    heavy = torch.full((12, 30), float(docs.values.max()), device=DEV)
    tied = SparseVectors.concat([SparseVectors.from_dense(heavy, [f"tie{i}" for i in range(12)]), docs])
    trace = []
    got = gpu_search(build_index(tied, 64), q, k, tight, trace=trace)
    assert_exact_topk(*got, float64_scores(q, tied), k)
    assert sent(trace, "redo") == int((q.indptr.diff() > 0).sum()), "overflowed slots send queries to the exact pass"
    trace = []
    got = gpu_search(index, q, k, tight.replace(coarse={"min_batch": 8}), trace=trace)  # 7 queries < 8
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert sent(trace, "redo") == 0 and sent(trace, "rescue") == 0, "no coarse pass, so nothing to redo"


@pytest.mark.slow
def test_coarse_floor_from_a_sampled_key_is_checked(gen):
    """From ``sampled_rank_min_k`` on, the coarse pass 2's floor comes from a pass-1 key above the k-th
    (``coarse.sampled_rank``), which is not a proven bound: the block path checks it against the k-th coarse key.
    With the sample's best key (rank 1) and one doc far above all others in the sampled first span, every
    non-empty query lets fewer than k docs through, fails the check and is settled by the exact pass 2; with a
    rank between, the bits are the exact pass's whichever way the check goes."""
    from lsr.search.kernels import coarse
    min_k = CoarseTuning.sampled_rank_min_k
    assert coarse.sampled_rank(10, 1 / 16, min_k) == 10 and coarse.sampled_rank(1000, 1 / 16, min_k) < 1000 // 8
    assert coarse.sampled_rank(min_k, 1.0, min_k) == min_k
    docs = rand_vectors(600, 30, 0.2, gen)
    heavy = torch.full((1, 30), float(docs.values.max()) * 4, device=DEV)
    docs = SparseVectors.concat([SparseVectors.from_dense(heavy, ["heavy"]), docs])
    q = rand_vectors(7, 30, 0.3, gen, empty_rows=1)
    index = build_index(docs, 64)
    k = 6
    want = gpu_search(index, q, k, EXACT)
    assert_exact_topk(*want, float64_scores(q, docs), k)
    trace = []
    got = gpu_search(index, q, k, COARSE.replace(coarse={"floor_rank": 1}), trace=trace)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    non_empty = torch.nonzero(q.indptr.diff() > 0).flatten().tolist()
    assert set(non_empty) <= set(redone(trace)), "every such query was redone"
    got = gpu_search(index, q, k, COARSE.replace(coarse={"floor_rank": k // 2}))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_sampled_floor_end_to_end_at_large_k(gen):
    """k = 256 with the real rank (pass 1 samples half of 64 spans: the floor's key is the sampled rank, not
    the 256th): the top k equals the float64 reference, whether or not a query needed the exact pass 2."""
    from lsr.search.plan import plan_search
    docs = random_dense_rows(65536, 40, 0.05, gen, device=DEV)
    q = random_dense_rows(6, 40, 0.15, gen, empty_rows=1, device=DEV)
    index = InvertedIndex.build(docs, device=DEV, block_size=1024, postings="float32")
    k = CoarseTuning.sampled_rank_min_k
    cfg = SearchConfig(route="block", scorer="torch", triton={"span": 1024},
                       coarse={"span": 2048, "sample_every": 4, "min_batch": 1}, graphs={"enabled": False})
    plan = plan_search(index, q, k, cfg)
    assert plan.block.coarse.sampled and plan.block.coarse.floor_rank < k, "the sampled rank, below k, sets the floor"
    assert "sampled, checked" in plan.describe()
    got = gpu_search(index, q, k, cfg)
    assert_exact_topk(*got, float64_scores(q, docs), k)


def test_sampled_floor_above_a_tie_with_k_docs_through_is_redone(monkeypatch):
    """The harder failure of a sampled floor: k docs still pass it, but one of the top k does not. Docs A (index
    2) and B (index 3) tie exactly at the 3rd score; B's coarse sum is one above A's (A's two terms each lose a
    fraction to the floor), and the floor sits at B's coarse sum: docs 0, 1 and B pass, A (the 3rd by doc index)
    does not. The k-th coarse key's bound catches it (floor > lo_k), so the query takes the exact pass 2.

    The floor is planted with a patch of ``_coarse_bounds``: no data makes pass 1 return a theta between two coarse
    sums one unit apart, and this is the only way to check the bound that catches it."""
    import lsr.search.block_path as bp
    u = 2.0 ** (COARSE_SHIFT - 59)   # a coarse unit in score units: the query's scale is 2^59 (bound 2)
    d = torch.zeros(70, 2)
    d[0, 0] = d[1, 1] = 1.0
    d[2] = torch.tensor([0.5 + u / 2, 0.25 + u / 2])         # A
    d[3] = torch.tensor([0.5 + u, 0.25])                     # B: the same exact score
    d[4:, 0], d[4:, 1] = 0.1 + torch.arange(4, 70) * 1e-3, 0.05  # far below
    docs = SparseVectors.from_dense(d.to(DEV))
    q = SparseVectors.from_dense(torch.ones(1, 2, device=DEV))
    index = build_index(docs, 64)
    k = 3
    want = gpu_search(index, q, k, EXACT)
    assert want[1].tolist() == [[0, 1, 2]]
    s = round(0.75 / u)                                       # A's coarse sum; B's is s + 1
    theta = torch.tensor([(s + 2) * u + u / 8], dtype=torch.float32, device=DEV)
    monkeypatch.setattr(bp, "_coarse_bounds",
                        lambda plan, maxima, args: (theta, coarse_floor(theta, args.scale, args.indptr)))
    scale, _ = query_scales(*csr_of(q), index.max_scores)
    assert coarse_floor(theta, scale, q.indptr).tolist() == [s + 1], "the floor lets B through, not A"
    trace = []
    got = gpu_search(index, q, k, COARSE.replace(coarse={"floor_rank": 1}), trace=trace)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert redone(trace) == [0], "the check sent the query to the exact pass 2"


def _extreme_weights(gen: torch.Generator, n_docs: int = 300) -> tuple[SparseVectors, SparseVectors]:
    """Docs with one huge weight and a query whose other weight is tiny: that term's coarse factor
    w_query * scale / 2**COARSE_SHIFT falls below float32's normal range (the CUDA kernel's float32
    coarse sums would not be exact there)."""
    docs = random_dense_rows(n_docs, 30, 0.3, gen)
    dense = docs.to_dense(torch.float32)
    dense[5, 0], dense[:, 1] = 1e18, torch.where(dense[:, 1] > 0, dense[:, 1], 0.5)
    q = rand_vectors(4, 30, 0.3, gen)
    qd = q.to_dense(torch.float32)
    qd[0] = 0
    qd[0, 0], qd[0, 1] = 1.0, 1e-30
    return SparseVectors.from_dense(dense), SparseVectors.from_dense(qd)


def test_coarse_factor_outside_float32_sends_query_to_exact_pass(gen):
    """A query whose coarse factor is not a normal float32 is flagged by the coarse pass (its items report
    an overflow) and settled by the exact pass: the search gives the exact pass's bits. (Weights 18
    orders of magnitude apart also leave the fixed point's resolution, U_q * 2**-61, above the small
    scores: this compares with the exact pass, not with float64.)"""
    docs, q = _extreme_weights(gen)
    index = build_index(docs, 64)
    scale, inv = query_scales(*csr_of(q), index.max_scores)
    unusual = coarse_unusual(q.indptr, q.values, scale)
    assert unusual.tolist() == [True, False, False, False]
    off = span_offsets(index, 64)
    n_spans, cap = off.shape[1] - 1, 16
    items = block.span_items(4, torch.arange(n_spans, device=DEV), 1, cap)
    floor = torch.ones(4, dtype=torch.int64, device=DEV)
    _, counts = block.torch_block_candidates(index.doc_ids, index.scores, off, *csr_of(q), scale, inv, 64, items,
                                             4 * n_spans * cap, cap=cap, coarse_lo=floor)
    assert bool((counts.view(4, n_spans)[0] == cap + 1).all()) and bool((counts.view(4, n_spans)[1:] <= 64).all())
    want = gpu_search(index, q, 5, EXACT)
    trace = []
    got = gpu_search(index, q, 5, COARSE, trace=trace)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert 0 in redone(trace), "the flagged query went to the exact pass"


def test_cuda_kernel_launch_bounds_and_coarse_span_fit():
    """CTAs per SM the CUDA kernel is compiled for stay within 2048 threads, and the coarse passes only take
    spans whose read-out fits (64 rows of 128 docs a warp at most, one row a warp at least; a CPU check of the
    choices the GPU tests rely on)."""
    from lsr.search.block_planner import coarse_choice
    from lsr.search.kernels import block_cuda
    from lsr.search.scorers import scorer

    def coarse_span(cfg: SearchConfig, index: InvertedIndex) -> int | None:   # pass 1 on the CUDA span
        return coarse_choice(cfg, index, scorer("cuda"), cfg.cuda.span, 1, cfg.coarse.min_batch)[0]

    for warps in (1, 2, 4, 8, 16, 32):
        for coarse in (False, True):
            n = block_cuda._min_ctas(warps, coarse)
            assert 1 <= n <= 32 and n * 32 * warps <= 2048     # an SM holds at most 32 CTAs and 2048 threads
    assert (block_cuda._min_ctas(16, True), block_cuda._min_ctas(16, False)) == (3, 2)
    docs = random_dense_rows(40_000, 8, 0.3, seeded_generator())
    index = InvertedIndex.build(docs, block_size=1 << 16, postings="float32")
    assert coarse_span(SearchConfig(cuda={"warps": 4}), index) == 32768
    assert coarse_span(SearchConfig(cuda={"warps": 2}), index) is None     # 32768 docs need 128 rows a warp
    assert coarse_span(SearchConfig(cuda={"warps": 2}, coarse={"span": 8192}), index) == 8192
    # pass 1 runs in coarse mode on the plan's span (the CUDA span): 16 warps read rows of 128 docs, 2048 at least
    assert coarse_span(SearchConfig(cuda={"span": 1024, "warps": 16}), index) is None
    assert coarse_span(SearchConfig(cuda={"span": 2048, "warps": 16}), index) == 32768



# --------------------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
def test_gpu_cuda_coarse_flags_factor_outside_float32(gen):
    from lsr.search.kernels import block_cuda
    from lsr.search.plan import plan_search
    docs, q = (v.to("cuda") for v in _extreme_weights(torch.Generator(device="cpu").manual_seed(3), 40000))
    index = InvertedIndex.build(docs, device="cuda", block_size=1024)
    cfg = SearchConfig(coarse={"min_batch": 1})
    assert plan_search(index, q, 5, cfg).block.coarse is not None, "the search runs the coarse pass"
    span = 2048   # the coarse read-outs take rows of 128 docs a warp: 16 warps need 2048 docs
    off = span_offsets(index, span)
    scale, inv = query_scales(*csr_of(q), index.max_scores)
    args = (index.doc_ids, index.scores, off, *csr_of(q), scale, inv, span)
    items = block.span_items(4, torch.arange(off.shape[1] - 1, device="cuda"), 1, 64)
    floor = torch.ones(4, dtype=torch.int64, device="cuda")
    got = block_cuda.cuda_block_candidates(*args, items, 4 * (off.shape[1] - 1) * 64, cap=64, coarse_lo=floor)
    want = block.torch_block_candidates(*args, items, 4 * (off.shape[1] - 1) * 64, cap=64, coarse_lo=floor)
    assert torch.equal(got[1], want[1]) and bool((got[1].view(4, -1)[0] == 65).all())
    # the flagged query's slots are never read; the others' match the twin
    assert torch.equal(got[0].view(4, -1)[1:], want[0].view(4, -1)[1:])
    items = block.span_items(4, torch.arange(off.shape[1] - 1, device="cuda"), 1, span // topk.ROW)
    rows = block_cuda.cuda_block_candidates(*args, items, 4 * (off.shape[1] - 1) * (span // topk.ROW),
                                            coarse_rows=True)[0]
    assert torch.equal(rows, block.torch_block_candidates(*args, items, rows.numel(), coarse_rows=True)[0])
    assert bool((rows.view(4, -1)[0] == -1).all()) and bool((rows.view(4, -1)[1:] >= 0).any())
    want = gpu_search(index, q, 5, cfg.replace(coarse={"enabled": False}))
    got = gpu_search(index, q, 5, cfg)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
