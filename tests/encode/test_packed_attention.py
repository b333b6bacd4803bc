"""Attention inside packed texts (lsr.encode.backbone.packed_attention): the Triton kernel, in both tilings,
against its torch twin (per-text sdpa); on CPU under TRITON_INTERPRET=1 (conftest), on the GPU against
flash attention's variable-length kernel too. Outputs are poisoned so an unwritten row cannot pass."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from lsr.encode.backbone.packed_attention import (
    packed_attention,
    text_of_rows,
    torch_varlen_attention,
    triton_packed_attention,
)
from tests.conftest import DEV

pytestmark = pytest.mark.skipif(DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs CUDA or TRITON_INTERPRET=1")


def packed_qkv(lengths: list[int], H: int, Dh: int, dtype: torch.dtype, seed: int, device: str = DEV):
    """q, k, v as strided views of one [T, 3, H, Dh] tensor (as the body's fused projection gives them),
    segments int32 [T], cu int32 [B+1]."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    qkv = (torch.randn(T, 3, H, Dh, generator=g) * 2).to(dtype).to(device)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return qkv[:, 0], qkv[:, 1], qkv[:, 2], text_of_rows(cu, T), cu


LENGTHS = {
    "short": [5, 1, 9, 16, 3, 7, 2, 11],        # several texts per tile
    "mixed": [1, 40, 0, 17, 33, 2, 0, 9, 25],   # empty texts between others, tiles cut through texts
    "long": [70, 3, 45, 61],                    # texts over two tiles
    "one": [1],
}


@pytest.mark.parametrize("grouped", [False, True], ids=["rows", "grouped"])
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (16, 32)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("case", list(LENGTHS))
@pytest.mark.usefixtures("poison")
def test_kernel_matches_twin(case, blocks, grouped):
    lengths = LENGTHS[case]
    q, k, v, seg, cu = packed_qkv(lengths, H=2, Dh=16, dtype=torch.float32, seed=len(lengths) + blocks[0])
    max_len = max(lengths) + 3   # above the longest, as the padded width may be
    got = triton_packed_attention(q, k, v, seg, cu, max_len, *blocks, grouped=grouped)
    want = torch_varlen_attention(q, k, v, cu, max_len)
    assert got.shape == q.shape and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert want.abs().max() > 0.1   # not vacuous


@pytest.mark.parametrize("longest", [12, 40, 70], ids=lambda n: f"max{n}")
@pytest.mark.usefixtures("poison")
def test_tiling_choice_matches_twin(longest):
    """packed_attention picks a tiling from the longest text (grouped at <= 64 and > 96, rows between)."""
    lengths = [longest, longest - 1, 3, longest, 1, longest // 2]
    q, k, v, seg, cu = packed_qkv(lengths, H=1, Dh=16, dtype=torch.float32, seed=longest)
    got = packed_attention(q, k, v, seg, cu, longest)
    torch.testing.assert_close(got, torch_varlen_attention(q, k, v, cu, longest), rtol=1e-5, atol=1e-5)


def test_keys_never_cross_texts():
    """Keys of a neighbouring text are masked: changing them leaves a text's output bit for bit unchanged."""
    lengths = [7, 20, 9]
    q, k, v, seg, cu = packed_qkv(lengths, H=1, Dh=16, dtype=torch.float32, seed=1)
    base = triton_packed_attention(q, k, v, seg, cu, 20, 16, 16)
    k2, v2 = k.clone(), v.clone()
    k2[7:27] += 5.0
    v2[7:27] -= 3.0
    moved = triton_packed_attention(q, k2, v2, seg, cu, 20, 16, 16)
    assert torch.equal(moved[:7], base[:7]) and torch.equal(moved[27:], base[27:])
    assert not torch.equal(moved[7:27], base[7:27])


def test_zeroed_offsets_neither_assert_nor_read_out_of_bounds():
    """A CUDA-graph warm-up runs the body on a zeroed buffer: text ids stay in range, no row gets a key."""
    q, k, v, _, _ = packed_qkv([6], H=1, Dh=16, dtype=torch.float32, seed=2)
    cu = torch.zeros(3, dtype=torch.int32, device=q.device)
    seg = text_of_rows(cu, 6)
    assert seg.tolist() == [1] * 6
    assert torch.equal(triton_packed_attention(q, k, v, seg, cu, 6, 16, 16), torch.zeros_like(q))
    triton_packed_attention(q, k, v, seg, cu, 6, 16, 16, grouped=True)   # no text has rows: nothing to do
    # rows past cu[-1] count as the last text's
    assert text_of_rows(torch.tensor([0, 2, 4], device=q.device), 6).tolist() == [0, 0, 1, 1, 1, 1]


def test_empty_and_bad_shapes():
    q, k, v, seg, cu = packed_qkv([0, 0], H=2, Dh=16, dtype=torch.float32, seed=0)
    assert triton_packed_attention(q, k, v, seg, cu, 1).shape == (0, 2, 16)
    q, k, v, seg, cu = packed_qkv([3], H=1, Dh=24, dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="power of two"):
        triton_packed_attention(q, k, v, seg, cu, 3)
    with pytest.raises(ValueError, match="share shape"):
        triton_packed_attention(q, k[:, :, :16], v, seg, cu, 3)


# ---------------------------------------------------------------- GPU only: bf16 against flash attention
@pytest.mark.gpu
@pytest.mark.parametrize("longest", [40, 80, 130, 256])
def test_gpu_matches_flash_and_reruns_bit_identical(longest):
    from lsr.encode.backbone.varlen_body import flash_varlen_attention

    g = torch.Generator().manual_seed(longest)
    lengths = torch.randint(max(1, longest - 8), longest + 1, (300,), generator=g).sort(descending=True).values.tolist()
    lengths[5] = 1
    q, k, v, seg, cu = packed_qkv(lengths, H=12, Dh=64, dtype=torch.bfloat16, seed=longest, device="cuda")
    with torch.inference_mode():
        got = packed_attention(q, k, v, seg, cu, longest)
        again = packed_attention(q, k, v, seg, cu, longest)
        flash = flash_varlen_attention(q, k, v, cu, longest)
        ref = torch_varlen_attention(q.float(), k.float(), v.float(), cu, longest)
    assert torch.equal(got, again)
    err, flash_err = (got.float() - ref).abs(), (flash.float() - ref).abs()
    # the same arithmetic as flash attention up to summation order: errors of the same size
    assert err.max() <= 2 * flash_err.max() and err.mean() <= 1.25 * flash_err.mean(), (err.max(), flash_err.max())
