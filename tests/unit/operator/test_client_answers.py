"""The operator's API client reads answers as kube-apiserver writes them, JSON or not.

Found on the real API server (e2e): a path of an API group the server does not serve (KEDA's
scaledobjects with no KEDA installed) is answered 404 with the plain text "404 page not
found", not a JSON Status. The client took the undecodable body for a broken connection,
retried it four times and reported the server "Unreachable"; the policy then said ApiError
instead of KedaNotInstalled.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import kopf
import pytest
from aiohttp import web

from slogate_operator.client import SCALED_OBJECTS, ApiError, KubeClient, NotFoundError


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    calls: list[str] = []

    async def unknown_group(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.Response(status=404, text="404 page not found\n", content_type="text/plain")

    async def not_json_ok(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.Response(status=200, text="<html>a proxy's page</html>", content_type="text/html")

    async def status_404(request: web.Request) -> web.Response:
        calls.append(request.path)
        body = {"kind": "Status", "reason": "NotFound", "message": 'deployments.apps "x" not found', "code": 404}
        return web.Response(status=404, text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/apis/keda.sh/v1alpha1/namespaces/llm/scaledobjects", unknown_group)
    app.router.add_get("/apis/keda.sh/v1alpha1/namespaces/llm/scaledobjects/x", unknown_group)
    app.router.add_get("/html", not_json_ok)
    app.router.add_get("/apis/apps/v1/namespaces/llm/deployments/x", status_404)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", calls
    finally:
        await runner.cleanup()


def client(base: str) -> KubeClient:
    return KubeClient(lambda: kopf.ConnectionInfo(server=base), retries=4, backoff_s=0.0)


async def test_a_plain_text_404_is_not_found_at_once(server: tuple[str, list[str]]) -> None:
    base, calls = server
    async with client(base) as kube:
        with pytest.raises(NotFoundError) as raised:
            await kube.list(SCALED_OBJECTS, "llm")
        assert await kube.get(SCALED_OBJECTS, "llm", "x") is None
    assert raised.value.status == 404
    assert "404 page not found" in str(raised.value)
    assert len(calls) == 2  # one call each: a 404 is an answer, never retried


async def test_a_json_status_keeps_its_reason_and_message(server: tuple[str, list[str]]) -> None:
    base, _ = server
    async with client(base) as kube:
        with pytest.raises(NotFoundError) as raised:
            await kube.request("GET", "/apis/apps/v1/namespaces/llm/deployments/x")
    assert raised.value.reason == "NotFound"
    assert 'deployments.apps "x" not found' in str(raised.value)


async def test_a_success_that_is_not_json_is_a_clear_error(server: tuple[str, list[str]]) -> None:
    base, calls = server
    async with client(base) as kube:
        with pytest.raises(ApiError) as raised:
            await kube.request("GET", "/html")
    assert (raised.value.status, raised.value.reason) == (200, "NotJSON")
    assert "a proxy's page" in str(raised.value)
    assert len(calls) == 1
