"""Fused MaxSim: Triton forward/backward vs the torch twin vs float64.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest), so shapes are tiny but awkward: odd Lq
and Ld, query chunks (Lq > BLOCK_Q), an embedding width that is not a power of two, padding and holes in
both masks, empty documents, candidate -1, repeated candidates, all pairs. Outputs the launchers allocate
are poisoned (NaN / junk ints) so an unwritten element cannot pass.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from tests.conftest import DEV

pytest.importorskip("triton")

from lsr.rerank.kernels.maxsim import maxsim, torch_maxsim, triton_maxsim_fwd

pytestmark = pytest.mark.skipif(DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs CUDA or TRITON_INTERPRET=1")


def maxsim_case(nq: int, lq: int, nd: int, ld: int, dim: int, n_cand: int | None, dtype: torch.dtype, seed: int,
                device: str = DEV):
    """Q, D (unit rows, like ColBERT), masks with padding + holes (doc 1 empty), candidates with -1 and repeats."""
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(nq, lq, dim, generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(nd, ld, dim, generator=g), dim=-1)
    q_mask = torch.arange(lq)[None, :] < torch.randint(1, lq + 1, (nq,), generator=g)[:, None]
    d_mask = (torch.arange(ld)[None, :] < torch.randint(1, ld + 1, (nd,), generator=g)[:, None])
    d_mask &= torch.rand(nd, ld, generator=g) > 0.2
    if nd > 1:
        d_mask[1] = False
    cand = None
    if n_cand is not None:
        cand = torch.randint(0, nd, (nq, n_cand), generator=g)
        cand[0, -1] = -1
        cand[-1, 0] = cand[-1, -1]  # a document twice in one list
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return q.to(dtype).to(device), d.to(dtype).to(device), to(q_mask), to(d_mask), to(cand)


def run(fn, q, d, qm, dm, cand, grad, dtype=None):
    """(scores, dQ, dD) of fn on leaf copies (optionally cast)."""
    ql, dl = (t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, d))
    s = fn(ql, dl, qm, dm, cand)
    s.backward(grad.to(s.dtype))
    return s.detach(), ql.grad, dl.grad


# (Nq, Lq, Nd, Ld, dim, candidates per query or None = all pairs)
CASES = [
    (1, 1, 2, 1, 16, 2),
    (3, 37, 6, 21, 40, 4),
    (2, 5, 5, 19, 24, None),
]


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "det"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "Nq{}Lq{}Nd{}Ld{}d{}-C{}".format(*c))
def test_forward_backward_vs_fp64(case, dtype, deterministic, poison):
    seed = zlib.crc32(repr((case, str(dtype), deterministic)).encode())
    q, d, qm, dm, cand = maxsim_case(*case, dtype, seed)
    shape = (case[0], case[5] if case[5] is not None else case[2])
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1)).to(DEV)

    def triton_fn(*a):
        return maxsim(*a, backend="triton", deterministic=deterministic)

    got = run(triton_fn, q, d, qm, dm, cand, grad)
    ref = run(torch_maxsim, q, d, qm, dm, cand, grad.double(), torch.float64)  # the same rounded inputs
    twin = run(torch_maxsim, q, d, qm, dm, cand, grad, torch.float32)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == dtype
    assert torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all() and torch.isfinite(got[2]).all()
    # scores: fp32 accumulation of exact products (bf16·bf16 is exact in fp32); gradients: one rounding
    # to the input dtype of an fp32 sum
    grad_tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name, g, r, t, tol in zip(("scores", "dQ", "dD"), got, ref, twin, (1e-5, grad_tol, grad_tol)):
        scale = max(1.0, r.abs().max().item())
        assert (g.double() - r).abs().max().item() <= tol * scale, name
        assert (t.double() - r).abs().max().item() <= 1e-5 * scale, name + " (twin)"
    if cand is not None:  # candidate -1 scores 0 and the empty document 1 scores 0
        assert got[0][0, -1] == 0
        assert (got[0][cand == 1] == 0).all()
        assert (got[2][1] == 0).all()


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "det"])
def test_backward_modes_agree_and_deterministic_is_reproducible(deterministic):
    q, d, qm, dm, cand = maxsim_case(4, 9, 3, 17, 16, 6, torch.float32, seed=7)  # many pairs per document
    grad = torch.randn(4, 6, generator=torch.Generator().manual_seed(8)).to(DEV)

    def fn(*a):
        return maxsim(*a, backend="triton", deterministic=deterministic)

    first, second = run(fn, q, d, qm, dm, cand, grad), run(fn, q, d, qm, dm, cand, grad)
    ref = run(torch_maxsim, q, d, qm, dm, cand, grad.double(), torch.float64)
    assert torch.allclose(first[2].double(), ref[2], atol=1e-5)
    if deterministic:
        assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])


def test_argmax_ties_masks_and_lengths(poison):
    """Ties go to the first position; int lengths mean the same as the bool mask; padding never wins."""
    q = torch.ones(1, 3, 16, device=DEV)
    d = torch.ones(2, 40, 16, device=DEV)
    d[0, 3:] = 5.0  # larger, but padding
    d[1, 0] = -1.0  # document 1: positions 1..39 tie, across several document tiles
    lengths = torch.tensor([3, 40], device=DEV)
    scores, arg = triton_maxsim_fwd(q, d, torch.ones(1, 3, dtype=torch.bool, device=DEV),
                                    torch.arange(40, device=DEV)[None, :] < lengths[:, None], None, need_argmax=True)
    assert scores.tolist() == [[48.0, 48.0]]
    assert arg.tolist() == [[[0, 0, 0], [1, 1, 1]]]
    assert torch.equal(maxsim(q, d, None, lengths, backend="triton"), scores)
    assert torch.equal(maxsim(q, d, torch.tensor([2], device=DEV), lengths, backend="triton"), scores * 2 / 3)


def test_auto_backend_and_fp64_use_the_twin():
    q, d, qm, dm, cand = maxsim_case(2, 4, 3, 6, 8, 2, torch.float64, seed=3)
    assert maxsim(q, d, qm, dm, cand).dtype == torch.float64
    q32, d32 = q.float(), d.float()
    assert torch.allclose(maxsim(q32, d32, qm, dm, cand, backend="torch").double(), torch_maxsim(q, d, qm, dm, cand))


@pytest.mark.parametrize("bad, match", [
    (lambda q, d, c: (q, d[:, :, :5], c), "embedding dimension"),
    (lambda q, d, c: (q, d.half(), c), "D must have dtype"),
    (lambda q, d, c: (q, d, c + 10), "candidates must be document indices"),
    (lambda q, d, c: (q, d, c.float()), "candidates must have dtype"),
    (lambda q, d, c: (q[0], d, c), "Q must have 3 dimension"),
])
def test_bad_arguments_raise_one_line_errors(bad, match):
    q, d, _, _, cand = maxsim_case(2, 4, 3, 6, 8, 2, torch.float32, seed=1)
    with pytest.raises(ValueError, match=match):
        bq, bd, bc = bad(q, d, cand)
        maxsim(bq, bd, candidates=bc, backend="triton")
    with pytest.raises(ValueError, match="d_mask must have shape"):
        maxsim(q, d, None, torch.ones(3, 5, dtype=torch.bool, device=DEV))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_colbert_and_colpali_shapes(dtype):
    for case in [(16, 32, 200, 300, 128, 100), (2, 1024, 4, 1031, 128, None)]:
        q, d, qm, dm, cand = maxsim_case(*case, dtype, seed=11, device="cuda")
        grad = torch.randn(case[0], case[5] or case[2], device="cuda")
        got = run(lambda *a: maxsim(*a, deterministic=True), q, d, qm, dm, cand, grad)
        fast = run(maxsim, q, d, qm, dm, cand, grad)
        ref = run(torch_maxsim, q, d, qm, dm, cand, grad.double(), torch.float64)
        scale = ref[0].abs().max().item()
        assert (got[0].double() - ref[0]).abs().max().item() <= 1e-5 * scale
        for g, f, r in zip(got[1:], fast[1:], ref[1:]):
            tol = 1e-2 * max(1.0, r.abs().max().item())
            assert (g.double() - r).abs().max().item() <= tol and (f.double() - r).abs().max().item() <= tol
