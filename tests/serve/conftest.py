"""What the serving tests share: a BM25 index of SciFact with `lsr search`'s run, and ASGI request helpers.

Requests go through httpx's ASGI transport (no socket); the concurrent ones are gathered on one event loop, so
they reach the batcher together, as they would from many clients.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from lsr.cli import main
from lsr.data.runs import read_trec
from tests.conftest import DATA

SCIFACT_QUERIES = [json.loads(line) for line in (DATA / "scifact" / "queries.jsonl").read_text().splitlines()][:120]
TEXTS = [q["text"] for q in SCIFACT_QUERIES]
K = 20


@pytest.fixture(scope="session")
def bm25(tmp_path_factory):
    """A BM25 index of SciFact, its fitted encoder and `lsr search`'s run for the first 120 queries."""
    out = tmp_path_factory.mktemp("bm25")
    assert main(["encode", "--dataset", str(DATA / "scifact"), "--out", str(out / "vec"), "--device", "cpu"]) == 0
    assert main(["index", "--vectors", str(out / "vec"), "--out", str(out / "idx"), "--device", "cpu"]) == 0
    queries = out / "queries"  # a BEIR folder holding the first 120 queries (the corpus is linked)
    queries.mkdir()
    (queries / "corpus.jsonl").symlink_to(DATA / "scifact" / "corpus.jsonl")
    (queries / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in SCIFACT_QUERIES))
    assert main(["search", "--index", str(out / "idx"), "--queries", str(queries), "--model", str(out / "vec" / "encoder"),
                 "--out", str(out / "run.trec"), "--k", str(K), "--device", "cpu"]) == 0
    return {"index": out / "idx", "model": out / "vec" / "encoder", "run": read_trec(out / "run.trec")}


async def post_all(app, bodies: list[dict]) -> list:
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lsr") as client:
        return await asyncio.gather(*[client.post("/search", json=b) for b in bodies])


async def get(app, path: str):
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lsr") as client:
        return await client.get(path)


def reference(app, vectors, k: int) -> list[dict]:
    """Searcher.search over all the queries in one call: {"docnos", "scores"} per query (no padding)."""
    engine = app.state.engine
    scores, idx = engine.searcher.search(vectors, k=k)
    out = []
    for s, d in zip(scores.numpy(), idx.numpy()):
        keep = d >= 0
        out.append({"docnos": [engine.index.docnos[j] for j in d[keep]], "scores": s[keep].tolist()})
    return out


def http(port: int, path: str, body: dict | bytes | None = None, timeout: float = 60) -> tuple[int, dict, dict]:
    """One request to a server on 127.0.0.1:``port`` (POST when there is a body): the status, the headers
    (lower-case names) and the JSON answer, whatever the status."""
    import urllib.error
    import urllib.request

    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read())


def run_hits(run: dict, qid: str) -> dict:
    """`lsr search`'s hits of one query as the server answers them: docnos and float32 scores, best first."""
    import numpy as np

    return {"docnos": list(run[qid]), "scores": np.float32(list(run[qid].values())).tolist()}
