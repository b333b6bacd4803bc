"""The one CUDA-graph utility (lsr.utils.cuda_graphs): a replay refreshes the body's outputs; a failed capture leaves
the process's random numbers usable and unchanged, the graphs captured before it replayable and its memory pool
open to the next capture (torch marks the device's CUDA generator "capturing" in capture_begin and clears the mark
only in a capture_end that completes; left set, every later ``nn.Linear(..., device="cuda")`` in the process failed
with "Offset increment outside graph capture encountered unexpectedly"); a GraphSet runs a key whose capture failed
eagerly, warning once (on the CPU every capture fails: that path runs everywhere)."""

from __future__ import annotations

import warnings
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from lsr.utils.cuda_graphs import GraphCaptureError, GraphPolicy, GraphSet, capture_graph
from lsr.utils.runtime import FailureMemory


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


def test_a_capture_off_cuda_fails_and_the_set_runs_the_key_eagerly_warning_once():
    memory = FailureMemory("tests.graphs", "a test capture", "it runs eagerly", category=RuntimeWarning)
    graphs, ran = GraphSet(memory), Counter()

    def capture(pool):
        ran["capture"] += 1
        return capture_graph(lambda: ran.update(["body"]), "cpu", pool=pool)

    with pytest.warns(RuntimeWarning, match="a test capture failed .*CUDA graphs need a CUDA device"):
        assert graphs.lookup("k", capture) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # remembered: no second warning, no second try
        assert graphs.lookup("k", capture) is None
        assert graphs.lookup("other", capture) is None
    assert ran == {"capture": 2} and memory.count == 2 and "k" in graphs and graphs.held() == []


def test_graph_set_bounds_per_lookup_defers_and_clears():
    graphs = GraphSet(FailureMemory("tests.graphs", "a test capture", "eager"), GraphPolicy(max_graphs=2))
    made = lambda b: lambda pool: SimpleNamespace(bytes=b)   # noqa: E731 - a stand-in graph holding b bytes
    for key in "abc":
        assert graphs.lookup(key, made(1)).bytes == 1
    assert list(graphs) == ["b", "c"]                               # the set's own bound: two graphs
    assert graphs.get("b").bytes == 1 and list(graphs) == ["c", "b"]   # a use moves it last
    graphs.lookup("d", made(50), policy=GraphPolicy(max_graphs=8, max_bytes=10))
    assert list(graphs) == ["d"]                                    # a lookup's own bound: bytes
    assert graphs.lookup("e", made(1), defer=True) is None          # deferred: the first use runs eagerly
    assert graphs.lookup("e", made(1), defer=True).bytes == 1       # captured at the second
    graphs.clear()
    assert not len(graphs) and graphs.lookup("e", made(1), defer=True) is None   # forgotten: first use again


@pytest.mark.gpu
def test_gpu_a_capture_into_a_pool_after_a_failed_one_works_and_random_draws_too():
    """A failed capture's pool is still being recorded into unless the recording is ended: the next capture into
    the same shared pool then failed in capture_begin ("already recording to mempool_id"), after marking the
    generator capturing, and every later random draw failed (the query encoder's retry without extraction)."""
    x = torch.ones(16, device="cuda")
    pool = torch.cuda.graph_pool_handle()
    with pytest.raises(GraphCaptureError):
        capture_graph(_syncs(x), "cuda", pool=pool)
    graph, out = capture_graph(lambda: x * 3, "cuda", pool=pool)
    x.fill_(2.0)
    graph.replay()
    assert out.tolist() == [6.0] * 16
    assert torch.isfinite(torch.nn.Linear(64, 32, device="cuda").weight).all()


@pytest.mark.gpu
def test_gpu_graphs_captured_before_a_failed_capture_still_replay():
    """The generator's state is cleared in place: graphs captured earlier hold that state object (handing the
    generator a copy instead left theirs marked, and their replays failed with the offset error), and the draws
    after equal those of a process that tried no capture."""
    x = torch.ones(16, device="cuda")
    graph, out = capture_graph(lambda: x + torch.rand_like(x), "cuda")   # draws: registers the generator's state
    want = _draws_after(5, graph.replay)

    def failed_then_replayed():
        with pytest.raises(GraphCaptureError):
            capture_graph(_syncs(x), "cuda")
        graph.replay()

    assert torch.equal(_draws_after(5, failed_then_replayed), want)
    assert torch.isfinite(out).all() and torch.isfinite(torch.nn.Linear(8, 8, device="cuda").weight).all()


@pytest.mark.gpu
def test_gpu_a_successful_capture_leaves_random_initialisation_alone():
    """A graph that draws random numbers, captured and kept: eager draws, seeding and model initialisation after it
    work (the generator stays registered with the graph, which advances its offset at each replay)."""
    x = torch.ones(16, device="cuda")
    graph, out = capture_graph(lambda: torch.rand_like(x), "cuda")
    first = out.clone()
    graph.replay()
    assert not torch.equal(out, first)   # each replay draws new numbers
    torch.manual_seed(0)
    assert torch.isfinite(torch.nn.Linear(64, 32, device="cuda").weight).all()
