"""The pipelined batcher (lsr.serve.batcher with prepare / finish): the next batch is prepared while one is
on the device, results keep their requests, failures stay with their request; the app's stage timings."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lsr.serve.batcher import DynamicBatcher


def test_next_batch_is_prepared_while_one_is_on_the_device():
    """process(batch 1) waits until prepare(batch 2) has run: without pipelining this would time out."""
    prepared: list[list] = []
    second_prepared = threading.Event()
    threads: dict[str, set] = {"prepare": set(), "process": set(), "finish": set()}

    def prepare(items: list) -> list:
        threads["prepare"].add(threading.get_ident())
        prepared.append(list(items))
        if len(prepared) == 2:
            second_prepared.set()
        return [f"p{x}" for x in items]

    def process(state: list) -> list:
        threads["process"].add(threading.get_ident())
        if len(prepared) == 1:
            assert second_prepared.wait(10), "the second batch was not prepared during the first's device work"
        return [f"{x}!" for x in state]

    def finish(state: list) -> list:
        threads["finish"].add(threading.get_ident())
        return [s.upper() for s in state]

    async def run() -> list:
        b = DynamicBatcher(process, max_batch=2, max_wait_ms=50, prepare=prepare, finish=finish)
        first = [asyncio.ensure_future(b.submit(x)) for x in ("a", "b")]
        await asyncio.sleep(0.2)  # batch 1 is on the device, waiting for batch 2's prepare
        out = await asyncio.gather(*first, *[b.submit(x) for x in ("c", "d")])
        stats = b.stats.as_dict()
        await b.close()
        return out + [stats]

    *out, stats = asyncio.run(run())
    assert out == ["PA!", "PB!", "PC!", "PD!"]
    assert prepared == [["a", "b"], ["c", "d"]] and stats["batches"] == 2 and stats["errors"] == 0
    assert threads["prepare"] == threads["finish"] and not threads["prepare"] & threads["process"]


def test_pipelined_failures_stay_with_their_request():
    def prepare(items: list) -> list:
        if "bad-prepare" in items:
            raise ValueError("bad prepare")
        return items

    def process(items: list) -> list:
        if "bad" in items:
            raise ValueError("bad item")
        time.sleep(0.01)
        return [f"done {x}" for x in items]

    async def run() -> list:
        b = DynamicBatcher(process, max_batch=3, max_wait_ms=100, prepare=prepare, finish=list)
        items = ["a", "bad", "b", "c", "bad-prepare", "d", "e"]
        out = await asyncio.gather(*[b.submit(x) for x in items], return_exceptions=True)
        stats = b.stats.as_dict()
        await b.close()
        return out + [stats]

    *out, stats = asyncio.run(run())
    assert [o for i, o in enumerate(out) if i not in (1, 4)] == ["done a", "done b", "done c", "done d", "done e"]
    assert isinstance(out[1], ValueError) and isinstance(out[4], ValueError)
    assert stats["errors"] == 2 and stats["requests"] == 7


def test_close_fails_what_is_in_flight():
    release = threading.Event()

    def process(items: list) -> list:
        release.wait(10)
        return items

    async def run() -> object:
        b = DynamicBatcher(process, max_batch=1, max_wait_ms=0, prepare=list, finish=list)
        pending = asyncio.ensure_future(b.submit("x"))
        await asyncio.sleep(0.1)
        threading.Timer(0.2, release.set).start()  # close() waits for the device thread
        await b.close()
        try:
            return await pending
        except RuntimeError as e:
            return e

    assert isinstance(asyncio.run(run()), RuntimeError)


@pytest.mark.parametrize("pipeline", [True, False])
def test_app_reports_stage_timings(pipeline):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from lsr.index.inverted import InvertedIndex
    from lsr.serve import create_app
    from lsr.sparse import SparseVectors

    docs = SparseVectors.from_dicts([{1: 1.0, 2: 0.5}, {2: 2.0}, {3: 1.0}], vocab_size=8)
    app = create_app(InvertedIndex.build(docs), device="cpu", max_batch=8, max_wait_ms=50, k=2, pipeline=pipeline)

    async def run() -> tuple[list, dict]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            rs = await asyncio.gather(*[client.post("/search", json={"vectors": [{"2": w}]}) for w in (1.0, 2.0, 3.0)])
            return [r.json() for r in rs], (await client.get("/stats")).json()

    answers, stats = asyncio.run(run())
    assert [a["results"][0]["docnos"] for a in answers] == [["1", "0"]] * 3
    assert stats["pipeline"] is pipeline and stats["stage_batches"] == stats["batches"] >= 1
    assert set(stats["stage_ms_mean"]) == {"tokenize", "encode", "search", "answers", "json"}
    assert all(v >= 0 for v in stats["stage_ms_mean"].values())
