"""Requests the sidecar forwards without a decision (GET /v1/models, /health, llama-server's
admin API if exposed), and what every forwarded call shares: the upstream timeouts, and the
answer to an upstream that failed."""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web

from slogate_sidecar import responses
from slogate_sidecar.body import read_body
from slogate_sidecar.state import Sidecar

log = logging.getLogger("slogate.sidecar")


def upstream_timeout(sidecar: Sidecar) -> aiohttp.ClientTimeout:
    """Connect within the connect timeout; then any silence past the read timeout fails (504)."""
    return aiohttp.ClientTimeout(
        total=None,
        sock_connect=sidecar.settings.upstream_connect_timeout_s,
        sock_read=sidecar.settings.upstream_read_timeout_s,
    )


def upstream_failure(sidecar: Sidecar, failure: BaseException, *, started: bool = False) -> web.Response:
    """Count a failed upstream exchange and answer it: 503 if the connection was refused (the
    upstream is marked down at once, so readiness and the next arrivals need not wait for a
    poll), 504 if it was too slow, else 502. ``started``: the answer's headers were already
    sent (a stream cut mid-way), so only the log and the count are of use."""
    if isinstance(failure, aiohttp.ClientConnectorError):
        sidecar.upstream_up = False
        sidecar.metrics.record_upstream_error("unreachable")
        log.warning("upstream %s unreachable: %s", sidecar.settings.upstream, failure)
        return responses.not_ready("upstream llama-server is unavailable")
    if isinstance(failure, TimeoutError | aiohttp.ServerTimeoutError):
        sidecar.metrics.record_upstream_error("timeout")
        return responses.error(504, "upstream llama-server timed out", kind="server_error", code="upstream_timeout")
    sidecar.metrics.record_upstream_error("aborted")
    log.warning("upstream failed%s: %r", " mid-stream" if started else "", failure)
    return responses.error(
        502, f"upstream llama-server failed: {failure!r}", kind="server_error", code="upstream_error"
    )


async def passthrough(sidecar: Sidecar, request: web.Request) -> web.StreamResponse:
    """Forward a request as is (GET /v1/models, /health; llama-server's admin API if enabled).

    The upstream's own answer is relayed whatever its status (a loading llama-server's 503
    on /health is news for the caller, not a failed exchange)."""
    settings = sidecar.settings
    data = await read_body(request, timeout_s=settings.client_read_timeout_s, max_bytes=settings.max_body_bytes)
    try:
        async with sidecar.client.request(
            request.method,
            settings.upstream + request.path_qs,
            data=data,
            headers={k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")},
            timeout=upstream_timeout(sidecar),
        ) as upstream:
            payload = await upstream.read()
            return web.Response(body=payload, status=upstream.status, content_type=upstream.content_type)
    except (aiohttp.ClientError, TimeoutError) as failure:
        return upstream_failure(sidecar, failure)
