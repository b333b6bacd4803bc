"""Serving from several devices (lsr.serve.replicas), with CPU replicas: one endpoint, the least-loaded replica
answers, answers equal one replica's and `lsr search`'s, /health and /stats per replica, a failing replica taken
out while the others serve."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from lsr.cli import main
from lsr.serve import create_app
from lsr.serve.engine import SearchEngine
from lsr.serve.replicas import parse_devices
from tests.serve.conftest import SCIFACT_QUERIES, TEXTS, K, get, post_all, reference


def test_cpu_replicas_answer_as_one_replica_and_lsr_search(bm25):
    app = create_app(bm25["index"], bm25["model"], devices="cpu,cpu,cpu", max_batch=8, max_wait_ms=20, k=K)
    responses = asyncio.run(post_all(app, [{"query": t} for t in TEXTS]))
    assert [r.status_code for r in responses] == [200] * len(TEXTS)
    got = [r.json()["results"][0] for r in responses]
    assert got == reference(app, app.state.engine.encoder.encode_query(TEXTS), K)  # bit-identical float32 scores
    for q, hits in zip(SCIFACT_QUERIES, got):
        assert hits["docnos"] == list(bm25["run"][q["_id"]])
        assert np.array_equal(np.float32(hits["scores"]), np.float32(list(bm25["run"][q["_id"]].values())))

    health = asyncio.run(get(app, "/health")).json()
    assert health["status"] == "ok" and health["device"] == "cpu,cpu,cpu" and health["n_docs"] == 5183
    assert [(r["replica"], r["device"], r["ready"], r["queue_depth"], r["error"]) for r in health["replicas"]] == \
        [(i, "cpu", True, 0, None) for i in range(3)]
    stats = asyncio.run(get(app, "/stats")).json()
    per = stats["replicas"]
    assert stats["requests"] == stats["queries"] == len(TEXTS) == sum(r["requests"] for r in per)
    assert stats["batches"] == sum(r["batches"] for r in per) and stats["latency_ms"]["window"] == len(TEXTS)
    # 120 concurrent requests against batches of at most 8: the least-loaded dispatch gives every replica work
    assert all(r["requests"] > 0 and r["max_batch_queries"] <= 8 for r in per)
    assert stats["errors"] == 0 and stats["queue_depth"] == 0 and stats["max_batch_queries"] <= 8


class FailingEngine(SearchEngine):
    """A replica whose device fails every batch (as a lost GPU would)."""

    def search_batch(self, batch):
        raise RuntimeError("device lost")


def _engines(bm25, broken: set[int]):
    """An engine factory for create_app: the replicas numbered in ``broken`` (in build order) fail."""
    built: list[int] = []

    def make(device: str) -> SearchEngine:
        cls = FailingEngine if len(built) in broken else SearchEngine
        built.append(len(built))
        return cls(bm25["index"], bm25["model"], device=device, k=K)

    return make


def test_a_failing_replica_is_marked_unhealthy_and_the_others_keep_serving(bm25):
    app = create_app(bm25["index"], devices=["cpu", "cpu"], engine_factory=_engines(bm25, {0}), max_batch=4,
                     max_wait_ms=5, warmup=False)
    responses = asyncio.run(post_all(app, [{"query": t} for t in TEXTS[:24]]))
    assert [r.status_code for r in responses] == [200] * 24   # what replica 0 failed, replica 1 answered
    assert [r.json()["results"][0] for r in responses] == \
        reference(app, app.state.replicas.replicas[1].engine.encoder.encode_query(TEXTS[:24]), K)
    health = asyncio.run(get(app, "/health")).json()
    assert health["status"] == "degraded"
    assert [(r["healthy"], r["ready"]) for r in health["replicas"]] == [(False, False), (True, True)]
    assert health["replicas"][0]["error"] == "RuntimeError: device lost"
    stats = asyncio.run(get(app, "/stats")).json()
    assert stats["replicas"][0]["errors"] >= 1 and stats["replicas"][1]["errors"] == 0
    assert stats["replicas"][1]["requests"] == 24
    before = stats["replicas"][0]["requests"]
    asyncio.run(post_all(app, [{"query": t} for t in TEXTS[:6]]))   # an unhealthy replica gets nothing more
    assert asyncio.run(get(app, "/stats")).json()["replicas"][0]["requests"] == before


def test_a_request_every_replica_fails_gets_its_error_and_no_replica_is_taken_out(bm25):
    """What fails everywhere is the request's (or every device's) fault: one line, HTTP 500, the server stays."""
    app = create_app(bm25["index"], devices="cpu,cpu", engine_factory=_engines(bm25, {0, 1}), max_batch=4,
                     max_wait_ms=1, warmup=False)
    r = asyncio.run(post_all(app, [{"query": TEXTS[0]}]))[0]
    assert r.status_code == 500 and r.json() == {"error": "search failed: RuntimeError: device lost"}
    health = asyncio.run(get(app, "/health")).json()
    assert health["status"] == "ok" and all(rep["healthy"] for rep in health["replicas"])


def test_device_lists_are_checked_before_anything_loads(capsys, bm25):
    assert parse_devices("cuda:0, cuda:1") == ["cuda:0", "cuda:1"] and parse_devices(["cpu", "cpu"]) == ["cpu", "cpu"]
    assert parse_devices("cuda,cuda:1") == ["cuda:0", "cuda:1"] and parse_devices("all") == ["all"]
    for bad, message in [("cuda:0,gpu", "unknown device 'gpu'"), ("cuda:1,cuda:1", "names cuda:1 twice"),
                         ("cuda,cuda:0", "names cuda:0 twice"), ("cpu,,cpu", "empty entry"),
                         ("all,cpu", "unknown device 'all'")]:
        with pytest.raises(ValueError, match=message):
            parse_devices(bad)
        assert main(["serve", "--index", str(bm25["index"]), "--devices", bad]) == 2
        err = capsys.readouterr().err.strip()   # argparse's usage, then one line naming the problem
        assert message in err.splitlines()[-1] and "--devices" in err.splitlines()[-1] and "Traceback" not in err
    assert main(["serve", "--index", str(bm25["index"]), "--device", "cpu", "--devices", "cpu,cpu"]) == 2
    assert "give --device (cpu) or --devices (cpu,cpu), not both" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not both"):
        create_app(bm25["index"], device="cpu", devices="cpu,cpu")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without a GPU")
def test_gpus_the_machine_lacks_are_named(capsys, bm25):
    for devices, message in [("cuda:0,cuda:1", "cuda:0 is not visible"), ("all", "no CUDA GPU is visible")]:
        assert main(["serve", "--index", str(bm25["index"]), "--devices", devices]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err


def test_a_replica_that_cannot_start_stops_the_server_naming_its_device(bm25, tmp_path):
    def make(device: str) -> SearchEngine:
        if make.n == 1:
            raise FileNotFoundError("the index folder is gone")
        make.n += 1
        return SearchEngine(bm25["index"], device=device)

    make.n = 0
    with pytest.raises(FileNotFoundError, match="replica 1 on cpu did not start: the index folder is gone"):
        create_app(bm25["index"], devices="cpu,cpu", engine_factory=make, warmup=False)


@pytest.mark.gpu
def test_gpu_replicas_answer_as_one_gpu(bm25):
    """Every visible GPU a replica: pre-encoded vectors give the same bytes whichever replica answers."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    one = create_app(bm25["index"], bm25["model"], device="cuda:0", max_batch=16, max_wait_ms=5, k=K)
    many = create_app(bm25["index"], bm25["model"], devices="all", max_batch=16, max_wait_ms=5, k=K)
    encoder = one.state.engine.encoder
    rows = [{encoder.vocab[t]: w for t, w in row.items()} for row in encoder.encode_query(TEXTS).to_dicts()]
    bodies = [{"vectors": [row]} for row in rows]
    a = [r.content for r in asyncio.run(post_all(one, bodies))]
    b = [r.content for r in asyncio.run(post_all(many, bodies))]
    assert a == b
    per = asyncio.run(get(many, "/stats")).json()["replicas"]
    assert len(per) == torch.cuda.device_count() and all(r["requests"] > 0 for r in per)


def test_client_processes_side_by_side_add_up():
    """scripts/bench_serve.py loads a several-GPU server from several client processes: their results merge."""
    from lsr.benchmarks.loadgen import merge_loads

    a = {"latencies_ms": [1.0, 2.0], "qps": 10.0, "ok": 2, "errors": 0, "sent": 3, "answers": {0: "x", 2: "z"},
         "first_error": None, "client_gc_full": 0}
    b = {"latencies_ms": [3.0], "qps": 5.0, "ok": 1, "errors": 1, "sent": 2, "answers": {0: "other", 1: "y"},
         "first_error": "HTTP 500: boom", "client_gc_full": 1}
    merged = merge_loads([a, b])
    assert sorted(merged["latencies_ms"]) == [1.0, 2.0, 3.0] and merged["qps"] == 15.0
    assert (merged["ok"], merged["errors"], merged["sent"], merged["client_gc_full"]) == (3, 1, 5, 1)
    assert merged["answers"] == {0: "x", 1: "y", 2: "z"} and merged["first_error"] == "HTTP 500: boom"


def test_stats_of_servers_side_by_side_add_up():
    """scripts/bench_serve.py --modes processes reads one /stats per server process: merged as one server's."""
    from lsr.benchmarks.servers import merge_stats

    def stats(n: int, busy: float, device: str) -> dict:
        return {"requests": n, "queries": 2 * n, "batches": n // 2, "errors": 0, "dropped": 1, "device_busy_s": busy,
                "stage_batches": n // 2, "max_batch_queries": n, "stage_ms_total": {"search": busy * 1000},
                "gc": {"collections": [n, 1, 0], "pause_ms": [0.5, 0.25, 0.0], "max_pause_ms": [0.5, 0.25, 0.0]},
                "compiled": {"search_graph_captures": 3}, "query_graphs": None,
                "replicas": [{"replica": 0, "device": device, "requests": n}]}

    merged = merge_stats([stats(10, 1.5, "cuda:0"), stats(4, 0.5, "cuda:1")])
    assert (merged["requests"], merged["queries"], merged["batches"], merged["dropped"]) == (14, 28, 7, 2)
    assert merged["device_busy_s"] == 2.0 and merged["stage_ms_total"] == {"search": 2000.0}
    assert merged["max_batch_queries"] == 10 and merged["compiled"] == {"search_graph_captures": 6}
    assert merged["gc"]["collections"] == [14, 2, 0] and merged["gc"]["max_pause_ms"] == [0.5, 0.25, 0.0]
    assert [r["device"] for r in merged["replicas"]] == ["cuda:0", "cuda:1"]
