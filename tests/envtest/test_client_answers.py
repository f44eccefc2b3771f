"""The operator's API client reads answers as kube-apiserver writes them, JSON or not.

Found on the real API server (e2e): a path of an API group the server does not serve (KEDA's
scaledobjects with no KEDA installed) is answered 404 with the plain text "404 page not
found", not a JSON Status. The client took the undecodable body for a broken connection,
retried it four times and reported the server "Unreachable"; the policy then said ApiError
instead of KedaNotInstalled.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import kopf
import pytest
from aiohttp import web

from api_cluster import Cluster
from slogate_operator.client import SCALED_OBJECTS, ApiError, KubeClient, NotFoundError


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    """What no real API server answers, but a proxy in front of one may: a non-JSON 200."""
    calls: list[str] = []

    async def not_json_ok(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.Response(status=200, text="<html>a proxy's page</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/html", not_json_ok)
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


async def test_a_plain_text_404_is_not_found_at_once(cluster: Cluster) -> None:
    """On the real API server, without KEDA's CRD: keda.sh is not served."""
    async with client(cluster.url) as kube:
        with pytest.raises(NotFoundError) as raised:
            await kube.list(SCALED_OBJECTS, "llm")
        # delete, not get: the operator's role grants no get on scaledobjects, and the server
        # authorizes before it finds no such API (it would say 403 first).
        assert await kube.delete(SCALED_OBJECTS, "llm", "x") is False
    assert raised.value.status == 404
    assert "404 page not found" in str(raised.value)
    keda = [c for c in cluster.received() if c.resource is not None and c.resource.group == "keda.sh"]
    assert len(keda) == 2  # one call each: a 404 is an answer, never retried


async def test_a_json_status_keeps_its_reason_and_message(cluster: Cluster) -> None:
    async with client(cluster.url) as kube:
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
