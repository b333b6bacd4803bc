"""uvicorn's HTTP protocol with the server's one-line JSON error for a request it cannot parse.

A request line or header that is not HTTP/1.1 (``GARBAGE\\r\\n\\r\\n``, binary bytes, a header block beyond the
parser's limit) never reaches the app: uvicorn's parser answers it itself, ``400 Invalid HTTP request
received.`` as plain text, and closes the connection. ``json_error_protocol`` gives uvicorn's protocol class
(h11, or httptools where installed, as uvicorn picks) with that answer replaced by the documented
``{"error": "..."}`` (still 400, still closing: the stream cannot be read further). ``lsr serve`` runs uvicorn
with it.
"""

from __future__ import annotations

import asyncio
import json
import logging

__all__ = ["BAD_REQUEST_ERROR", "json_error_protocol"]

log = logging.getLogger(__name__)

BAD_REQUEST_ERROR = ("the request is not valid HTTP/1.1 (its request line or headers could not be parsed); "
                     "send e.g. POST /search with a JSON body such as {\"query\": \"...\", \"k\": 10}")


def json_error_protocol(http: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's protocol class for ``http`` ("auto", "h11", "httptools") answering an unparsable request with
    ``{"error": BAD_REQUEST_ERROR}``; the class itself where this uvicorn has no ``send_400_response`` to
    replace (a warning says so)."""
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    base = import_from_string(HTTP_PROTOCOLS[http])
    if not callable(getattr(base, "send_400_response", None)):
        log.warning("uvicorn's %s answers unparsable requests in plain text (no send_400_response)", base.__name__)
        return base

    class JsonErrorProtocol(base):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"error": BAD_REQUEST_ERROR}).encode()
            head = [b"HTTP/1.1 400 Bad Request"]
            head += [name + b": " + value for name, value in self.server_state.default_headers]   # date, server
            head += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(),
                     b"connection: close"]
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            self.transport.close()

    JsonErrorProtocol.__name__ = JsonErrorProtocol.__qualname__ = f"JsonError{base.__name__}"
    return JsonErrorProtocol
