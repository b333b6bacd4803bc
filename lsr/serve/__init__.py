"""Serving: an HTTP/JSON search endpoint that batches concurrent requests on one device or several.

Module map:

* ``engine``: ``SearchEngine``, the index + Searcher + optional query encoder; parses request bodies into
  queries (one-line errors) and searches a batch of requests in one encoder call and one search.
* ``body``: request bodies as JSON (one-line ``RequestError``; an integer too long for ``int()`` kept as a
  ``LongInt`` for its field's range check) and the request's ``timeout_ms``.
* ``batcher``: ``DynamicBatcher``, one asyncio worker that gathers concurrent requests up to ``max_batch``
  queries or ``max_wait_ms`` after the first, runs the batch in a worker thread and resolves each future;
  it keeps the request / batch / latency statistics and the batch deadline (``DeviceHung``).
* ``replicas``: ``ReplicaSet``, one engine and batcher per device behind the endpoint; each request goes to the
  least-loaded serving replica, a replica that fails what another answers is taken out, and one past its batch
  deadline is out until its batch returns.
* ``faults``: ``LSR_SERVE_FAULT``, the hook that makes replicas' devices hang (tests and drills).
* ``app``: ``create_app``, the FastAPI application (``POST /search``, ``GET /health``, ``GET /stats``) and the
  request deadline.
* ``protocol``: uvicorn's HTTP protocol answering an unparsable request with the one-line JSON error.
* ``limits``: the allowed values of the batching and deadline options (``lsr serve``'s flags and
  ``create_app`` alike).
* ``cli``: ``lsr serve`` (uvicorn).

FastAPI and uvicorn are the optional extra ``serve`` (``pip install lsr-gpu[serve]``); importing this package
imports neither (``create_app`` loads them when called).
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from lsr.serve.app import create_app

        return create_app
    raise AttributeError(f"module 'lsr.serve' has no attribute {name!r}")
