"""The one CUDA-graph capture (lsr.utils.cuda_graphs): a replay refreshes the body's outputs, and a failed capture
leaves the process's random numbers usable and unchanged (a capture registers the device's CUDA generator; before
the fix a failed one left it "capturing", and every later ``nn.Linear(..., device="cuda")`` in the process failed
with "Offset increment outside graph capture encountered unexpectedly")."""

from __future__ import annotations

import pytest
import torch

from lsr.utils.cuda_graphs import GraphCaptureError, capture_graph


def _draws_after(seed: int, between) -> torch.Tensor:
    """Two random draws on the GPU with ``between()`` run in between; returns the second draw."""
    torch.manual_seed(seed)
    torch.randn(7, device="cuda")
    between()
    return torch.randn(5, device="cuda")


@pytest.mark.gpu
def test_gpu_replay_refreshes_the_outputs():
    x = torch.arange(4, dtype=torch.float32, device="cuda")
    graph, out = capture_graph(lambda: x * 2 + 1, "cuda")
    x.copy_(torch.tensor([10.0, 20.0, 30.0, 40.0]))
    graph.replay()
    assert out.tolist() == [21.0, 41.0, 61.0, 81.0]


def _syncs(x: torch.Tensor):
    return lambda: x * float(x.sum().item())   # a host sync: no capture can hold it


def _raises(x: torch.Tensor):
    def body():
        y = torch.rand_like(x)   # draws from the registered generator inside the capture
        raise ValueError("the body's own error")
        return y
    return body


@pytest.mark.gpu
@pytest.mark.parametrize("make_body", [_syncs, _raises])
def test_gpu_a_failed_capture_leaves_random_numbers_usable_and_unchanged(make_body):
    """Whether the capture is invalidated (a host sync) or the body raises inside it."""
    x = torch.ones(16, device="cuda")
    want = _draws_after(3, lambda: None)

    def failed_capture():
        with pytest.raises(GraphCaptureError):
            capture_graph(make_body(x), "cuda", warm_up=make_body is _syncs)   # (_raises raises eagerly too)

    got = _draws_after(3, failed_capture)
    assert torch.equal(got, want)
    layer = torch.nn.Linear(64, 32, device="cuda")   # random initialisation on the device
    assert torch.isfinite(layer.weight).all()
