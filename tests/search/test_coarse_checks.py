"""The coarse route's fused bookkeeping kernels (lsr.search.kernels.coarse_checks) and the one-launch key packing
(lsr.search.kernels.topk.triton_pack_keys / triton_unpack_keys) against their torch twins, bit for bit, edge values
included: theta rounded up to the next float32 and pulled back, scores past float32's range, floors clamped at
2**62 and at 1, empty rows, every verdict branch. Runs under TRITON_INTERPRET=1 on the CPU (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from lsr.search.kernels import coarse_checks as cc
from lsr.search.kernels import topk
from lsr.search.kernels.coarse import COARSE_KEY_SHIFT, coarse_floor, coarse_theta
from lsr.testing import seeded_generator
from tests.conftest import DEV


@pytest.fixture
def gen() -> torch.Generator:
    return seeded_generator()


def _scales(B: int, gen: torch.Generator, lo: float = 20.0, hi: float = 70.0) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (scale, inv_scale) with random exponents and mantissas, as ``query_scales`` gives them."""
    e = torch.empty(B, dtype=torch.float64).uniform_(lo, hi, generator=gen)
    scale = torch.exp2(e)
    return scale.to(DEV), (1.0 / scale).to(DEV)


def _indptr(B: int, gen: torch.Generator) -> torch.Tensor:
    lens = torch.randint(0, 60, (B,), generator=gen)
    return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(DEV)


def _coarse_keys(sums: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    docs = torch.randint(0, 1 << 31, sums.shape, generator=gen, dtype=torch.int64)
    return ((sums << COARSE_KEY_SHIFT) | docs).to(DEV)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")   # the interpreter's float32 inf, on purpose
def test_coarse_bounds_match_the_twin_bit_for_bit(gen):
    B = 300
    sums = torch.randint(0, 1 << 16, (B,), generator=gen, dtype=torch.int64)
    sums[:8] = torch.tensor([0, 1, 2, (1 << 16) - 1, 1 << 20, 1 << 24, 3, 5])   # empty rows, large sums
    edge = _coarse_keys(sums, gen)
    edge[0] = 0                                                                   # bucket_edge's "fewer than k"
    scale, inv = _scales(B, gen)
    scale[8:16] = 2.0 ** 130   # -> floors past the clamp at 2**62
    inv[16:24] = 2.0 ** 100    # -> scores past float32's largest: theta inf, pulled back to FLT_MAX
    inv[24:32] = 2.0 ** -190   # -> subnormal thetas
    # thetas one float32 above m / 32 with scale 2**50: the doc bound below theta, times the scale, is m * 2**45
    # exactly, and the factor 1 - 2**-50 takes the floor one lower (a float literal there would be float32: 1.0)
    m = sums[32:40].to(torch.float64) + 1000
    sums[32:40] = m.long()
    edge[32:40] = _coarse_keys(sums[32:40], gen)
    ulp = torch.nextafter(m.float() / 32, torch.tensor(float("inf"))).double() - m / 32
    inv[32:40] = ((m / 32 + 1.4 * ulp) / (m * 2.0 ** 45)).to(DEV)
    scale[32:40] = 2.0 ** 50
    indptr = _indptr(B, gen)
    theta, floor = cc.coarse_bounds(edge, inv, scale, indptr)
    want_theta, want_floor = cc.torch_coarse_bounds(edge, inv, scale, indptr)
    assert torch.equal(theta.view(torch.int32), want_theta.view(torch.int32))
    assert torch.equal(floor, want_floor)
    # the cases above are reached: theta rounded down from a float32 above the exact value, FLT_MAX, floor 2**62 >> 45
    exact = ((edge >> COARSE_KEY_SHIFT) << 45).to(torch.float64) * inv
    assert bool((exact.to(torch.float32).to(torch.float64) > exact).any())
    assert bool((theta == torch.finfo(torch.float32).max).any())
    assert bool((floor[8:16] + indptr.diff()[8:16] - 1 == (1 << 62) >> 45).any())
    assert torch.equal(floor[32:40] + indptr.diff()[32:40], sums[32:40].to(DEV))


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("rescue_flag", [False, True])
@pytest.mark.slow
def test_coarse_verdicts_match_the_twin(gen, sampled, rescue_flag):
    B, W, n_spans, cap, k = 64, 24, 300, 8, 16
    sums = torch.randint(0, 1 << 12, (B, W), generator=gen, dtype=torch.int64).sort(1, descending=True).values
    top = _coarse_keys(sums, gen)
    pad = torch.randint(0, W + 1, (B,), generator=gen).to(DEV) * (torch.arange(B, device=DEV) % 3 == 0)
    top = torch.where(torch.arange(W, device=DEV) >= W - pad.unsqueeze(1), -1, top)   # short lists
    scale, inv = _scales(B, gen, 40.0, 50.0)
    indptr = _indptr(B, gen)
    lo_k = coarse_floor(coarse_theta(top[:, k - 1].clamp_min(0), inv), scale, indptr)
    # floors around lo_k (the sampled check's edge), some below 1; lists whose last key sits at lo_k
    floor = lo_k + torch.randint(-2, 3, (B,), generator=gen).to(DEV)
    floor[:4] = torch.tensor([0, -5, 1, 2])
    last = lo_k.clamp_min(0) + torch.randint(-1, 2, (B,), generator=gen).to(DEV)
    top[:, -1] = torch.where(top[:, -1] >= 0, (last.clamp_min(0) << COARSE_KEY_SHIFT) | 5, -1)
    counts = torch.randint(0, cap + 1, (B, n_spans), generator=gen, dtype=torch.int32).to(DEV)
    counts[torch.arange(0, B, 7), torch.randint(0, n_spans, (len(range(0, B, 7)),), generator=gen)] = cap + 1
    reselect = (torch.rand(B, generator=gen) < 0.1).to(DEV)
    for n_cand, kk in ((1000, k), (W, k), (1000, W + 4)):   # a complete list by size; fewer keys than k
        args = (top, kk, n_cand, counts, cap, floor, reselect, inv, scale, indptr, sampled, rescue_flag)
        got, want = cc.coarse_verdicts(*args), cc.torch_coarse_verdicts(*args)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
    redo, rescue, flags = cc.coarse_verdicts(top, k, 1000, counts, cap, floor, reselect, inv, scale, indptr, sampled,
                                             rescue_flag)
    assert 0 < int(redo.sum()) < B and 0 < int(rescue.sum()) < B, "both verdicts occur"
    assert flags.tolist() == [0, 0, 1, int(rescue_flag)]


def test_candidate_docs_match_the_twin(gen):
    B, W, C = 6, 40, 1500
    top = torch.randint(0, 1 << 40, (B, W), generator=gen).to(DEV)
    cand = torch.randint(0, 1 << 40, (B, C), generator=gen).to(DEV)
    top[:, -7:] = -1                                      # list padding and empty candidate slots
    cand[:, ::3] = -1
    rescue = torch.tensor([True, False, False, True, False, True], device=DEV)
    assert torch.equal(cc.candidate_docs(top), cc.torch_candidate_docs(top))
    got = cc.candidate_docs(top, cand, rescue)
    assert torch.equal(got, cc.torch_candidate_docs(top, cand, rescue))
    assert bool((got[0, :W] == -1).all()) and bool((got[1, W:] == -1).all())
    assert bool((got[1, W - 7:W] == -1).all()) and bool((got[0, W::3] == -1).all()) and bool((got[0, W + 1:] >= 0).any())


def test_pack_and_unpack_in_one_launch_match_the_twins(gen):
    scores = torch.randn(7, 300, generator=gen).to(DEV)
    scores[0, :5] = torch.tensor([0.0, -0.0, float("inf"), 1e-45, torch.finfo(torch.float32).max])
    docs = torch.randint(0, 1 << 31, (7, 300), generator=gen).to(DEV)
    docs[:, ::5] = -1                                    # -1 docs, as a rescoring list pads (zero scores there)
    scores[:, ::5] = 0.0
    keys = topk.triton_pack_keys(scores, docs)
    assert torch.equal(keys, topk.pack_keys(scores, docs))
    assert bool((keys[:, ::5] == -1).all()), "no doc, no key"
    s, d = topk.triton_unpack_keys(keys)
    ws, wd = topk.unpack_keys(keys)
    assert torch.equal(s.view(torch.int32), ws.view(torch.int32)) and torch.equal(d, wd)
    with pytest.raises(ValueError, match="docs"):
        topk.triton_pack_keys(scores, docs.to(torch.int32))
