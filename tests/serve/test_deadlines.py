"""Deadlines on CPU replicas: a replica whose device hangs misses its batch deadline, leaves the dispatch and its
request is answered by another (or 503 with Retry-After when none is left, or when the request's own deadline
passes); /health reports it. Hangs come from the documented hook ``LSR_SERVE_FAULT`` (lsr.serve.faults) or from
an engine of the public ``engine_factory`` whose device thread blocks."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from lsr.benchmarks.servers import ProcessServers
from lsr.cli import main
from lsr.serve import create_app
from lsr.serve.engine import SearchEngine
from tests.serve.conftest import SCIFACT_QUERIES, TEXTS, K, get, http, post_all, run_hits


def test_lsr_serve_answers_past_a_hung_replica_and_reports_it(bm25, tmp_path, monkeypatch):
    """`lsr serve --devices cpu,cpu` with replica 0's device hanging (LSR_SERVE_FAULT): the first request, which
    the dispatch gives to replica 0, is answered by replica 1 once the 1 s batch deadline passed, as `lsr search`
    answers it; /health says degraded and names replica 0; later requests never reach it; the server stops."""
    monkeypatch.setenv("LSR_SERVE_FAULT", "hang:0")
    servers = ProcessServers(bm25["index"], str(bm25["model"]), ["auto"], [
        "--devices", "cpu,cpu", "--batch-timeout", "1", "--request-timeout", "20", "--k", str(K), "--no-warmup"],
        tmp_path)
    try:
        port = servers.ports[0]
        start = time.monotonic()
        status, _, answer = http(port, "/search", {"query": TEXTS[0]})
        waited = time.monotonic() - start
        assert status == 200 and answer["results"] == [run_hits(bm25["run"], SCIFACT_QUERIES[0]["_id"])]
        assert 1 <= waited < 20, waited   # it waited for the batch deadline, not for the hung device

        status, _, health = http(port, "/health")
        assert status == 200 and health["status"] == "degraded"
        hung, other = health["replicas"]
        assert (hung["replica"], hung["hung"], hung["ready"]) == (0, True, False)
        assert "past the 1 s batch deadline" in hung["error"]
        assert (other["hung"], other["ready"], other["error"]) == (False, True, None)

        for q in SCIFACT_QUERIES[1:9]:
            status, _, answer = http(port, "/search", {"query": q["text"]})
            assert status == 200 and answer["results"] == [run_hits(bm25["run"], q["_id"])]
        per = http(port, "/stats")[2]["replicas"]
        assert [r["requests"] for r in per] == [1, 9]   # replica 0 only ever got the batch it hangs in
    finally:
        servers.stop()
    # stopped by the SIGTERM (uvicorn re-raises it after its shutdown), not killed 20 s later: the hang ended
    assert servers.procs[0].returncode in (0, -signal.SIGTERM), servers.logs[0].read_text()[-2000:]


class HangingEngine(SearchEngine):
    """A replica whose device thread blocks in every batch until ``release`` is set (as a hung GPU would)."""

    def __init__(self, *args, release: threading.Event, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = release

    def search_batch(self, batch):
        self.release.wait(120)
        return super().search_batch(batch)


def test_a_hung_replica_misses_the_default_batch_deadline_and_another_answers(bm25):
    """With the default deadlines (a 10 s batch deadline within the 30 s request deadline): the request that
    replica 0 hangs in is answered by replica 1, equal to `lsr search`, and replica 0 leaves the dispatch."""
    built: list[str] = []
    release = threading.Event()

    def make(device: str) -> SearchEngine:
        built.append(device)
        if len(built) == 1:
            return HangingEngine(bm25["index"], bm25["model"], device=device, k=K, release=release)
        return SearchEngine(bm25["index"], bm25["model"], device=device, k=K)

    app = create_app(bm25["index"], devices="cpu,cpu", engine_factory=make, warmup=False)

    async def first_request() -> httpx.Response:   # a bound on the test, not on the server: 32e81d2 waits forever
        return (await asyncio.wait_for(post_all(app, [{"query": TEXTS[0]}]), 40))[0]

    try:
        start = time.monotonic()
        r = asyncio.run(first_request())
        assert r.status_code == 200 and time.monotonic() - start < 30
        assert r.json()["results"] == [run_hits(bm25["run"], SCIFACT_QUERIES[0]["_id"])]
        health = asyncio.run(get(app, "/health")).json()
        assert health["status"] == "degraded" and [rep["hung"] for rep in health["replicas"]] == [True, False]
        later = asyncio.run(post_all(app, [{"query": t} for t in TEXTS[1:7]]))
        assert [r.json()["results"][0] for r in later] == \
            [run_hits(bm25["run"], q["_id"]) for q in SCIFACT_QUERIES[1:7]]
        per = asyncio.run(get(app, "/stats")).json()["replicas"]
        assert [r["requests"] for r in per] == [1, 7]
    finally:
        release.set()
        asyncio.run(app.state.replicas.close())


@pytest.mark.parametrize("pipeline", [False, True])
def test_no_replica_left_answers_503_with_retry_after_and_health_503(bm25, monkeypatch, pipeline):
    """One replica, hanging: its request gets 503 with Retry-After at the batch deadline, the next one at once
    (no replica takes it), /health answers 503 "unavailable"; a device that comes back (hang:0:SECONDS) is
    dispatched to again. Alike with the host steps on a second thread (--pipeline)."""
    monkeypatch.setenv("LSR_SERVE_FAULT", "hang:0:2")   # each batch blocks 2 s, past the 0.3 s deadline
    app = create_app(bm25["index"], bm25["model"], device="cpu", batch_timeout_s=0.3, warmup=False, k=K,
                     pipeline=pipeline)
    try:
        start = time.monotonic()
        r = asyncio.run(post_all(app, [{"query": TEXTS[0]}]))[0]
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and time.monotonic() - start < 2
        error = r.json()["error"]
        assert "no replica can take the request" in error and "replica 0 on cpu" in error and "\n" not in error
        health = asyncio.run(get(app, "/health"))
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        again = asyncio.run(post_all(app, [{"query": TEXTS[1]}]))[0]
        assert again.status_code == 503 and "no replica can take the request" in again.json()["error"]
        assert asyncio.run(get(app, "/stats")).json()["requests"] == 1   # the second was not queued behind it
        deadline = time.monotonic() + 10
        while asyncio.run(get(app, "/health")).status_code != 200:   # the 2 s batch returns
            assert time.monotonic() < deadline, "the replica did not come back"
            time.sleep(0.1)
        assert asyncio.run(get(app, "/health")).json()["status"] == "ok"
    finally:
        asyncio.run(app.state.replicas.close())


def test_a_request_past_its_own_deadline_gets_503(bm25, monkeypatch):
    """timeout_ms shortens a request's deadline (never beyond --request-timeout): past it, 503 with Retry-After,
    long before the batch deadline; a bad timeout_ms is a one-line 422 naming the field and its range."""
    monkeypatch.setenv("LSR_SERVE_FAULT", "hang:0")
    app = create_app(bm25["index"], bm25["model"], device="cpu", request_timeout_s=5, batch_timeout_s=30,
                     warmup=False, k=K)
    try:
        start = time.monotonic()
        r = asyncio.run(post_all(app, [{"query": TEXTS[0], "timeout_ms": 200}]))[0]
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and time.monotonic() - start < 3
        assert "no answer within the request's deadline of 0.2 s" in r.json()["error"]

        async def bad() -> list[httpx.Response]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lsr") as client:
                return [await client.post("/search", content=b'{"query": "a", "timeout_ms": ' + value + b"}")
                        for value in (b"0", b"-5", b"5001", b'"100"', b"true", b"NaN", b"1" + b"0" * 5000)]

        for r in asyncio.run(bad()):
            assert r.status_code == 422
            assert r.json()["error"].startswith("'timeout_ms' must be a number in (0, 5000]"), r.json()
    finally:
        asyncio.run(app.state.replicas.close())


@pytest.mark.parametrize(("value", "message"), [
    ("stall:0", "'stall:0' is not hang:N or hang:N:SECONDS"),
    ("hang:x", "'hang:x' is not hang:N"),
    ("hang:2", "names replica 2; this server has replicas 0 to 1"),
    ("hang:0:-1", "the seconds of 'hang:0:-1' must be a finite number >= 0"),
])
def test_a_bad_fault_hook_value_is_one_line_naming_it(tmp_path, monkeypatch, capsys, value, message):
    """Refused before anything loads (the index here does not exist, and is not what the error names)."""
    monkeypatch.setenv("LSR_SERVE_FAULT", value)
    assert main(["serve", "--index", str(tmp_path / "no-index"), "--devices", "cpu,cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("lsr serve: error: LSR_SERVE_FAULT=") and message in err and len(err.splitlines()) == 1
