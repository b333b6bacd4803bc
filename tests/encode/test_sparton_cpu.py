"""The tiled CPU head (lsr.encode.sparton.cpu) against the torch twin, and its dispatch."""

from __future__ import annotations

import pytest
import torch

from lsr.encode.sparton import DEFAULT_DISPATCH, sparton_head, torch_sparton_head
from lsr.encode.sparton import cpu as sparton_cpu
from lsr.encode.sparton.cpu import cpu_sparton_head, token_blocks


def _inputs(B: int, S: int, D: int, V: int, seed: int, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, S, D, generator=g, dtype=torch.float64).to(dtype)
    weight = (torch.randn(V, D, generator=g, dtype=torch.float64) / D ** 0.5).to(dtype)
    bias = torch.randn(V, generator=g, dtype=torch.float64).to(dtype)
    mask = torch.rand(B, S, generator=g) < 0.7  # holes anywhere, not only trailing padding
    return hidden, weight, bias, mask


@pytest.mark.parametrize("B,S,D,V,vocab_tile,token_tile", [
    (3, 7, 8, 37, 16, 5),      # V not a multiple of the tile; texts longer than a token block
    (5, 33, 16, 101, 64, 40),  # several texts per block, one split across blocks
    (1, 1, 4, 3, 8, 8),        # one token, a tile wider than V
    (4, 12, 8, 50, 50, 1),     # one token per block: every text is split
    (2, 300, 32, 257, 4096, 2048),  # the default tiles
])
@pytest.mark.parametrize("with_bias", [True, False])
def test_cpu_head_equals_twin(B, S, D, V, vocab_tile, token_tile, with_bias):
    hidden, weight, bias, mask = _inputs(B, S, D, V, seed=B * 1000 + S)
    mask[-1] = True  # a row without padding
    if B > 1:
        mask[0] = False  # a fully masked row gives 0
    bias = bias if with_bias else None
    want = torch_sparton_head(hidden, weight, bias, mask)
    got = cpu_sparton_head(hidden, weight, bias, mask, vocab_tile=vocab_tile, token_tile=token_tile)
    assert got.shape == (B, V) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert B == 1 or (got[0] == 0).all()
    assert (got > 0).any()  # the comparison is not all zeros


def test_cpu_head_float64_and_bf16():
    hidden, weight, bias, mask = _inputs(3, 9, 8, 41, seed=7, dtype=torch.float64)
    got = cpu_sparton_head(hidden, weight, bias, mask, vocab_tile=10, token_tile=4)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch_sparton_head(hidden, weight, bias, mask), rtol=1e-12, atol=1e-12)
    h16, w16, b16 = hidden.bfloat16(), weight.bfloat16(), bias.bfloat16()
    got16 = cpu_sparton_head(h16, w16, b16, mask, vocab_tile=10, token_tile=4)
    assert got16.dtype == torch.bfloat16
    want16 = torch_sparton_head(h16, w16, b16, mask)  # both upcast to float32, then round once
    torch.testing.assert_close(got16.float(), want16.float(), rtol=1e-2, atol=1e-2)


def test_cpu_head_int_mask_none_mask_and_empty():
    hidden, weight, bias, mask = _inputs(2, 5, 4, 9, seed=3)
    torch.testing.assert_close(cpu_sparton_head(hidden, weight, bias, mask.long()),
                               torch_sparton_head(hidden, weight, bias, mask), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cpu_sparton_head(hidden, weight, bias, None),
                               torch_sparton_head(hidden, weight, bias, None), rtol=1e-5, atol=1e-6)
    assert cpu_sparton_head(hidden[:0], weight, bias, mask[:0]).shape == (0, 9)
    assert (cpu_sparton_head(hidden[:, :0], weight, bias, mask[:, :0]) == 0).all()
    with pytest.raises(ValueError):
        cpu_sparton_head(hidden, weight, bias, mask, vocab_tile=0)
    with pytest.raises(ValueError):
        cpu_sparton_head(hidden, weight[:, :3], bias, mask)


@pytest.mark.parametrize("counts,tile", [([3, 5, 0, 2, 9, 1], 4), ([1, 1, 1], 2), ([0, 0], 3), ([7], 7), ([8, 2], 5)])
def test_token_blocks_cover_every_token_once(counts, tile):
    covered = [[0] * n for n in counts]
    end_prev = 0
    for first, end, pieces in token_blocks(counts, tile):
        assert first == end_prev and 0 < end - first <= tile
        end_prev = end
        for row, a, b in pieces:
            assert 0 <= a < b <= end - first
            start = sum(counts[:row])
            for t in range(first + a, first + b):  # stream position -> this row's token
                covered[row][t - start] += 1
        # a text is cut only when it is longer than a block
        for row, a, b in pieces:
            assert b - a == counts[row] or counts[row] > tile or len(pieces) > 1
    assert end_prev == sum(counts)
    assert all(c == 1 for row in covered for c in row)


def test_sparton_head_auto_uses_the_cpu_head_for_inference_only():
    hidden, weight, bias, mask = _inputs(3, 6, 8, 20, seed=11)
    runs = DEFAULT_DISPATCH.runs
    before = runs.copy()
    with torch.no_grad():
        y = sparton_head(hidden, weight, bias, mask)
    assert runs - before == {"cpu_tiled": 1}
    torch.testing.assert_close(y, torch_sparton_head(hidden, weight, bias, mask), rtol=1e-5, atol=1e-6)
    sparton_head(hidden, weight, bias, mask, backend="torch")
    w = weight.clone().requires_grad_()
    sparton_head(hidden, w, bias, mask).sum().backward()  # needs a gradient: the differentiable twin
    assert runs - before == {"cpu_tiled": 1, "torch": 2} and w.grad is not None and w.grad.abs().sum() > 0


def test_transposed_weight_is_reused_only_while_the_weight_is_unchanged():
    hidden, weight, bias, mask = _inputs(2, 6, 8, 30, seed=5)
    first = cpu_sparton_head(hidden, weight, bias, mask)
    key = id(weight)
    assert key in sparton_cpu._TRANSPOSED
    weight.mul_(-2.0)  # in place: the cached Eᵀ is stale
    second = cpu_sparton_head(hidden, weight, bias, mask)
    torch.testing.assert_close(second, torch_sparton_head(hidden, weight, bias, mask), rtol=1e-5, atol=1e-6)
    assert not torch.equal(first, second)
    del weight
    assert key not in sparton_cpu._TRANSPOSED  # dropped with its weight
