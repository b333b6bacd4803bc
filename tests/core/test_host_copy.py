"""lsr.utils.host_copy: large device -> host copies through pinned buffers, bytes unchanged."""

from __future__ import annotations

import pytest
import torch

from lsr.utils import host_copy
from lsr.utils.host_copy import copy_to_host


def test_cpu_tensors_copy_plainly_into_a_given_or_new_result():
    src = torch.arange(12, dtype=torch.int64).view(3, 4)
    assert torch.equal(copy_to_host(src), src) and copy_to_host(src) is not src
    out = torch.empty(3, 4, dtype=torch.int64)
    assert copy_to_host(src, out) is out and torch.equal(out, src)


@pytest.mark.parametrize("bad", [torch.empty(4, 3, dtype=torch.int64), torch.empty(3, 4, dtype=torch.int32),
                                 torch.empty(4, 3, dtype=torch.int64).t()])
def test_a_result_of_another_shape_dtype_or_layout_is_refused(bad):
    with pytest.raises(ValueError, match=r"out must be a contiguous CPU torch.int64 tensor of shape \(3, 4\)"):
        copy_to_host(torch.zeros(3, 4, dtype=torch.int64), bad)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_gpu_copies_keep_every_bit_in_chunks_and_from_views(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = 3 * (host_copy.CHUNK_BYTES // (1000 * 8)) + 7   # several chunks and a short last one
    full = torch.randn(rows, 2000, device="cuda", generator=g).to(dtype)
    for src in (full[:, :1000], full[:, 1000:].contiguous(), full[5:]):   # a column view, a copy, a row view
        got = copy_to_host(src)
        assert got.device.type == "cpu" and torch.equal(got, src.cpu())
        into = torch.empty(src.shape, dtype=dtype)
        assert copy_to_host(src, into) is into and torch.equal(into, src.cpu())
