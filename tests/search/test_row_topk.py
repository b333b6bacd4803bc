"""The row top-k kernel (lsr.search.kernels.row_topk_cuda): its twin on any device, the kernel against the twin on a
GPU, and the callers that take it (row_topk, bucket_topk)."""

import pytest
import torch

from lsr.search.kernels import bucket_select, row_topk_cuda
from lsr.search.select import row_topk

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def unique_keys(B: int, C: int, none: float, gen: torch.Generator, device: str = "cpu") -> torch.Tensor:
    """int64 [B, C]: distinct non-negative keys per row (large ones, as packed keys are), a share ``none`` of -1."""
    keys = torch.stack([torch.randperm(1 << 16, generator=gen)[:C] for _ in range(B)]).to(torch.int64) << 40
    keys = keys | torch.randint(0, 1 << 31, (B, C), generator=gen)
    keys[torch.rand((B, C), generator=gen) < none] = -1
    return keys.to(device)


def reference(keys: torch.Tensor, k: int, count: torch.Tensor | None = None) -> torch.Tensor:
    """Row by row: the valid prefix sorted descending in Python, cut or padded with -1 to k."""
    rows = []
    for b, row in enumerate(keys.tolist()):
        n = len(row) if count is None else max(0, min(len(row), int(count[b])))
        top = sorted(row[:n], reverse=True)[:k]
        rows.append(top + [-1] * (k - len(top)))
    return torch.tensor(rows, dtype=torch.int64).view(keys.shape[0], k)


@pytest.mark.parametrize("C,k", [(1, 1), (1, 4), (5, 3), (33, 33), (100, 120), (700, 200)])
def test_twin_is_the_sorted_prefix(C, k):
    gen = torch.Generator().manual_seed(C * 7 + k)
    keys = unique_keys(6, C, 0.3, gen)
    count = torch.tensor([0, 1, C // 2, C, C + 9, -3], dtype=torch.int32)
    assert torch.equal(row_topk_cuda.torch_row_topk(keys, k), reference(keys, k))
    assert torch.equal(row_topk_cuda.torch_row_topk(keys, k, count), reference(keys, k, count))


def test_cpu_keys_take_the_twin():
    """Off CUDA the dispatcher and its callers fall back to the twin (what CI runs)."""
    keys = unique_keys(3, 50, 0.2, torch.Generator().manual_seed(1))
    assert not row_topk_cuda.usable(keys)
    assert torch.equal(row_topk_cuda.row_topk(keys, 20), reference(keys, 20))
    assert torch.equal(row_topk(keys, 60), reference(keys, 60))


def test_bucket_topk_without_the_rank_kernel_reads_only_the_gathered_slots(poison):
    """bucket_topk's sorting branch (``by_rank=False``) leaves the slots past each row's count unwritten
    (torch.empty, poisoned here): the selection must read only the counted prefix."""
    keys = unique_keys(5, 3000, 0.6, torch.Generator().manual_seed(2), DEV)
    got, reselect = bucket_select.bucket_topk(keys, 40, slots=bucket_select.select_slots(40), by_rank=False)
    assert not bool(reselect.any())
    assert torch.equal(got.cpu(), reference(keys.cpu(), 40))


@pytest.mark.gpu
@pytest.mark.parametrize("B,C,k", [(1, 1, 1), (3, 2, 5), (7, 31, 31), (5, 100, 10), (300, 1500, 1000),
                                   (64, 4096, 1500), (2, 4096, 4096), (9, 2049, 3000)])
def test_gpu_kernel_matches_twin(B, C, k):
    gen = torch.Generator().manual_seed(B * 131 + C + k)
    keys = unique_keys(B, C, 0.4, gen, "cuda")
    count = torch.randint(-2, C + 3, (B,), generator=gen, dtype=torch.int32).cuda()
    assert row_topk_cuda.usable(keys)
    assert torch.equal(row_topk_cuda.cuda_row_topk(keys, k), row_topk_cuda.torch_row_topk(keys, k))
    assert torch.equal(row_topk_cuda.cuda_row_topk(keys, k, count), row_topk_cuda.torch_row_topk(keys, k, count))
    # a gather buffer's garbage past the count is never read
    junk = keys.clone()
    junk[torch.arange(C, device="cuda") >= count.clamp(min=0).unsqueeze(1)] = 1 << 62
    assert torch.equal(row_topk_cuda.cuda_row_topk(junk, k, count), row_topk_cuda.torch_row_topk(keys, k, count))


@pytest.mark.gpu
def test_gpu_long_rows_stay_on_torch_topk():
    keys = unique_keys(2, row_topk_cuda.MAX_ROW + 1, 0.1, torch.Generator().manual_seed(3), "cuda")
    assert not row_topk_cuda.usable(keys)
    assert torch.equal(row_topk(keys, 100), reference(keys.cpu(), 100).cuda())
