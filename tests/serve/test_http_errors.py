"""What `lsr serve` answers beyond well-formed searches: a request the HTTP parser cannot read gets the documented
one-line JSON error (not uvicorn's plain text), FastAPI's /docs, /redoc and /openapi.json are off unless
--openapi, and an integer too long for Python's int() is refused by its field's range (not with Python's advice
to raise sys.set_int_max_str_digits())."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from lsr.benchmarks.servers import ProcessServers
from lsr.serve import create_app
from tests.serve.conftest import TEXTS, get, http

DOC_ROUTES = ("/docs", "/redoc", "/openapi.json")


@pytest.fixture(scope="module")
def served(bm25, tmp_path_factory):
    """`lsr serve` on CPU with its default flags, in a process of its own: its port."""
    servers = ProcessServers(bm25["index"], str(bm25["model"]), ["cpu"], ["--no-warmup"],
                             tmp_path_factory.mktemp("serve-logs"))
    yield servers.ports[0]
    servers.stop()


def raw_exchange(port: int, data: bytes) -> tuple[str, dict[str, str], bytes]:
    """``data`` sent as it is over one connection: the status line, headers and body of what comes back."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return status, {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}, body


@pytest.mark.parametrize("data", [
    b"GARBAGE\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)) + b"\r\n\r\n",   # a TLS hello to plain HTTP
    b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
], ids=["request-line", "binary", "bad-header"])
def test_a_request_the_http_parser_cannot_read_gets_one_line_of_json(served, data):
    status, headers, body = raw_exchange(served, data)
    assert status.startswith("HTTP/1.1 400"), status
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body) and b"\n" not in body
    error = json.loads(body)["error"]
    assert set(json.loads(body)) == {"error"} and "not valid HTTP/1.1" in error and "POST /search" in error
    assert http(served, "/health")[0] == 200   # the server goes on


def test_the_api_docs_are_off_on_the_search_port_by_default(served, bm25):
    for path in DOC_ROUTES:
        status, _, answer = http(served, path)
        assert status == 404 and set(answer) == {"error"}, path
    app = create_app(bm25["index"], bm25["model"], device="cpu", warmup=False, openapi=True)   # --openapi
    for path in DOC_ROUTES:
        assert asyncio.run(get(app, path)).status_code == 200, path
    assert asyncio.run(get(app, "/openapi.json")).json()["info"]["title"] == "lsr search"


def test_an_integer_too_long_for_int_is_refused_by_its_fields_range(served):
    """JSON puts no bound on an integer's digits; Python's int() refuses more than 4,300 (quadratic time) and
    advises sys.set_int_max_str_digits(), which a client cannot call: the field's own range is named instead."""
    long = b"1" + b"0" * 5000
    cases = [
        (b'{"query": "a", "k": ' + long + b"}", "'k' must be an integer in [1, 1000], got an integer of 5001 digits"),
        (b'{"query": "a", "k": -' + long + b"}", "'k' must be an integer in [1, 1000], got a negative integer"),
        (b'{"vectors": [{"cell": ' + long + b"}]}", "vector 0: weights must be finite, >= 0 and <="),
        (b'{"queries": ["a", ' + long + b"]}", "'queries' must be a non-empty list of strings"),
        (b'{"query": "a", "k": [' + long + b"]}", "'k' must be an integer in [1, 1000], got [\"an integer of 5001"),
    ]
    for body, message in cases:
        status, headers, answer = http(served, "/search", body)
        assert status == 422 and headers["content-type"] == "application/json", (body[:30], answer)
        assert answer["error"].startswith(message) and "set_int_max_str_digits" not in answer["error"], answer
    status, _, answer = http(served, "/search", {"query": TEXTS[0], "k": 10 ** 30})   # an int() converts: as before
    assert status == 422 and answer["error"] == f"'k' must be an integer in [1, 1000], got {10 ** 30}"
