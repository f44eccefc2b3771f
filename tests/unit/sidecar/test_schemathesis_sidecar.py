"""schemathesis against the sidecar's own OpenAPI description, on a live sidecar.

The description shipped in the package (slogate_sidecar/openapi.yaml) is loaded as
is; schemathesis generates schema-valid and schema-violating requests for every
operation and checks each answer against it: no 5xx, only documented statuses and
content types, bodies and headers that match their schemas, schema-violating input
refused, the admin push refused without its token. The sidecar runs in-process on
its own event loop in a thread (schemathesis calls are synchronous), in front of a
fake upstream that answers at once. After every case the gate's books must be empty
and, after a push, the original thresholds are put back so later cases are judged
against the same gate.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
import yaml
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.core.failures import FailureGroup

from canned_profiles import smollm2_profile
from fake_upstream import FakeUpstream, llama_app, serve
from sidecar_harness import DRAIN_HEADERS, TOKEN, sidecar_in_front_of, thresholds_for
from slogate_admission.schema import Thresholds
from slogate_sidecar.app import admin_app, build_sidecar, proxy_app
from slogate_sidecar.openapi import document_text
from slogate_sidecar.settings import SidecarSettings

SPEC = resources.files("slogate_sidecar").joinpath("openapi.yaml")
schema = schemathesis.openapi.from_path(str(SPEC))
schema.config.generation.update(max_examples=40)
ADMIN_PATHS = ("/slogate/", "/metrics")


@dataclass
class LiveSidecar:
    url: str
    admin_url: str
    thresholds: Thresholds
    loop: asyncio.AbstractEventLoop
    books: Any
    """A callable returning the ledger's counters, run on the sidecar's loop."""
    undrain: Any
    """A callable ending a drain the drain route began, run on the sidecar's loop."""

    def base_url(self, path: str) -> str:
        return self.admin_url if path.startswith(ADMIN_PATHS) else self.url

    def counters(self) -> dict[str, int]:
        return asyncio.run_coroutine_threadsafe(self.books(), self.loop).result(timeout=10)

    def resume(self) -> None:
        """Admitting again, as after llama-server's restart (the drain route's case drains it)."""
        asyncio.run_coroutine_threadsafe(self.undrain(), self.loop).result(timeout=10)


def upstream_app(fake: FakeUpstream) -> web.Application:
    """The fake llama-server, plus the /v1/models it answers for passthrough."""
    app = llama_app(fake)

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    app.router.add_get("/v1/models", models)
    return app


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSidecar]:
    """A sidecar serving from a background thread until the module's tests are done."""
    started: list[LiveSidecar] = []
    ready = threading.Event()
    stop: list[asyncio.Event] = []
    failure: list[BaseException] = []
    thresholds = thresholds_for(smollm2_profile())

    async def main() -> None:
        stop.append(asyncio.Event())
        fake = FakeUpstream()
        async with (
            serve(upstream_app(fake)) as fake.url,
            sidecar_in_front_of(fake.url, tmp_path_factory.mktemp("sidecar"), thresholds) as running,
        ):

            async def books() -> dict[str, int]:
                ledger = running.sidecar.gate.ledger
                for _ in range(200):  # handlers end just after their clients have read everything
                    if running.sidecar.gate.is_idle():
                        break
                    await asyncio.sleep(0.02)
                return {
                    "queued": ledger.queued_prefill_tokens,
                    "streams": ledger.streams,
                    "kv": ledger.reserved_kv_tokens,
                    "deferred": running.sidecar.gate.deferred,
                }

            async def undrain() -> None:
                running.sidecar.gate.drain.resume("the next case")

            loop = asyncio.get_running_loop()
            started.append(LiveSidecar(running.url, running.admin_url, thresholds, loop, books, undrain))
            ready.set()
            await stop[0].wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as error:  # surfaced to the test thread below
            failure.append(error)
            ready.set()

    thread = threading.Thread(target=run, name="sidecar-under-schemathesis", daemon=True)
    thread.start()
    assert ready.wait(30), "the sidecar did not start"
    assert not failure, failure
    live = started[0]
    try:
        yield live
    finally:
        live.loop.call_soon_threadsafe(stop[0].set)
        thread.join(30)


def restore(live: LiveSidecar) -> None:
    document = live.thresholds.model_dump_json(by_alias=True)
    answer = requests.put(live.admin_url + "/slogate/v1/thresholds", data=document,
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)  # fmt: skip
    assert answer.status_code == 200, answer.text


CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_headers_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.negative_data_rejection,
    schemathesis.checks.missing_required_header,
    schemathesis.checks.unsupported_method,
    schemathesis.checks.ignored_auth,
]
GATE_ARITHMETIC = {"slogate_request_too_large"}
"""Why a schema-valid request may still get a 400: the schema cannot say that prompt plus
max_tokens must fit one slot's context, the gate can (and must refuse at once, not 429)."""


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_conforms(case: schemathesis.Case, live: LiveSidecar) -> None:
    # Credentials the schema cannot derive: the admin token, and the drain token made from it.
    headers = {"Authorization": f"Bearer {TOKEN}"} if case.path == "/slogate/v1/thresholds" else None
    headers = DRAIN_HEADERS if case.path == "/slogate/v1/drain" else headers
    # The timeout is a hang guard, not a performance bound.
    response = case.call(base_url=live.base_url(case.path), headers=headers, timeout=30)
    try:
        # positive_data_acceptance is replaced just below; the checks left out are about
        # resources (creation, deletion, ownership), of which the sidecar has none.
        case.validate_response(response, headers=headers, checks=CHECKS)
        assert response.status_code < 500, response.text[:300]
        error = response.json().get("error") if response.status_code >= 400 else None
        if error is not None:
            assert error["message"]
        positive = case.meta is not None and case.meta.generation.mode.is_positive
        if positive and error is not None and case.path != "/slogate/v1/thresholds":
            # Pydantic checks more than JSON Schema can say (class order, caps), so a
            # schema-valid push may be 422; a schema-valid request only for the gate's arithmetic.
            assert error["code"] in GATE_ARITHMETIC, response.text[:300]
    finally:
        if case.path == "/slogate/v1/thresholds" and response.status_code == 200:
            restore(live)
        if case.path == "/slogate/v1/drain":
            live.resume()
    assert live.counters() == {"queued": 0, "streams": 0, "kv": 0, "deferred": 0}


def test_the_document_is_served_on_the_admin_port(live: LiveSidecar) -> None:
    answer = requests.get(live.admin_url + "/slogate/v1/openapi.yaml", timeout=30)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("application/yaml")
    assert yaml.safe_load(answer.text) == yaml.safe_load(Path(str(SPEC)).read_text())
    assert answer.text == document_text()


def test_the_thresholds_schema_is_pydantics_own() -> None:
    """The push body's schema is generated from the model the sidecar validates with."""
    document = yaml.safe_load(document_text())
    generated = Thresholds.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    definitions = generated.pop("$defs")
    shipped = document["components"]["schemas"]
    assert json.loads(json.dumps(shipped["Thresholds"])) == generated
    for name, definition in definitions.items():
        assert shipped[name] == definition, name


def test_the_document_lists_every_route_the_sidecar_serves() -> None:
    """No route without a description, and no description without a route."""
    sidecar = build_sidecar(SidecarSettings(upstream="http://127.0.0.1:9"))
    served = set()
    for app in (proxy_app(sidecar), admin_app(sidecar)):
        for route in app.router.routes():
            if route.method != "HEAD":
                served.add((route.method.lower(), route.resource.canonical if route.resource else ""))
    described = {(method, path) for path, item in yaml.safe_load(document_text())["paths"].items() for method in item}
    assert served == described


def test_the_checks_can_fail(live: LiveSidecar) -> None:
    """A status the document does not list, on a real operation, fails validation."""
    case = schema["/readyz"]["GET"].Case()
    response = case.call(base_url=live.url, timeout=30)
    case.validate_response(response)  # the real answer conforms
    response.status_code = 418
    with pytest.raises(FailureGroup, match="Undocumented status code"):
        case.validate_response(response)
