"""Packed (varlen) Sparton head: Triton kernel vs the float64 torch twin and vs the padded kernel.

On CPU the kernel runs under TRITON_INTERPRET=1 (set by conftest) with small pinned tiles (16 packed
tokens), so the token layouts below put several texts in one tile, a text across 2-4 tiles, texts of
exactly the tile size (aligned and not), length-1 texts, fully masked rows (also between texts of one
tile), holes and left padding. Shapes are awkward (V, D not multiples of the tiles). Outputs the
launcher allocates are poisoned (``poison`` from test_sparton) so an unwritten element cannot pass.
"""

from __future__ import annotations

import functools
import os
import zlib

import pytest
import torch

pytest.importorskip("triton")

from lsr.encode.sparton import (
    DEFAULT_DISPATCH,
    packed_tokens_sparton_head,
    sparton_head,
    torch_packed_tokens_head,
    torch_sparton_head,
)
from lsr.encode.sparton.fwd_packed import packing_pays, triton_packed_sparton_fwd, triton_packed_tokens_fwd
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd
from lsr.testing import max_abs_errors as errors
from lsr.testing import sparton_case
from tests.conftest import DEV

make_case = functools.partial(sparton_case, device=DEV)

pytestmark = pytest.mark.skipif(DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs CUDA or TRITON_INTERPRET=1")
TILE = {"BLOCK_V": 32, "BLOCK_T": 16, "BLOCK_D": 16, "GROUP_T": 2}  # 16-token tiles make the layouts below
V, D = 70, 40  # neither a multiple of BLOCK_V nor of BLOCK_D


def layout_mask(kind: str, g: torch.Generator) -> torch.Tensor:
    """bool [B, S] masks named by what they put in the 16-token tiles (tokens are packed row-major)."""
    def right(S: int, lengths: list[int]) -> torch.Tensor:
        return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]

    if kind == "several-per-tile":  # 3+1+5+2 in tile 0, the 9 crosses into tile 1, a 0 between texts
        return right(9, [3, 1, 5, 2, 9, 0, 4, 1])
    if kind == "exact-tile":  # two aligned 16-token texts, then a 1 shifts the next 16 across a boundary
        return right(16, [16, 16, 1, 16, 0])
    if kind == "long-span":  # a 53-token text over 4 tiles (3 boundaries), a masked row, a 40 over 3
        return right(53, [2, 53, 0, 40, 1])
    if kind == "holes-left":  # left padding and holes in the middle; row 0 fully masked, row 5 full
        S = 23
        lengths = torch.randint(1, S + 1, (6,), generator=g)
        mask = torch.arange(S)[None, :] >= S - lengths[:, None]
        mask &= torch.rand(6, S, generator=g) > 0.3
        mask[0], mask[5] = False, True
        return mask
    if kind == "partial-tile":  # 5 tokens, 11 empty slots in the only tile, which holds text 0
        return right(4, [2, 0, 3])
    if kind == "all-masked":  # no token at all: no tile, every row 0
        return torch.zeros(3, 7, dtype=torch.bool)
    raise ValueError(kind)


LAYOUTS = ["several-per-tile", "exact-tile", "long-span", "holes-left", "partial-tile", "all-masked"]


def case(kind: str, dtype: torch.dtype, bias: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    mask = layout_mask(kind, g)
    B, S = mask.shape
    hidden, weight, b, _ = make_case(B, S, V, D, dtype, bias, "full", seed)
    return hidden, weight, b, mask.to(DEV)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.usefixtures("poison")
def test_packed_vs_fp64_and_padded(kind, dtype, bias):
    hidden, weight, b, mask = case(kind, dtype, bias, zlib.crc32(repr((kind, str(dtype), bias)).encode()))
    y = triton_packed_sparton_fwd(hidden, weight, b, mask, _blocks=TILE)
    assert y.dtype == dtype and y.shape == (mask.shape[0], V) and torch.isfinite(y).all()

    ref = torch_sparton_head(hidden.double(), weight.double(), b.double() if b is not None else None, mask)
    err = errors([y], [ref])[0]
    if dtype == torch.float32:
        assert err <= 2e-5 * (1 + ref.abs().max().item()), err
    else:  # the kernels' accuracy rule: at most 2x the error of the same-precision torch head
        torch_err = errors([torch_sparton_head(hidden, weight, b, mask, upcast=False)], [ref])[0]
        assert err <= 2 * torch_err + 1e-6, (err, torch_err)
    empty = ~mask.any(1)
    assert (y[empty] == 0).all()
    if mask.any():
        assert (y[~empty] > 0).any()  # not vacuous: some terms are active

    padded = triton_sparton_fwd(hidden, weight, b, mask, need_argmax=False)[0]
    if dtype == torch.float32:  # same fp32 sums, maybe in another order
        torch.testing.assert_close(y, padded, rtol=1e-6, atol=1e-6)
    else:  # fp32 results within a few ulps round to the same bf16 or to a neighbour
        torch.testing.assert_close(y.float(), padded.float(), rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("blocks", [
    {"BLOCK_V": 64, "BLOCK_T": 32, "BLOCK_D": 32, "GROUP_T": 1},
    {"BLOCK_V": 16, "BLOCK_T": 64, "BLOCK_D": 16, "GROUP_T": 3},  # one tile holds every text
], ids=["t32-v64", "t64-v16"])
@pytest.mark.usefixtures("poison")
def test_tile_shapes_and_grouping_agree(blocks):
    g = torch.Generator().manual_seed(31)
    lengths = torch.randint(0, 20, (9,), generator=g)
    mask = (torch.arange(19)[None, :] < lengths[:, None]).to(DEV)
    hidden, weight, b, _ = make_case(9, 19, V, D, torch.float32, True, "full", seed=32)
    ref = torch_sparton_head(hidden.double(), weight.double(), b.double(), mask)
    for blk in (TILE, blocks):
        y = triton_packed_sparton_fwd(hidden, weight, b, mask, _blocks=blk)
        assert (y.double() - ref).abs().max() <= 2e-5 * (1 + ref.abs().max())


@pytest.mark.usefixtures("poison")
def test_bit_identical_runs():
    """Texts split across tiles meet in the atomic max: the result must not depend on the tile order."""
    g = torch.Generator().manual_seed(41)
    mask = (torch.arange(37)[None, :] < torch.randint(1, 38, (7,), generator=g)[:, None]).to(DEV)
    hidden, weight, b, _ = make_case(7, 37, V, D, torch.bfloat16, True, "full", seed=42)
    runs = [triton_packed_sparton_fwd(hidden, weight, b, mask, _blocks=TILE) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.usefixtures("poison")
def test_masks_bias_dtype_and_entry_point():
    B, S = 4, 13
    hidden, weight, b, mask = make_case(B, S, V, D, torch.float32, True, "holes", seed=51)  # int64 mask, row 0 empty
    ref = torch_sparton_head(hidden.double(), weight.double(), b.half().double(), mask)
    with torch.no_grad():
        y = sparton_head(hidden, weight, b.half(), mask, variant="packed")  # a half bias is upcast
        assert (y.double() - ref).abs().max() <= 2e-5 * (1 + ref.abs().max())
        full = sparton_head(hidden, weight, b, None, variant="packed")  # None: every position counts
        torch.testing.assert_close(full, torch_sparton_head(hidden, weight, b, None), rtol=1e-5, atol=1e-5)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            auto = sparton_head(hidden, weight, b, mask, backend="triton", variant="packed")
            padded = sparton_head(hidden, weight, b, mask, backend="triton")
        assert auto.dtype == torch.bfloat16
        torch.testing.assert_close(auto.float(), padded.float(), rtol=2**-7, atol=1e-6)


def test_errors():
    h, w = torch.randn(2, 5, 16, device=DEV), torch.randn(9, 16, device=DEV)
    mask = torch.ones(2, 5, dtype=torch.bool, device=DEV)
    with pytest.raises(RuntimeError, match="inference-only"):  # grad mode + a leaf that wants a gradient
        triton_packed_sparton_fwd(h.requires_grad_(), w, None, mask)
    with pytest.raises(ValueError, match="inference-only"):
        sparton_head(h, w, None, mask, variant="packed")
    with pytest.raises(ValueError, match="backend='torch'"):
        sparton_head(h.detach(), w, None, mask, backend="torch", variant="packed")
    h = h.detach()
    with pytest.raises(TypeError, match="dtype"):
        triton_packed_sparton_fwd(h, w.double(), None, mask)
    with pytest.raises(ValueError, match="mask"):
        triton_packed_sparton_fwd(h, w, None, mask[:, :4])
    with pytest.raises(ValueError, match="bias"):
        triton_packed_sparton_fwd(h, w, torch.zeros(8, device=DEV), mask)
    with pytest.raises(ValueError, match="backend"):
        sparton_head(h, w, None, mask, backend="cuda", variant="packed")
    assert triton_packed_sparton_fwd(h[:0], w, None, mask[:0]).shape == (0, 9)


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.usefixtures("poison")
def test_tokens_entry_equals_masked_entry(kind):
    """Already-packed tokens + their text ids give the masked entry's result bit for bit (same tiles),
    and the segmented-max twin gives the padded twin's."""
    hidden, weight, b, mask = case(kind, torch.bfloat16, True, seed=zlib.crc32(kind.encode()))
    B, S, _ = hidden.shape
    rows = torch.nonzero(mask.reshape(-1)).squeeze(1)
    tokens, seg = hidden.reshape(B * S, D)[rows], (rows // S).to(torch.int32)
    y = triton_packed_tokens_fwd(tokens, seg, B, weight, b, _blocks=TILE)
    assert torch.equal(y, triton_packed_sparton_fwd(hidden, weight, b, mask, _blocks=TILE))
    f64 = hidden.double(), weight.double(), b.double()
    twin = torch_packed_tokens_head(f64[0].reshape(B * S, D)[rows], seg, B, f64[1], f64[2])
    torch.testing.assert_close(twin, torch_sparton_head(*f64, mask), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        assert torch.equal(packed_tokens_sparton_head(tokens, seg, B, weight, b, backend="torch"),
                           torch_packed_tokens_head(tokens, seg, B, weight, b))


def test_tokens_entry_errors():
    t, w = torch.randn(6, 16, device=DEV), torch.randn(9, 16, device=DEV)
    seg = torch.tensor([0, 0, 1, 1, 1, 2], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="segments"):
        triton_packed_tokens_fwd(t, seg[:5], 3, w, None)
    with pytest.raises(ValueError, match="tokens"):
        triton_packed_tokens_fwd(t[:, :8], seg, 3, w, None)
    with pytest.raises(ValueError, match="bias"):
        triton_packed_tokens_fwd(t, seg, 3, w, torch.zeros(8, device=DEV))
    with pytest.raises(RuntimeError, match="inference-only"):
        packed_tokens_sparton_head(t.requires_grad_(), seg, 3, w, None, backend="torch")
    t = t.detach()
    assert triton_packed_tokens_fwd(t[:0], seg[:0], 2, w, None).eq(0).all()  # no tokens: every text 0
    assert triton_packed_tokens_fwd(t, seg, 3, w, None).shape == (3, 9)


def test_packing_pays_below_80_percent_of_the_padded_tiles():
    assert [w for w in (1, 64, 102, 103, 128, 129, 204, 205, 256, 300) if packing_pays(w)] == [1, 64, 102, 129, 204, 300]
    assert not packing_pays(0)


@pytest.mark.slow
def test_encoder_packed_matches_padded(tmp_path, data_dir):
    """SpladeEncoder(packed=True) routes inference through the packed head and gives the padded vectors."""
    pytest.importorskip("transformers")
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.testing import SAMPLE_TEXTS as TEXTS
    from lsr.testing import save_tiny_mlm

    path = save_tiny_mlm("roberta", tmp_path / "roberta", data_dir)  # V=500, D=32: fast under the interpreter
    out = {}
    for packed in (False, True):  # one batch of 5 texts of 2..~40 tokens: several texts per tile
        enc = SpladeEncoder.from_pretrained(path, device=DEV, dtype=torch.float32, backend="triton",
                                            batch_size=8, packed=packed)
        assert enc.packed is packed
        before = DEFAULT_DISPATCH.runs["packed"]
        out[packed] = enc.encode_document(TEXTS)
        # the padded run never plans the packed head, the packed run does
        assert (DEFAULT_DISPATCH.runs["packed"] > before) is packed
    assert out[True].nnz > 0 and out[True].ids == out[False].ids
    torch.testing.assert_close(out[True].to_dense(), out[False].to_dense(), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- GPU only: realistic bf16 shape
@pytest.mark.gpu
def test_gpu_packed_vs_padded_bf16_realistic():
    B, S, D_, V_ = 64, 128, 768, 30522
    g = torch.Generator().manual_seed(61)
    lengths = torch.randint(8, S + 1, (B,), generator=g)
    lengths[:3] = torch.tensor([128, 1, 0])  # a full row, a single token, a fully masked row
    mask = (torch.arange(S)[None, :] < lengths[:, None]).to(DEV)
    hidden, weight, b, _ = make_case(B, S, V_, D_, torch.bfloat16, True, "full", seed=62)
    hidden = hidden * 2  # spread the logits so many positions compete for the max
    with torch.inference_mode():
        runs = [triton_packed_sparton_fwd(hidden, weight, b, mask) for _ in range(3)]  # autotuned path
        padded = triton_sparton_fwd(hidden, weight, b, mask, need_argmax=False)[0]
        pinned = triton_packed_sparton_fwd(hidden, weight, b, mask, _blocks=TILE)
        ref = torch_sparton_head(hidden.double(), weight.double(), b.double(), mask)
        same = torch_sparton_head(hidden, weight, b, mask, upcast=False)
    y = runs[0]
    assert y.dtype == torch.bfloat16 and (y[2] == 0).all() and (y > 0).sum() > B
    for run in runs[1:]:
        assert torch.equal(run, y)  # atomics in any order: bit-identical
    torch.testing.assert_close(y.float(), padded.float(), rtol=2**-7, atol=1e-6)
    torch.testing.assert_close(pinned.float(), padded.float(), rtol=2**-7, atol=1e-6)
    assert errors([y], [ref])[0] <= 2 * errors([same], [ref])[0]
    rows = torch.nonzero(mask.reshape(-1)).squeeze(1)
    with torch.inference_mode():  # the tokens entry on the same packed rows: the same tiles, the same bits
        tokens = triton_packed_tokens_fwd(hidden.reshape(B * S, D_)[rows], (rows // S).to(torch.int32), B, weight, b)
    assert torch.equal(tokens, y)
