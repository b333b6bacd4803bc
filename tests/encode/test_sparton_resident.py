"""The resident-tile Sparton forward (Gluon, sm_90): its chunk table on any device; on an H100/H200 its outputs
against the tl kernel (bit-identical) and the float64 torch twin, through ``triton_sparton_fwd``'s row split; the
dispatch's failure memory on any device.

Gluon kernels have no CPU interpreter, so the kernel tests are GPU-only (marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lsr.encode.sparton import HeadFacts, SpartonDispatch, explain_sparton_head, torch_sparton_head
from lsr.encode.sparton import fwd_resident as sparton_resident
from lsr.encode.sparton.fwd_padded import triton_sparton_fwd
from tests.conftest import HAS_CUDA


def chunk_table_twin(lengths: list[int], rows_ok: list[bool], S: int, block: int) -> tuple[list[int], list[int]]:
    """(first hidden rows, info) of the chunks: ok rows in pairs, the pair's chunks interleaved, the owner the
    row's rank among ok rows mod 2; info = owner | last-of-row << 1 | previous chunk's owner << 2."""
    ok_rows = [b for b, ok in enumerate(rows_ok) if ok]
    starts = {b: [b * S + s0 for s0 in range(0, max(lengths[b], 1), block)] for b in ok_rows}
    chunks = []
    for p in range(0, len(ok_rows), 2):
        pair = ok_rows[p:p + 2]
        for j in range(max(len(starts[b]) for b in pair)):
            chunks += [(starts[b][j], owner, j == len(starts[b]) - 1) for owner, b in enumerate(pair)
                       if j < len(starts[b])]
    info = [own | last << 1 | (chunks[i - 1][1] if i else own) << 2 for i, (_, own, last) in enumerate(chunks)]
    return [row for row, _, _ in chunks], info


@pytest.mark.parametrize("lengths,rows_ok,S,block", [
    ([0, 5, 300, 129, 256], [True, True, False, True, True], 300, 128),
    ([7, 7, 7], [True, True, True], 7, 128),
    ([512, 1, 0, 512], [True, False, True, True], 512, 128),
    ([512, 1, 300, 0, 129], [True, True, False, True, True], 512, 128),
    ([64, 65], [True, True], 65, 16),
])
def test_chunk_table_interleaves_row_pairs_and_marks_owners(lengths, rows_ok, S, block):
    table, info, count = sparton_resident.chunk_table(torch.tensor(lengths, dtype=torch.int32),
                                                      torch.tensor(rows_ok), S, block)
    rows, want_info = chunk_table_twin(lengths, rows_ok, S, block)
    assert table.dtype == info.dtype == torch.int32 and count.tolist() == [len(rows)]
    assert table[:len(rows)].tolist() == rows and info[:len(rows)].tolist() == want_info
    assert (table[len(rows):] == -1).all() and (info[len(rows):] == 0).all()
    assert table.numel() == info.numel() == len(lengths) * -(-S // block) + 1
    n_last = sum(i >> 1 & 1 for i in want_info)
    assert n_last == sum(rows_ok)  # every ok row's outputs are written exactly once


def test_chunk_table_without_rows_ends_at_once():
    table, info, count = sparton_resident.chunk_table(torch.tensor([3, 9], dtype=torch.int32),
                                                      torch.tensor([False, False]), 9, 4)
    assert count.tolist() == [0] and (table == -1).all() and (info == 0).all()


@pytest.mark.parametrize("num_k,stages", [(3, 3), (4, 4), (6, 6), (8, 8), (10, 5), (12, 4), (16, 0)])
def test_ring_depth_divides_the_slices_and_fits_shared_memory(num_k, stages):
    assert sparton_resident.ring_stages(num_k, 2) == stages


def test_resident_kernel_does_not_claim_cpu_inputs():
    assert "sm_90" in sparton_resident.unsupported_reason(None, torch.bfloat16, 768, True)
    assert "bf16" in sparton_resident.unsupported_reason((9, 0), torch.float32, 768, True)


def test_a_failing_resident_kernel_warns_once_and_leaves_the_rows_to_the_tl_kernel():
    tried = []

    def broken(*args):
        tried.append(1)
        raise RuntimeError("unsupported layout")  # what a Gluon API change looks like at compile time

    dispatch = SpartonDispatch(resident_forward=broken)
    h, w = torch.zeros(2, 4, 64), torch.zeros(10, 64)
    args = (h, w, None, torch.tensor([4, 2], dtype=torch.int32), torch.ones(2, dtype=torch.bool), torch.zeros(2, 10),
            None, None)
    with pytest.warns(UserWarning, match="resident-tile forward failed .*unsupported layout"):
        assert dispatch.resident_rows(*args) is False
    assert dispatch.resident_rows(*args) is False and tried == [1]  # remembered: not tried again
    hopper = HeadFacts("cuda", torch.bfloat16, 64, 512, 768, 250002, capability=(9, 0), sm_count=132, interpret=False)
    plan = dispatch.plan(hopper, backend="triton")
    assert plan.variant == "padded" and "failed earlier" in plan.reason and "unsupported layout" in plan.reason
    assert SpartonDispatch().plan(hopper, backend="triton").variant == "resident"


def _on_hopper() -> bool:
    return HAS_CUDA and torch.cuda.get_device_capability() == (9, 0) and sparton_resident.gluon is not None


hopper = pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU (H100/H200) and triton's Gluon")


def _mixed_case(dtype: torch.dtype, V: int = 16411, seed: int = 3, D: int = 768):
    """B·S·V >= 2^25, so the launcher takes its tuned path (the only one that dispatches to the resident kernel)."""
    g = torch.Generator().manual_seed(seed)
    B, S = 6, 512
    h = torch.randn(B, S, D, generator=g).to(dtype)
    h[0, 7] = h[0, 300]  # equal logits at two positions (and chunks): the first wins
    w = (torch.randn(V, D, generator=g) * 0.05).to(dtype)
    bias = torch.randn(V, generator=g) * 0.1
    m = torch.ones(B, S, dtype=torch.bool)
    m[1, 200:] = False  # right padding, last chunk partial
    m[2] = False  # fully masked
    m[3, 40:90] = False  # holes: the tl kernel's launch
    m[4, :5] = False  # left padding: the tl kernel's launch
    m[5, 128:] = False  # one full chunk
    return h.cuda(), w.cuda(), bias.cuda(), m.cuda()


@pytest.fixture
def resident_calls() -> list:
    """One entry per call of the resident kernel's launcher through ``_forward`` while the test runs."""
    return []


def _forward(calls: list, h, w, bias, m, resident: bool, **kw):
    """triton_sparton_fwd with the resident kernel for the rows without holes (through a dispatch that counts its
    calls) or the tl kernel for every row; returns the outputs and how often the resident kernel ran."""
    def counted(*args):
        calls.append(1)
        sparton_resident.resident_fwd(*args)

    dispatch = SpartonDispatch(resident_forward=counted)
    before = len(calls)
    out = triton_sparton_fwd(h, w, bias, m, rows_without_holes=dispatch.resident_rows if resident else None, **kw)
    assert not dispatch.failed
    return out, len(calls) - before


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("train", [True, False])
def test_resident_forward_bit_identical_to_tl_kernel(dtype, train, resident_calls):
    h, w, bias, m = _mixed_case(dtype)
    kw = {"need_fp32": train, "need_argmax": train}
    (y, y32, arg), n_res = _forward(resident_calls, h, w, bias, m, True, **kw)
    (ry, ry32, rarg), n_tl = _forward(resident_calls, h, w, bias, m, False, **kw)
    assert (n_res, n_tl) == (1, 0)
    assert torch.equal(y, ry)
    if train:
        assert torch.equal(y32, ry32) and torch.equal(arg, rarg)
        assert arg[0].eq(7).any() and not arg[0].eq(300).any()  # the tie (see _mixed_case) goes to the first
        assert (arg[2] == 0).all() and (y32[2] == 0).all()
    twin = torch_sparton_head(h.double(), w.double(), bias.double(), m)
    assert (y.double() - twin).abs().max() < 2e-2


@pytest.mark.gpu
@hopper
def test_resident_forward_without_bias_and_odd_vocabulary(resident_calls):
    h, w, _, m = _mixed_case(torch.bfloat16, V=16385, seed=5)
    (y, y32, arg), n_res = _forward(resident_calls, h, w, None, m, True, need_fp32=True)
    (ry, ry32, rarg), _ = _forward(resident_calls, h, w, None, m, False, need_fp32=True)
    assert n_res == 1 and torch.equal(y32, ry32) and torch.equal(arg, rarg) and torch.equal(y, ry)


@pytest.mark.gpu
@hopper
def test_dispatch_keeps_few_vocabulary_tiles_on_the_tl_kernel():
    h, w, bias, m = _mixed_case(torch.bfloat16, V=16411)
    plan = explain_sparton_head(h, w, bias)  # 129 tiles: under RESIDENT_MIN_WAVES waves
    assert plan.variant == "padded" and "waves" in plan.reason
    assert explain_sparton_head(h, w, bias, variant="resident").variant == "resident"


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("D", [192, 384, 512, 640, 896])
def test_resident_forward_other_widths_and_an_odd_number_of_rows(D, resident_calls):
    """Other ring depths (3, 6, 8, 5 and 2 slots) and five rows for the two consumers (the last one has no partner)."""
    h, w, bias, m = _mixed_case(torch.bfloat16, seed=7, D=D)
    m[3] = True
    (y, y32, arg), n_res = _forward(resident_calls, h, w, bias, m, True, need_fp32=True)
    (ry, ry32, rarg), _ = _forward(resident_calls, h, w, bias, m, False, need_fp32=True)
    assert n_res == 1 and torch.equal(y32, ry32) and torch.equal(arg, rarg) and torch.equal(y, ry)
