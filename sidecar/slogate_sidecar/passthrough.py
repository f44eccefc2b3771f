"""Requests the sidecar forwards without a decision (GET /v1/models, /health, llama-server's
admin API if exposed), and the upstream timeouts every forwarded call shares."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from slogate_sidecar import responses
from slogate_sidecar.state import Sidecar


def upstream_timeout(sidecar: Sidecar) -> aiohttp.ClientTimeout:
    """Connect within the connect timeout; then any silence past the read timeout fails (504)."""
    return aiohttp.ClientTimeout(
        total=None,
        sock_connect=sidecar.settings.upstream_connect_timeout_s,
        sock_read=sidecar.settings.upstream_read_timeout_s,
    )


async def passthrough(sidecar: Sidecar, request: web.Request) -> web.StreamResponse:
    """Forward a request as is (GET /v1/models, /health; llama-server's admin API if enabled)."""
    try:
        async with asyncio.timeout(sidecar.settings.client_read_timeout_s):
            data = await request.read()
    except TimeoutError:
        return responses.request_timeout()
    except web.HTTPRequestEntityTooLarge:
        return responses.error(
            413,
            f"request body over {sidecar.settings.max_body_bytes} bytes",
            kind="invalid_request_error",
            code="body_too_large",
        )
    except responses.BODY_ERRORS as broken:
        return responses.unreadable_body(broken)
    try:
        async with sidecar.client.request(
            request.method,
            sidecar.settings.upstream + request.path_qs,
            data=data,
            headers={k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")},
            timeout=upstream_timeout(sidecar),
        ) as upstream:
            payload = await upstream.read()
            return web.Response(body=payload, status=upstream.status, content_type=upstream.content_type)
    except (TimeoutError, aiohttp.ServerTimeoutError):
        return responses.error(504, "upstream llama-server timed out", kind="server_error", code="upstream_timeout")
    except aiohttp.ClientError:
        return responses.not_ready("upstream llama-server is unavailable")
