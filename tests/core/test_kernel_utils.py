"""The stage-neutral kernel helpers (lsr.utils.kernels) and the CUDA sources shipped as package resources."""

from __future__ import annotations

import pytest
import torch

from lsr.utils.kernels import check_tensor, use_triton


def test_check_tensor_names_each_problem():
    t = torch.zeros(3, 4, dtype=torch.float32)
    check_tensor("x", t, dtype=torch.float32, shape=(3, None), device="cpu", contiguous=True, rows_contiguous=True)
    check_tensor("x", t, dtype=(torch.float64, torch.float32), ndim=2)
    with pytest.raises(ValueError, match=r"x must have dtype torch.int32 \(got torch.float32\)"):
        check_tensor("x", t, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"shape \[3, 5\] \(got \[3, 4\]\)"):
        check_tensor("x", t, shape=(3, 5))
    with pytest.raises(ValueError, match=r"1 dimension\(s\) \(got 2\)"):
        check_tensor("x", t, ndim=1)
    with pytest.raises(ValueError, match="contiguous memory"):
        check_tensor("x", t.t(), contiguous=True)
    with pytest.raises(ValueError, match="contiguous rows"):
        check_tensor("x", t.t(), rows_contiguous=True)
    with pytest.raises(ValueError, match="y is required"):
        check_tensor("y", None)


def test_use_triton_backends():
    cpu = torch.device("cpu")
    assert use_triton("torch", cpu) is False
    assert use_triton("auto", cpu) is False         # the torch twin on the CPU
    with pytest.raises(ValueError, match="backend must be"):
        use_triton("cuda", cpu)


def test_launchers_name_the_bad_argument():
    pytest.importorskip("triton")
    from lsr.search.kernels.topk import triton_topk

    with pytest.raises(ValueError, match="scores must have dtype torch.float32"):
        triton_topk(torch.zeros(2, 8, dtype=torch.float64), 3)


def test_cuda_sources_are_package_resources():
    from lsr.search.kernels import cuda_source

    assert 'extern "C" __global__' in cuda_source("block_scores.cu") and "lsr_block_scores" in cuda_source("block_scores.cu")
    assert "lsr_rescore" in cuda_source("rescore.cu")
    with pytest.raises(FileNotFoundError):
        cuda_source("missing.cu")
