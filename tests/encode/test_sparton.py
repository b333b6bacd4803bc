"""Sparton head: Triton forward/backward vs the float64 torch twin.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest), so the shapes stay tiny but awkward:
odd B incl. 1, S not a multiple of the block, V not a multiple of the tile, fully masked rows,
padding and holes, with/without bias, fp32 and bf16, both backward modes. Outputs the launchers
allocate are poisoned (NaN / junk ints) so an unwritten element cannot pass.
"""

from __future__ import annotations

import functools
import os
import zlib

import pytest
import torch

from tests.conftest import DEV

pytest.importorskip("triton")

from lsr.encode.sparton import SpartonHead, sparton_head, torch_sparton_head
from lsr.encode.sparton import bwd as sparton_bwd
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd
from lsr.testing import max_abs_errors as errors
from lsr.testing import sparton_case

pytestmark = pytest.mark.skipif(DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs CUDA or TRITON_INTERPRET=1")


def grads_of(fn, hidden, weight, bias, mask, dy, dtype=None):
    """Run fn on leaf copies (optionally cast to dtype) and return (y, dH, dE, db)."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() if t is not None else None
              for t in (hidden, weight, bias)]
    y = fn(*leaves, mask)
    y.backward(dy.to(y.dtype))
    return [y.detach()] + [t.grad if t is not None else None for t in leaves]


case_on_dev = functools.partial(sparton_case, device=DEV)


# (B, S, V, D, bias, mask kind, non-contiguous): awkward on purpose, tiny for the interpreter
CASES = [
    (1, 1, 17, 16, False, "full", False),
    (3, 37, 300, 48, True, "padded", False),
    (2, 21, 129, 40, True, "holes", True),
]


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "det"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}S{}V{}D{}-{}{}".format(*c[:4], c[5], "-bias" if c[4] else ""))
@pytest.mark.slow
def test_forward_backward_vs_fp64(case, dtype, deterministic, poison):
    B, S, V, D, bias, kind, noncontig = case
    seed = zlib.crc32(repr((case, str(dtype), deterministic)).encode())
    hidden, weight, b, mask = case_on_dev(B, S, V, D, dtype, bias, kind, seed, noncontig)
    dy = torch.randn(B, V, generator=torch.Generator().manual_seed(seed + 1)).to(DEV)
    dy = dy.to(dtype).to(torch.float64)  # the same upstream values for every implementation

    ref = grads_of(torch_sparton_head, hidden, weight, b, mask, dy, torch.float64)
    got = grads_of(lambda *a: sparton_head(*a, backend="triton", deterministic=deterministic),
                   hidden, weight, b, mask, dy)
    assert got[0].dtype == dtype and got[0].shape == (B, V)
    assert got[1].dtype == dtype and got[2].dtype == dtype
    assert all(torch.isfinite(t).all() for t in got if t is not None)
    if b is not None:
        assert got[3].dtype == b.dtype and got[3].shape == (V,)
    err = errors(got, ref)
    if dtype == torch.float32:
        scale = [1.0 + r.abs().max().item() if r is not None else 1.0 for r in ref]
        assert all(e <= 2e-5 * s for e, s in zip(err, scale, strict=False)), err
    else:  # the kernels' accuracy rule: at most 2x the error of the same-precision torch head
        same = grads_of(lambda *a: torch_sparton_head(*a, upcast=False), hidden, weight, b, mask, dy)
        torch_err = errors(same, ref)
        assert all(e <= 2 * te + 1e-6 for e, te in zip(err, torch_err, strict=False)), (err, torch_err)
    empty = ~mask.bool().any(1)  # fully masked rows: y = 0 and dH = 0 there
    assert (got[0][empty] == 0).all() and (got[1][empty] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_argmax_is_a_valid_maximiser(dtype, poison):
    B, S, V, D = 3, 33, 70, 32
    hidden, weight, b, mask = case_on_dev(B, S, V, D, dtype, True, "holes", seed=7 + (dtype == torch.bfloat16))
    mask = mask.bool()
    y, y32, arg = triton_sparton_fwd(hidden, weight, b, mask, need_fp32=True)
    assert arg.dtype == torch.int32 and y32.dtype == torch.float32
    logits = (hidden.double() @ weight.double().t()).masked_fill(~mask[:, :, None], float("-inf"))
    rows = mask.any(1)
    a = arg.long()
    assert ((a >= 0) & (a < S)).all()
    assert mask.gather(1, a)[rows].all()  # an unmasked position
    at_arg = logits.gather(1, a[:, None, :]).squeeze(1)
    best = logits.amax(1)
    assert (best - at_arg)[rows].abs().max() <= 1e-5 * (1 + best[rows].abs().max())
    assert torch.equal(y32.to(dtype), y)


@pytest.mark.parametrize("blocks", [
    {"BLOCK_V": 32, "BLOCK_S": 16, "BLOCK_D": 16, "GROUP_B": 2, "USE_TMA": True},
    {"BLOCK_V": 64, "BLOCK_S": 32, "BLOCK_D": 32, "GROUP_B": 4, "FLATTEN": True},
], ids=["tma", "flatten"])
@pytest.mark.parametrize("need_argmax", [True, False], ids=["argmax", "max-only"])
def test_forward_variants(blocks, need_argmax, poison):
    """TMA loads (rows past a sequence's end come from the next one or zero fill) and flattened loops."""
    B, S, V, D = 3, 37, 100, 48
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.bfloat16, True, "holes", seed=17 + need_argmax)
    mask = mask.bool()
    y, y32, arg = triton_sparton_fwd(hidden, weight, b, mask, need_fp32=True, need_argmax=need_argmax, _blocks=blocks)
    ref = torch_sparton_head(hidden.double(), weight.double(), b.double(), mask)
    assert (y32.double() - ref).abs().max() <= 1e-5 * (1 + ref.abs().max())
    if need_argmax:
        logits = (hidden.double() @ weight.double().t()).masked_fill(~mask[:, :, None], float("-inf"))
        rows = mask.any(1)
        assert torch.equal(arg.long()[rows], logits.argmax(1)[rows])
    else:
        assert arg is None


@pytest.mark.parametrize("kinds", [(1, 2), (1,), (2,)], ids=["split", "no-holes-only", "holes-only"])
def test_forward_split_by_holes(kinds, poison):
    """Large problems run two launches: rows whose kept positions are 0..len-1 without reading the mask, the others
    (holes, left padding) with it; each launch must write exactly its own rows and the two together all of them."""
    B, S, V, D = 5, 37, 70, 16
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.float32, True, "holes", seed=31)
    mask = mask.bool()
    mask[1] = torch.arange(S, device=DEV) < 20  # right padding: no holes
    mask[2] = torch.arange(S, device=DEV) >= 5  # left padding: a hole at the start
    mask[3] = True
    mask[4] = (torch.arange(S, device=DEV) < 30) & (torch.arange(S, device=DEV) % 3 != 1)  # holes
    assert not mask[0].any()  # fully masked (no holes: its length is 0)
    blocks = {"BLOCK_V": 32, "BLOCK_S": 16, "BLOCK_D": 16, "GROUP_B": 2, "ROW_KINDS": kinds}
    y, y32, arg = triton_sparton_fwd(hidden, weight, b, mask, need_fp32=True, _blocks=blocks)
    ref = torch_sparton_head(hidden.double(), weight.double(), b.double(), mask)
    logits = (hidden.double() @ weight.double().t()).masked_fill(~mask[:, :, None], float("-inf"))
    plain = torch.tensor([True, True, False, True, False], device=DEV)  # kept positions are 0..len-1
    written = plain if kinds == (1,) else ~plain if kinds == (2,) else torch.ones_like(plain)
    assert (y32[written].double() - ref[written]).abs().max() <= 1e-5 * (1 + ref.abs().max())
    assert y32[~written].isnan().all()
    rows = written & mask.any(1)
    assert torch.equal(arg.long()[rows], logits.argmax(1)[rows])
    assert (arg[written & ~mask.any(1)] == 0).all()


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "det"])
def test_dh_row_groups_across_batch_rows(deterministic, poison):
    """dH's buckets are groups of 16 rows of the flattened [B·S]: with S = 23 groups straddle two batch rows and
    the last one is short; the (v, row-in-group) tags must route every entry to its own row."""
    B, S, V, D = 3, 23, 150, 32
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.float32, True, "padded", seed=23 + deterministic)
    dy = torch.randn(B, V, device=DEV, dtype=torch.float64)
    ref = grads_of(torch_sparton_head, hidden, weight, b, mask, dy, torch.float64)
    _, y32, arg = triton_sparton_fwd(hidden, weight, b, mask.bool(), need_fp32=True)
    assert sparton_bwd._DH_ROWS == 16 and (B * S) % 16 != 0
    dh, dw, db = sparton_bwd.triton_sparton_bwd(dy.float(), hidden, weight, y32, arg, deterministic=deterministic)
    err = errors([dh, dw, db], ref[1:])
    assert all(e <= 2e-5 * (1 + r.abs().max().item()) for e, r in zip(err, ref[1:], strict=False)), err
    # without dH (hidden needs no grad) there are no buckets: dE/db only
    none, dw2, db2 = sparton_bwd.triton_sparton_bwd(dy.float(), hidden, weight, y32, arg, need_dh=False,
                                                    deterministic=deterministic)
    assert none is None and torch.equal(dw2, dw) and torch.equal(db2, db)


def test_ties_pick_the_first_position(poison):
    B, S, V, D = 2, 40, 50, 16
    hidden = torch.randn(B, S, D, device=DEV)
    hidden[:, 25:] = hidden[:, :15]  # exact duplicates: every max is tied between s and s + 25 (or unique)
    mask = torch.ones(B, S, dtype=torch.bool, device=DEV)
    _, _, arg = triton_sparton_fwd(hidden, torch.randn(V, D, device=DEV), None, mask)
    assert ((arg >= 0) & (arg < 25)).all()  # the max is unique in 15..24 or tied: never the later duplicate


def test_negative_logits_route_no_gradient(poison):
    """All logits < 0: y = 0 everywhere and every gradient is exactly 0 (relu gate), argmax still valid."""
    B, S, V, D = 2, 9, 40, 16
    hidden = torch.rand(B, S, D, device=DEV)
    weight = -torch.rand(V, D, device=DEV)
    y, _, arg = triton_sparton_fwd(hidden, weight, None, torch.ones(B, S, dtype=torch.bool, device=DEV), True)
    assert (y == 0).all() and ((arg >= 0) & (arg < S)).all()
    expect = (hidden.double() @ weight.double().t()).argmax(1)
    assert torch.equal(arg.long(), expect)
    got = grads_of(lambda *a: sparton_head(*a, backend="triton"), hidden, weight, None,
                   torch.ones(B, S, dtype=torch.bool, device=DEV), torch.randn(B, V, device=DEV))
    assert (got[1] == 0).all() and (got[2] == 0).all()


def test_sparse_gradient_tiles_match_fp64(poison):
    """A trained head's output: most vocabulary tiles get no gradient in any row (the dE kernel skips them),
    one tile holds a single live entry, and rows differ in which entries are live."""
    B, S, V, D = 3, 11, 200, 32
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.float32, True, "padded", seed=5)
    b = b.clone()
    b[:] = -100.0  # dead: no logit reaches 0
    b[[3, 4, 40, 131, 199]] = 0.0  # live entries in three of the interpreter's 16-wide tiles (one alone)
    dy = torch.randn(B, V, generator=torch.Generator().manual_seed(3)).to(DEV).double()
    dy[1, 40] = 0.0  # a live entry without upstream gradient in one row only
    ref = grads_of(torch_sparton_head, hidden, weight, b, mask, dy, torch.float64)
    got = grads_of(lambda *a: sparton_head(*a, backend="triton"), hidden, weight, b, mask, dy)
    live = (ref[0] > 0).any(0)
    assert 0 < int(live.sum()) <= 5 and (got[2][~live] == 0).all()
    scale = [1.0 + r.abs().max().item() for r in ref]
    assert all(e <= 2e-5 * s for e, s in zip(errors(got, ref), scale, strict=False))


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "sparse"])
def test_weight_grads_tile_width_follows_density(dense, poison):
    """dE / db come from the wide-tile launch for a dense gradient and from the narrow one for a sparse one (the
    choice is a flag on the device); the launch whose width was not picked writes nothing."""
    B, S, V, D = 3, 7, 70, 32
    gen = torch.Generator().manual_seed(31 + dense)
    hidden = torch.randn(B, S, D, generator=gen).to(DEV)
    arg = torch.randint(0, S, (B, V), generator=gen, dtype=torch.int32).to(DEV)
    g = torch.randn(B, V, generator=gen).to(DEV)
    if not dense:
        g[:, 10:] = 0.0  # one live narrow tile: one live wide tile of three
    (nv, _, _), (wv, _, _) = sparton_bwd._DE_TILES
    wide = sparton_bwd._wide_flag(sparton_bwd._pairs_live(sparton_bwd._live_tiles(g, nv), wv // nv))
    assert wide.tolist() == [int(dense)]
    dw, db = torch.empty(V, D, device=DEV), torch.empty(V, device=DEV)
    sparton_bwd._weight_grads(hidden, g, arg, sparton_bwd._live_tiles(g, nv), dw, db, D)
    ref = sum(g[b].double()[:, None] * hidden[b, arg[b].long()].double() for b in range(B))
    assert (dw.double() - ref).abs().max() <= 1e-5 * (1 + ref.abs().max())
    assert torch.allclose(db.double(), g.double().sum(0), atol=1e-5)
    for flag, tiles in enumerate(sparton_bwd._DE_TILES):  # a launch whose WIDE is not the flag leaves NaN alone
        untouched = torch.full((V, D), float("nan"), device=DEV)
        block_v, block_d, warps = tiles
        sparton_bwd._bwd_de_kernel[(-(-V // block_v), -(-D // block_d))](
            hidden, g, arg, torch.ones(-(-V // block_v), dtype=torch.int8, device=DEV),
            torch.tensor([1 - flag], dtype=torch.int8, device=DEV), untouched, g, B, V, D, S * D, D, D,
            HAS_DE=True, HAS_DB=False, WIDE=flag, BLOCK_V=block_v, BLOCK_D=block_d, num_warps=warps)
        assert untouched.isnan().all()


def test_prep_kernel_gradient_flags_and_counts(poison):
    """The prep kernel: g = dY·exp(−Y)·[Y > 0], the dE tiles' live flags (torch twin: _live_tiles) and the dH row
    groups' bucket sizes, with dead vocabulary tiles, an entry without upstream gradient and a short last tile."""
    B, S, V = 3, 7, 70
    gen = torch.Generator().manual_seed(41)
    y32 = torch.rand(B, V, generator=gen).to(DEV)
    nv, rows = sparton_bwd._DE_TILES[0][0], sparton_bwd._DH_ROWS
    y32[:, nv:2 * nv] = 0.0  # relu-dead entries (a whole tile): no gradient, the tile stays dead
    dy = torch.randn(B, V, generator=gen).to(DEV)
    dy[1, 5] = 0.0
    arg = torch.randint(0, S, (B, V), generator=gen, dtype=torch.int32).to(DEV)
    g = torch.empty(B, V, device=DEV)
    counts = torch.zeros(-(-B * S // rows), dtype=torch.int32, device=DEV)
    live = torch.zeros(-(-V // nv), dtype=torch.int32, device=DEV)
    sparton_bwd._bwd_prep_kernel[(B, -(-V // 1024))](dy, y32, arg, g, counts, live, S, V, dy.stride(0), COUNT=True,
                                                      LIVE=True, ROWS=rows, TILE=nv, BLOCK=1024)
    ref = torch.where(y32 > 0, dy * torch.exp(-y32), 0.0)
    assert torch.equal(g == 0, ref == 0) and torch.allclose(g, ref, rtol=1e-5, atol=0)  # exp: a few ulp apart
    twin = sparton_bwd._live_tiles(g, nv)
    assert torch.equal(live.to(torch.int8), twin) and 0 < int(twin.sum()) < twin.numel()
    group = (torch.arange(B, device=DEV)[:, None] * S + arg.long()) // rows
    assert torch.equal(counts.long(), torch.bincount(group[g != 0], minlength=counts.numel()))


@pytest.mark.slow
def test_deterministic_mode_is_bit_identical(poison):
    # few positions and many vocab entries: every dH row sums many terms, so order would show
    B, S, V, D = 3, 5, 260, 32
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.bfloat16, True, "padded", seed=11)
    dy = torch.randn(B, V, device=DEV)
    runs = [grads_of(lambda *a: sparton_head(*a, backend="triton", deterministic=True), hidden, weight, b, mask, dy)
            for _ in range(2)]
    for x, y in zip(*runs, strict=False):
        assert torch.equal(x, y)


def test_autocast_and_module():
    B, S, V, D = 2, 19, 90, 32
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.float32, True, "padded", seed=5)
    head = SpartonHead(V, D, backend="triton", device=DEV)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(b)
    h = hidden.clone().requires_grad_()
    with torch.autocast(DEV, dtype=torch.bfloat16):
        y = head(h, mask)
        y_ref = torch_sparton_head(hidden.bfloat16(), weight.bfloat16(), b, mask)
    assert y.dtype == torch.bfloat16
    assert (y.float() - y_ref.float()).abs().max() <= 0.05
    y.float().sum().backward()
    assert head.weight.grad.dtype == torch.float32 and h.grad.dtype == torch.float32
    assert torch.isfinite(head.weight.grad).all() and head.bias.grad.abs().sum() > 0
    linear = torch.nn.Linear(D, V, device=DEV)
    shared = SpartonHead.from_linear(linear, backend="torch")
    assert shared.weight is linear.weight and shared.bias is linear.bias


def test_torch_twin_and_backend_choice():
    h = torch.randn(2, 4, 8)
    w = torch.randn(5, 8)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    y = torch_sparton_head(h, w, None, mask)
    assert (y[1] == 0).all()
    expect = torch.log1p(torch.relu((h[0, :2] @ w.t()).amax(0)))
    assert torch.allclose(y[0], expect)
    assert torch.equal(sparton_head(h, w, None, mask, backend="torch"), y)
    # CPU inference: the tiled head (sparton.cpu), equal to the twin up to the matmul's summation order
    assert torch.allclose(sparton_head(h, w, None, mask, backend="auto"), y, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError):
        sparton_head(h, w, None, mask, backend="cuda")
    with pytest.raises(ValueError):
        sparton_head(h, w[:, :7], None, mask)


# ---------------------------------------------------------------- GPU only: realistic bf16 shapes
@pytest.mark.gpu
@pytest.mark.parametrize("V", [30522, 150000])  # 150000 x 768 bf16 = 230 MB of E: far more than L2
@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "det"])
def test_gpu_bf16_realistic_within_2x_torch(deterministic, V):
    B, S, D = 6, 200, 768
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.bfloat16, True, "padded", seed=3)
    hidden = hidden * 2  # spread the logits so many max positions compete
    dy = torch.randn(B, V, device=DEV).bfloat16().double()
    ref = grads_of(torch_sparton_head, hidden, weight, b, mask, dy, torch.float64)
    got = grads_of(lambda *a: sparton_head(*a, deterministic=deterministic), hidden, weight, b, mask, dy)
    same = grads_of(lambda *a: torch_sparton_head(*a, upcast=False), hidden, weight, b, mask, dy)

    def rel(x, r):
        return ((x.double() - r).norm() / r.norm().clamp_min(1e-30)).item()

    assert errors(got[:1], ref[:1])[0] <= 2 * errors(same[:1], ref[:1])[0]
    for i in range(1, 4):
        assert rel(got[i], ref[i]) <= 2 * rel(same[i], ref[i]) + 1e-7, (i, rel(got[i], ref[i]), rel(same[i], ref[i]))


@pytest.mark.gpu
def test_gpu_large_vocab_weight_grad_only():
    """Frozen hidden states (no dH, so no buckets) with a 400,000-row vocabulary."""
    B, S, V, D = 2, 16, 400000, 256
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.bfloat16, True, "padded", seed=4)
    w = weight.clone().requires_grad_()
    dy = torch.randn(B, V, device=DEV)
    sparton_head(hidden, w, b, mask).backward(dy.bfloat16())
    wd = weight.double().requires_grad_()
    torch_sparton_head(hidden.double(), wd, b.double(), mask).backward(dy.bfloat16().double())
    assert ((w.grad.double() - wd.grad).norm() / wd.grad.norm()) < 1e-2


@pytest.mark.gpu
def test_gpu_deterministic_bitwise_and_fast_close():
    B, S, V, D = 16, 64, 30522, 768  # few positions: long dH buckets, where atomic order would show
    hidden, weight, b, mask = case_on_dev(B, S, V, D, torch.bfloat16, True, "padded", seed=9)
    dy = torch.randn(B, V, device=DEV)
    det = [grads_of(lambda *a: sparton_head(*a, deterministic=True), hidden, weight, b, mask, dy) for _ in range(3)]
    for run in det[1:]:
        for x, y in zip(det[0], run, strict=False):
            assert torch.equal(x, y)
    fast = grads_of(lambda *a: sparton_head(*a, deterministic=False), hidden, weight, b, mask, dy)
    for x, y in zip(det[0], fast, strict=False):
        assert torch.allclose(x.float(), y.float(), rtol=2e-2, atol=1e-2)
