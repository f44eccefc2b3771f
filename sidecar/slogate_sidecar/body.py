"""Reading a request's body: the one read, on either port.

A body that cannot be read becomes a ``BadRequest``, as one that cannot be parsed does, and
the error middleware (``app.json_errors``) answers it: handlers never phrase these refusals.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from slogate_sidecar.bad_request import BadRequest

BODY_ERRORS = (HttpProcessingError, RequestPayloadError)
"""What reading a request body raises when its framing or encoding is broken (bad
chunking, a Content-Encoding it does not have): the client's fault, a 400."""


async def read_body(request: web.Request, *, timeout_s: float, max_bytes: int, what: str = "request body") -> bytes:
    """The whole body; ``BadRequest`` 408 if it is not in within ``timeout_s``, 413 past
    ``max_bytes`` (the application's ``client_max_size``), 400 if it is unreadable."""
    try:
        # A client that trickles its body (slowloris) is cut off, not waited for. read()
        # reads the whole body (content.read(n) may stop at any chunk boundary) and raises
        # 413 past the application's client_max_size, decompressed size included.
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise BadRequest("request body not received in time", status=408, code="request_timeout") from None
    except web.HTTPRequestEntityTooLarge:
        raise BadRequest(f"{what} over {max_bytes} bytes", status=413, code="body_too_large") from None
    except BODY_ERRORS as broken:
        reason = getattr(broken, "message", None) or str(broken)
        raise BadRequest(f"request body unreadable: {str(reason).strip()}", code="invalid_body") from None
