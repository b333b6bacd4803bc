"""Fused residual add + LayerNorm (lsr.encode.backbone.add_layer_norm): Triton kernel vs its torch twin.

On CPU the kernel runs under TRITON_INTERPRET=1 (conftest). Shapes are awkward (D not a power of two,
rows not a multiple of the row block); outputs are poisoned so an unwritten element cannot pass."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from lsr.encode.backbone.add_layer_norm import add_layer_norm, torch_add_layer_norm, triton_add_layer_norm
from tests.conftest import DEV

pytestmark = pytest.mark.skipif(DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs CUDA or TRITON_INTERPRET=1")


def case(shape: tuple[int, ...], dtype: torch.dtype, affine: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    D = shape[-1]
    x = (torch.randn(*shape, generator=g) * 3 + 1).to(dtype).to(DEV)
    r = torch.randn(*shape, generator=g).to(dtype).to(DEV)
    w = (torch.randn(D, generator=g) + 1).to(dtype).to(DEV) if affine else None
    b = torch.randn(D, generator=g).to(dtype).to(DEV) if affine else None
    return x, r, w, b


def ulps(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference in units of the dtype's spacing at want's magnitude."""
    spacing = torch.finfo(want.dtype).eps * want.float().abs().clamp_min(1.0)
    return ((got.float() - want.float()).abs() / spacing).max().item()


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(5, 48), (33, 100), (2, 7, 40), (1, 1)], ids=["5x48", "33x100", "2x7x40", "1x1"])
@pytest.mark.usefixtures("poison")
def test_matches_twin_and_fp64(shape, dtype, affine):
    x, r, w, b = case(shape, dtype, affine, seed=sum(shape) + affine)
    y = triton_add_layer_norm(x, r, w, b, 1e-12)
    twin = torch_add_layer_norm(x, r, w, b, 1e-12)
    assert y.shape == x.shape and y.dtype == dtype and torch.isfinite(y).all()
    # the reference rounds the sum to the dtype, as both implementations do, then works in float64
    s = (x + r).double()
    ref = F.layer_norm(s, (shape[-1],), None if w is None else w.double(), None if b is None else b.double(), 1e-12)
    err, twin_err = (y.double() - ref).abs().max().item(), (twin.double() - ref).abs().max().item()
    if dtype == torch.float32:
        assert err <= 1e-5, err
    else:
        assert err <= 2 * twin_err + 1e-6, (err, twin_err)
        assert ulps(y, twin) <= 1.0  # at most a neighbouring bf16 value where the fp32 value sits on a tie
    if shape[-1] > 1:
        assert y.float().std() > 0.1  # not vacuous


@pytest.mark.usefixtures("poison")
def test_strided_rows_and_entry_point():
    x, r, w, b = case((9, 64), torch.float32, True, seed=3)
    wide = torch.randn(9, 80, device=DEV)
    wide[:, :64] = x  # rows at stride 80
    y = triton_add_layer_norm(wide[:, :64], r, w, b, 1e-5)
    torch.testing.assert_close(y, torch_add_layer_norm(x, r, w, b, 1e-5), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(add_layer_norm(x, r, w, b, 1e-5, backend="triton"), y, rtol=0, atol=0)
    assert torch.equal(add_layer_norm(x, r, w, b, 1e-5, backend="torch"), torch_add_layer_norm(x, r, w, b, 1e-5))
    assert triton_add_layer_norm(x[:0], r[:0], w, b, 1e-5).shape == (0, 64)
    # autograd asks for the twin (the kernel has no backward)
    xg = x.clone().requires_grad_()
    add_layer_norm(xg, r, w, b, 1e-5, backend="triton").sum().backward()
    assert xg.grad is not None


def test_errors():
    x = torch.randn(3, 8, device=DEV)
    with pytest.raises(ValueError, match="shape and dtype"):
        triton_add_layer_norm(x, x[:, :4], None, None, 1e-5)
    with pytest.raises(ValueError, match="shape and dtype"):
        triton_add_layer_norm(x, x.double(), None, None, 1e-5)
    with pytest.raises(ValueError, match="weight"):
        triton_add_layer_norm(x, x, torch.ones(4, device=DEV), None, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_bert_rows(dtype):
    x, r, w, b = case((20_000, 768), dtype, True, seed=11)
    runs = [triton_add_layer_norm(x, r, w, b, 1e-12) for _ in range(2)]
    twin = torch_add_layer_norm(x, r, w, b, 1e-12)
    assert torch.equal(runs[0], runs[1])
    assert ulps(runs[0], twin) <= 1.0
    assert (runs[0] != twin).float().mean().item() < 1e-3
