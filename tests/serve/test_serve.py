"""The search server (lsr.serve) on CPU: exact answers under concurrent load, dynamic batching, one-line errors.

Requests go through httpx's ASGI transport (no socket); the concurrent ones are gathered on one event loop, so
they reach the batcher together, as they would from many clients.
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from lsr.cli import main
from lsr.serve import create_app
from lsr.serve.batcher import DynamicBatcher
from lsr.testing import free_port
from tests.conftest import DATA
from tests.serve.conftest import SCIFACT_QUERIES, TEXTS, K, get, post_all, reference


def test_concurrent_text_queries_are_batched_and_equal_lsr_search(bm25):
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=32, max_wait_ms=200, k=K)
    responses = asyncio.run(post_all(app, [{"query": t} for t in TEXTS]))
    assert [r.status_code for r in responses] == [200] * len(TEXTS)
    got = [r.json()["results"][0] for r in responses]
    ref = reference(app, app.state.engine.encoder.encode_query(TEXTS), K)
    assert got == ref  # same docnos, bit-identical float32 scores
    for q, hits in zip(SCIFACT_QUERIES, got):  # and the run `lsr search` wrote
        assert hits["docnos"] == list(bm25["run"][q["_id"]])
        # the run holds the shortest text that reads back to the same float32
        assert np.array_equal(np.float32(hits["scores"]), np.float32(list(bm25["run"][q["_id"]].values())))
    stats = asyncio.run(get(app, "/stats")).json()
    assert stats["requests"] == stats["queries"] == len(TEXTS)
    assert stats["batches"] < len(TEXTS) and stats["mean_batch_queries"] > 1
    assert 1 < stats["max_batch_queries"] <= 32
    assert stats["errors"] == 0 and stats["queue_depth"] == 0 and stats["latency_ms"]["window"] == len(TEXTS)
    assert 0 < stats["latency_ms"]["p50"] <= stats["latency_ms"]["p99"] <= stats["latency_ms"]["max"]


def test_mixed_requests_in_one_batch_get_their_own_answers(bm25):
    """Texts, lists of texts and pre-encoded token vectors, each with its own k, batched together."""
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=64, max_wait_ms=200, k=K)
    encoder = app.state.engine.encoder
    vectors = encoder.encode_query(TEXTS[:6])
    token_rows = [{encoder.vocab[t]: w for t, w in row.items()} for row in vectors.to_dicts()]
    bodies = [{"query": TEXTS[0], "k": 3}, {"queries": TEXTS[1:4], "k": 7}, {"vectors": token_rows[4:6]},
              {"query": TEXTS[5], "k": 1}, {"vectors": token_rows[:1], "k": 5}]
    responses = asyncio.run(post_all(app, bodies))
    assert [r.status_code for r in responses] == [200] * len(bodies)
    ref = reference(app, vectors, K)
    top = lambda i, k: {"docnos": ref[i]["docnos"][:k], "scores": ref[i]["scores"][:k]}  # noqa: E731
    assert responses[0].json() == {"results": [top(0, 3)]}
    assert responses[1].json() == {"results": [top(1, 7), top(2, 7), top(3, 7)]}
    assert responses[2].json() == {"results": [top(4, K), top(5, K)]}
    assert responses[3].json() == {"results": [top(5, 1)]}
    assert responses[4].json() == {"results": [top(0, 5)]}
    stats = asyncio.run(get(app, "/stats")).json()
    assert stats["requests"] == 5 and stats["queries"] == 8 and stats["batches"] < 5


def test_batching_off_runs_one_request_per_batch(bm25):
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=1, max_wait_ms=50, k=5)
    responses = asyncio.run(post_all(app, [{"query": t} for t in TEXTS[:12]]))
    ref = reference(app, app.state.engine.encoder.encode_query(TEXTS[:12]), 5)
    assert [r.json()["results"][0] for r in responses] == ref
    stats = asyncio.run(get(app, "/stats")).json()
    assert stats["batches"] == stats["requests"] == 12 and stats["mean_batch_queries"] == 1


def test_term_id_vectors_and_padding_to_powers_of_two(bm25):
    """Without an encoder, vector keys are term ids; padded batches (as on CUDA) drop the copies' hits."""
    app = create_app(bm25["index"], device="cpu", max_batch=8, max_wait_ms=200, k=K, pad_batches=True)
    assert asyncio.run(get(app, "/health")).json()["vector_keys"] == "term_ids"
    from lsr.encode.bm25.lexical import LexicalEncoder

    vectors = LexicalEncoder.load(bm25["model"]).encode_query(TEXTS[:5])
    rows = [{str(t): w for t, w in row.items()} for row in vectors.to_dicts()]
    responses = asyncio.run(post_all(app, [{"vectors": [r]} for r in rows]))
    assert [r.json()["results"][0] for r in responses] == reference(app, vectors, K)
    bad = asyncio.run(post_all(app, [{"query": "cancer"}, {"vectors": [{"7": 1, "07": 2}]},
                                      {"vectors": [{"28865": 1}]}, {"vectors": [{"cell": 1}]},
                                      {"vectors": [{"1" * 30: 1}]}]))
    assert [r.status_code for r in bad] == [422] * 5 and "[0, 28865)" in bad[4].json()["error"]
    assert "no query encoder" in bad[0].json()["error"] and "term 7 is given twice" in bad[1].json()["error"]
    assert "[0, 28865)" in bad[2].json()["error"] and "keys must be term ids" in bad[3].json()["error"]
    odd = asyncio.run(post_all(app, [{"vectors": [{key: 1}]} for key in ("+7", " 7", "7_0", "\uff17")]))
    assert [r.status_code for r in odd] == [422] * 4   # int() would read each of them as a term id


def test_body_limits_stalls_disconnects_and_depth(bm25):
    """413 above the body limit, 408 for a body that stops arriving, one log line for a client that hung up,
    and a k far above the collection answered with at most its documents (no [queries x k] allocation)."""
    from starlette.requests import ClientDisconnect

    import lsr.serve.app as serve_app

    kw = {"device": "cpu", "max_batch": 4, "max_wait_ms": 1, "k": 10, "max_k": 10 ** 9, "warmup": False}
    small = create_app(bm25["index"], bm25["model"], body_limits=serve_app.BodyLimits(max_bytes=64), **kw)
    big = asyncio.run(post_all(small, [{"query": "x" * 100}]))[0]
    assert big.status_code == 413 and "64" in big.json()["error"]
    app = create_app(bm25["index"], bm25["model"], **kw)
    limits = serve_app.BodyLimits(max_bytes=1 << 20, timeout_s=0.05)

    class Stalled:
        headers: dict = {}

        async def stream(self):
            yield b'{"query": '
            await asyncio.sleep(5)

    class Gone(Stalled):
        async def stream(self):
            raise ClientDisconnect()
            yield b""

    assert asyncio.run(serve_app._read_body(Stalled(), limits)).status_code == 408
    assert asyncio.run(serve_app._read_body(Gone(), limits)).status_code == 400
    deep = asyncio.run(post_all(app, [{"query": TEXTS[0], "k": 10 ** 8}]))[0]
    n_docs = app.state.engine.index.n_docs
    assert deep.status_code == 200 and 0 < len(deep.json()["results"][0]["docnos"]) <= n_docs


BAD = [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b"{}", 422, "exactly one of"),
    (b'{"query": "a", "queries": ["b"]}', 422, "exactly one of"),
    (b'{"queries": []}', 422, "non-empty list of strings"),
    (b'{"query": 7}', 422, "non-empty list of strings"),
    (b'{"query": "a", "k": 0}', 422, "'k' must be an integer in [1, 1000]"),
    (b'{"query": "a", "k": 1001}', 422, "'k' must be an integer"),
    (b'{"query": "a", "k": 2.5}', 422, "'k' must be an integer"),
    (b'{"query": "a", "k": true}', 422, "'k' must be an integer"),
    (b'{"query": "a", "top": 3}', 422, "unknown field 'top'"),
    (b'{"vectors": {"cell": 1}}', 422, "non-empty list"),
    (b'{"vectors": [{"cell": -1}]}', 422, "weights must be finite, >= 0"),
    (b'{"vectors": [{"cell": NaN}]}', 422, "weights must be finite, >= 0"),
    (b'{"vectors": [{"cell": 1e300}]}', 422, "weights must be finite, >= 0"),
    (b'{"vectors": [{"cell": "x"}]}', 422, "weights must be numbers"),
    (b'{"vectors": [{"cell": true}]}', 422, "weights must be numbers"),
    (b'{"vectors": [{"no-such-token-xyz": 1}]}', 422, "not in the encoder vocabulary"),
    (json.dumps({"queries": ["a"] * 5000}).encode(), 413, "at most 4096"),
    (b'{"query": "a", "query": "b"}', 400, "the key 'query' is given twice"),       # JSON keeps the last silently
    (b'{"vectors": [{"cell": 1, "cell": 2}]}', 400, "the key 'cell' is given twice"),
    # malformed beyond what the decoder names: each once a plain-text 500
    (b"[" * 100_000, 400, "nests arrays or objects too deeply"),
    (b"[" * 1_000_000, 400, "nests arrays or objects too deeply"),        # decoded off the event loop
    (b'{"query": ' + b"[" * 5000, 400, "nests arrays or objects too deeply"),
    (b'{"query": "a", "k": ' + b"9" * 5000 + b"}", 422, "'k' must be an integer in [1, 1000], got an integer of "
     "5000 digits"),   # beyond int()'s 4300 digits: refused by the range, not with sys.set_int_max_str_digits()
    (b'{"query": "a", "k": 1e999}', 422, "'k' must be an integer"),
    (b'{"query": "a", "k": -Infinity}', 422, "'k' must be an integer"),
    (b'{"query": "a", "k": 99999999999999999999999}', 422, "'k' must be an integer"),
    (b'{"query": null}', 422, "non-empty list of strings"),
    (b'{"queries": ["a", 5]}', 422, "non-empty list of strings"),
    (b'{"vectors": [[1, 2]]}', 422, "non-empty list of {term: weight}"),
    (b'"a string"', 400, "JSON object"),
    (b"null", 400, "JSON object"),
    (b"", 400, "not valid JSON"),
    ('{"query": "caf\u00e9"}'.encode("latin-1"), 400, "not valid JSON"),    # Latin-1, not UTF-8
    (b'{"' + b"x" * 1_000_000 + b'": 1}', 422, "unknown field"),
]


def test_bad_requests_get_a_one_line_json_error(bm25):
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=8, max_wait_ms=1, k=10)

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lsr") as client:
            out = [await client.post("/search", content=body) for body, _, _ in BAD]
            out += [await client.get("/nowhere"), await client.get("/search"), await client.post("/health")]
            return out

    responses = asyncio.run(send())
    for (body, status, text), r in zip(BAD, responses):
        assert r.status_code == status, body
        error = r.json()["error"]
        assert text in error and "\n" not in error and "Traceback" not in error, (body[:40], error)
        assert len(error) <= 500, body[:40]  # one line, not the body quoted back
    assert [r.status_code for r in responses[len(BAD):]] == [404, 405, 405]
    assert all(set(r.json()) == {"error"} for r in responses[len(BAD):])
    stats = asyncio.run(get(app, "/stats")).json()
    assert stats["requests"] == 0  # bad requests never reach the device
    # the server still answers after all that
    ok = asyncio.run(post_all(app, [{"query": TEXTS[0], "k": 2}]))[0]
    assert ok.status_code == 200 and len(ok.json()["results"][0]["docnos"]) == 2


def test_an_unexpected_failure_is_a_json_500(bm25):
    """Whatever fails inside the app (here a route added to it that raises) answers JSON, not plain text."""
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=2, max_wait_ms=1, k=5, warmup=False)

    async def broken() -> None:
        raise KeyError("boom")

    app.add_api_route("/broken", broken)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://lsr") as client:
            return await client.get("/broken")

    r = asyncio.run(get())
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json() == {"error": "the server failed on this request: KeyError: 'boom'"}


def test_health_describes_the_server(bm25):
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=16, max_wait_ms=3, k=10)
    health = asyncio.run(get(app, "/health")).json()
    assert health["status"] == "ok" and health["n_docs"] == 5183 and health["encoder"] == "bm25"
    assert health["device"] == "cpu" and health["backend"] == "torch" and health["vector_keys"] == "tokens"
    assert (health["max_batch"], health["max_wait_ms"], health["k"], health["max_k"]) == (16, 3, 10, 1000)


def test_splade_text_queries_through_the_server(tmp_path):
    """A tiny SPLADE model: served hits are the Searcher's for the same texts. The encoder's float32 output
    depends on the batch's padding by an ulp, so scores are compared to 1e-5 and documents by score."""
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.index.inverted import InvertedIndex

    enc = SpladeEncoder.from_pretrained(DATA / "models" / "splade-tiny", device="cpu", max_length_doc=32)
    corpus = [json.loads(line) for line in (DATA / "scifact" / "corpus.jsonl").read_text().splitlines()[:60]]
    docs = enc.encode_document([d["title"] for d in corpus], ids=[d["_id"] for d in corpus])
    InvertedIndex.build(docs, metadata=enc.describe()).save(tmp_path / "idx")
    app = create_app(tmp_path / "idx", DATA / "models" / "splade-tiny", device="cpu", max_batch=16,
                     max_wait_ms=300, k=10)
    texts = [d["title"] for d in corpus[:10]] + TEXTS[:6]  # titles find their own document first
    responses = asyncio.run(post_all(app, [{"query": t} for t in texts]))
    got = [r.json()["results"][0] for r in responses]
    ref = reference(app, app.state.engine.encoder.encode_query(texts), 10)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g["scores"], r["scores"], rtol=1e-5)
        assert set(g["docnos"]) == set(r["docnos"]) or g["scores"][-1] == pytest.approx(r["scores"][-1], rel=1e-5)
    assert [g["docnos"][0] for g in got[:10]] == [d["_id"] for d in corpus[:10]]
    stats = asyncio.run(get(app, "/stats")).json()
    assert stats["mean_batch_queries"] > 1 and stats["errors"] == 0


def test_batcher_bounds_batches_and_isolates_failures():
    seen: list[list] = []

    def process(items: list) -> list:
        seen.append(list(items))
        if "bad" in items:
            raise ValueError("bad item")
        return [f"done {x}" for x in items]

    async def run() -> list:
        b = DynamicBatcher(process, max_batch=4, max_wait_ms=100)
        sizes = {"big": 9}
        items = ["a", "b", "big", "c", "bad", "d"]
        out = await asyncio.gather(*[b.submit(x, sizes.get(x, 1)) for x in items], return_exceptions=True)
        stats = b.stats.as_dict()
        await b.close()
        return out + [stats]

    *out, stats = asyncio.run(run())
    assert out[:4] == ["done a", "done b", "done big", "done c"] and out[5] == "done d"
    assert isinstance(out[4], ValueError)
    assert all(sum(9 if x == "big" else 1 for x in batch) <= 4 or batch == ["big"] for batch in seen)
    assert ["big"] in seen  # larger than max_batch: alone
    assert stats["errors"] == 1 and stats["requests"] == 6 and stats["queries"] == 14


def test_batcher_drops_queued_requests_whose_caller_left():
    """While a batch is on the device, three requests queue: one whose awaiting task is cancelled, one whose
    client hung up (its ``gone`` check says so), one still wanted. Only the last is searched. Events order the
    steps (no sleeps): the device thread holds the first batch until the queue is set up."""
    import threading

    from lsr.serve.batcher import ClientGone

    seen: list[list] = []
    on_device, release = threading.Event(), threading.Event()

    def process(items: list) -> list:
        seen.append(list(items))
        if items == ["first"]:
            on_device.set()
            assert release.wait(30)
        return [f"done {x}" for x in items]

    async def run() -> tuple:
        b = DynamicBatcher(process, max_batch=1, max_wait_ms=0)
        first = asyncio.ensure_future(b.submit("first"))
        assert await asyncio.get_running_loop().run_in_executor(None, on_device.wait, 30)
        left = asyncio.ensure_future(b.submit("cancelled"))
        hung_up = asyncio.ensure_future(b.submit("hung up", gone=lambda: True))
        kept = asyncio.ensure_future(b.submit("kept", gone=lambda: False))
        while b.queue_depth < 3:
            await asyncio.sleep(0)
        left.cancel()
        release.set()
        out = await asyncio.gather(first, left, hung_up, kept, return_exceptions=True)
        stats = b.stats.as_dict()
        await b.close()
        return out, stats

    out, stats = asyncio.run(run())
    assert seen == [["first"], ["kept"]]
    assert out[0] == "done first" and out[3] == "done kept"
    assert isinstance(out[1], asyncio.CancelledError) and isinstance(out[2], ClientGone)
    assert stats["requests"] == 2 and stats["dropped"] == 2


def test_a_request_whose_client_hung_up_is_not_searched(bm25):
    """The ASGI server answers ``receive()`` with http.disconnect once the client left (uvicorn does, and cancels
    nothing): such a request is dropped when its batch is formed, and /stats counts it."""
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=8, max_wait_ms=1, k=5, warmup=False)
    body = json.dumps({"query": TEXTS[0]}).encode()

    async def hung_up_post() -> list[dict]:
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/search", "raw_path": b"/search", "root_path": "", "query_string": b"",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 5000), "server": ("lsr", 80)}
        await app(scope, receive, send)
        return sent

    sent = asyncio.run(hung_up_post())
    assert sent[0]["status"] == 499
    stats = asyncio.run(get(app, "/stats")).json()
    assert stats["dropped"] == 1 and stats["requests"] == stats["batches"] == 0  # never searched
    ok = asyncio.run(post_all(app, [{"query": TEXTS[0], "k": 2}]))[0]  # a client that stays is answered
    assert ok.status_code == 200 and len(ok.json()["results"][0]["docnos"]) == 2
    assert asyncio.run(get(app, "/stats")).json()["dropped"] == 1


def test_uvicorn_on_loopback_under_the_closed_loop_client(bm25):
    """The real HTTP stack: uvicorn in a thread, lsr.benchmarks.loadgen's keep-alive connections."""
    import gc
    import threading
    import time
    import urllib.request

    import uvicorn

    from lsr.benchmarks.loadgen import run_load

    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=16, max_wait_ms=20, k=5)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive()
            time.sleep(0.02)
        bodies = [json.dumps({"query": t, "k": 5}).encode() for t in TEXTS[:16]]
        load = run_load("127.0.0.1", port, bodies, concurrency=8, duration_s=1.0, warmup_s=0.2, keep=16)
        frozen = gc.get_freeze_count()
        gc.collect()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
            stats = json.loads(r.read())
    finally:
        server.should_exit = True
        thread.join(10)
    # startup froze what warm-up left alive, shutdown unfroze it; /stats counts the collector's pauses
    assert frozen > 1000 and gc.get_freeze_count() == 0
    assert stats["freeze_gc"] is True and stats["gc"]["collections"][2] >= 1 and stats["gc"]["frozen"] > 1000
    assert sorted(stats["compiled"]) == ["cuda_kernel_variants", "search_graph_captures"]
    assert all(isinstance(n, int) and n >= 0 for n in stats["compiled"].values())
    assert stats["disabled"] == {}   # no route of this process failed
    assert load["errors"] == 0 and load["ok"] > 0 and len(load["latencies_ms"]) == load["ok"]
    assert load["client_gc_full"] >= 0
    ref = reference(app, app.state.engine.encoder.encode_query(TEXTS[:16]), 5)
    assert {i: json.loads(a)["results"][0] for i, a in load["answers"].items()} == dict(enumerate(ref))
    assert app.state.batcher.stats.as_dict()["mean_batch_queries"] > 1


def test_gc_watch_counts_collections_by_generation():
    import gc

    from lsr.serve.gcwatch import GcWatch, frozen

    gc.unfreeze()   # whatever an earlier test left frozen
    watch = GcWatch()
    try:
        gc.collect()
        gc.collect(0)
        got = watch.as_dict()
        assert got["collections"][2] >= 1 and got["collections"][0] >= 1
        assert got["max_pause_ms"][2] > 0 and got["pause_ms"][2] >= got["max_pause_ms"][2]
        # (frozen objects that die leave the permanent generation: counts are compared as > 0 only)
        with frozen() as outer:
            with frozen() as inner:   # a second user (the load generator beside a server) leaves it as it is
                pass
            assert outer and not inner and gc.get_freeze_count() > 0 and watch.as_dict()["frozen"] > 0
        assert gc.get_freeze_count() == 0
        with frozen(False) as froze:
            assert not froze and gc.get_freeze_count() == 0
    finally:
        watch.close()
    n = watch.as_dict()["collections"][2]
    gc.collect()
    assert watch.as_dict()["collections"][2] == n, "closed: no longer called"


def test_frozen_freezes_where_objects_were_frozen_before():
    """Python 3.12 starts with objects in the permanent generation: the server must freeze all the same."""
    import gc

    from lsr.serve.gcwatch import frozen

    gc.unfreeze()
    early = [[i] for i in range(50)]
    gc.freeze()                           # a few objects frozen before the server starts
    before = gc.get_freeze_count()
    try:
        late = [[i] for i in range(5000)]  # alive at warm-up's end
        with frozen() as froze:
            assert froze and gc.get_freeze_count() >= before + 5000
        assert gc.get_freeze_count() == 0, "unfrozen when the block ends"
    finally:
        gc.unfreeze()
    del early, late


def test_frozen_interrupted_before_freezing_leaves_later_blocks_free_to_freeze(monkeypatch):
    import gc

    from lsr.serve import gcwatch

    def interrupted(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(gcwatch.gc, "collect", interrupted)
        with pytest.raises(KeyboardInterrupt):
            with gcwatch.frozen():
                pass
    with gcwatch.frozen() as froze:
        assert froze and gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_gc_watch_survives_a_collection_inside_as_dict():
    """as_dict allocates while holding the watch's lock; a collection starting there calls the watch on the same
    thread (a plain lock hung /stats, and with it the event loop)."""
    import gc
    import threading

    from lsr.serve.gcwatch import GcWatch

    watch, old = GcWatch(), gc.get_threshold()
    keep = []

    def poll() -> None:
        for _ in range(3000):
            keep.append([{}])   # live containers: collections keep starting
            watch.as_dict()

    gc.set_threshold(1, 1, 1)
    try:
        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "as_dict deadlocked with the collector"
    finally:
        gc.set_threshold(*old)
        watch.close()
    assert watch.as_dict()["collections"][0] > 0


def test_serve_without_the_extra_names_it(monkeypatch, capsys, bm25):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    assert main(["serve", "--index", str(bm25["index"]), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install lsr-gpu[serve]" in err


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--port", "99999", "must be an integer in [1, 65535], got 99999"),
    ("--port", "0", "must be an integer in [1, 65535], got 0"),
    ("--max-wait-ms", "-1", "must be a number in [0, 60000], got -1"),
    ("--max-wait-ms", "nan", "must be a number in [0, 60000], got nan"),
    ("--max-wait-ms", "inf", "must be a number in [0, 60000], got inf"),
    ("--max-batch", "0", "must be an integer in [1, 65536], got 0"),
    ("--switch-interval-ms", "0", "must be a number in (0, 1000], got 0"),
    ("--request-timeout", "0", "must be a number in (0, 3600], got 0"),
    ("--batch-timeout", "nan", "must be a number in (0, 3600], got nan"),
    ("--batch-timeout", "-1", "must be a number in (0, 3600], got -1"),
    ("--k", "-3", "must be >= 1, got -3"),
    ("--max-k", "2.5", "expected an integer (>= 1), got '2.5'"),
])
def test_serve_names_the_bad_flag_its_value_and_range(capsys, flag, value, message):
    """Each out-of-range flag exits 2 before the index loads (it does not exist here) with one line naming it."""
    assert main(["serve", "--index", "no-such-index", flag, value]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"lsr serve: error: argument {flag}: {message}"


def test_serve_rejects_bad_options(capsys, bm25):
    with pytest.raises(ValueError, match=r"max_batch must be an integer in \[1, 65536\], got 0"):
        create_app(bm25["index"], device="cpu", max_batch=0)
    with pytest.raises(ValueError, match=r"max_wait_ms must be a number in \[0, 60000\], got nan"):
        create_app(bm25["index"], device="cpu", max_wait_ms=float("nan"))
    with pytest.raises(ValueError, match=r"request_timeout_s must be a number in \(0, 3600\], got 0"):
        create_app(bm25["index"], device="cpu", request_timeout_s=0)
    with pytest.raises(ValueError, match=r"batch_timeout_s must be a number in \(0, 3600\], got inf"):
        create_app(bm25["index"], device="cpu", batch_timeout_s=float("inf"))
    assert main(["serve", "--index", str(bm25["index"]), "--k", "5000", "--max-k", "100"]) == 2
    assert "--k (5000) must lie in [1, --max-k=100]" in capsys.readouterr().err


@pytest.mark.gpu
def test_served_hits_keep_the_exact_contract_on_cuda(bm25):
    """On CUDA (Triton path, padded batches, CUDA graphs) every served top-k is exact against float64."""
    import torch

    from lsr.testing import assert_exact_topk, float64_scores

    app = create_app(bm25["index"], bm25["model"], device="cuda", max_batch=16, max_wait_ms=50, k=K)
    responses = asyncio.run(post_all(app, [{"query": t} for t in TEXTS]))
    engine = app.state.engine
    position = {d: i for i, d in enumerate(engine.index.docnos)}
    scores = torch.zeros(len(TEXTS), K, dtype=torch.float32)
    idx = torch.full((len(TEXTS), K), -1, dtype=torch.int64)
    for row, r in enumerate(responses):
        hits = r.json()["results"][0]
        scores[row, :len(hits["scores"])] = torch.tensor(hits["scores"], dtype=torch.float32)
        idx[row, :len(hits["docnos"])] = torch.tensor([position[d] for d in hits["docnos"]])
    ref = float64_scores(engine.encoder.encode_query(TEXTS), engine.index.docs.to("cpu"))
    assert_exact_topk(scores, idx, ref, K)
    assert asyncio.run(get(app, "/stats")).json()["mean_batch_queries"] > 1
