"""Property-based fuzzing of every client request path, end to end over HTTP.

A real sidecar runs in-process in front of the fake upstream (which answers every
admitted request at once). Whatever hypothesis sends (random bytes, malformed JSON,
wrong types, huge or negative numbers, unicode, deep nesting, oversized bodies,
odd headers) the answer must be deliberate: a 4xx whose JSON body says what is wrong,
or a 200 / 429 for a request that was valid; never a 5xx, never a hang. After every
example the gate's books must be empty again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canned_profiles import smollm2_profile
from fake_upstream import FakeUpstream, fake_upstream
from sidecar_harness import RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_llama.routes import Route
from slogate_sidecar.requests import MAX_JSON_DEPTH

MAX_BODY = 16 * 1024
HANG_GUARD_S = 30.0
"""Not a performance bound: an answer that has not come in this long is a hang."""
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

ROUTES = [route.value for route in Route]
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
# The fields the gate reads, and a few it passes on; values of every JSON type.
FIELDS = [
    "messages", "prompt", "max_tokens", "max_completion_tokens", "n_predict", "stream", "n", "n_cmpl",
    "tools", "reasoning_format", "stream_options", "temperature", "cache_prompt",
]  # fmt: skip
MESSAGE_FIELDS = ["role", "content", "name", "tool_call_id", "reasoning_content", "tool_calls"]


def valid_body(route: str) -> dict[str, Any]:
    if route == Route.CHAT:
        return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return {"prompt": "Hi", "n_predict": 4}


@st.composite
def mutated_bodies(draw: st.DrawFn, route: str) -> bytes:
    """A valid body with some fields (top level or in a message) replaced by anything."""
    body = valid_body(route)
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        body[field] = draw(json_values)
    if route == Route.CHAT and isinstance(body.get("messages"), list) and draw(st.booleans()):
        message = {"role": "user", "content": "Hi"}
        for field in draw(st.lists(st.sampled_from(MESSAGE_FIELDS), min_size=1, max_size=2)):
            message[field] = draw(json_values)
        body["messages"] = [*body["messages"], message]
    return json.dumps(body).encode()


@st.composite
def raw_bodies(draw: st.DrawFn, route: str) -> bytes:
    """Bodies no JSON encoder would write."""
    good = json.dumps(valid_body(route))
    depth = draw(st.integers(1, 3 * MAX_JSON_DEPTH))
    return draw(
        st.sampled_from(
            [
                b"",
                good[: draw(st.integers(0, len(good) - 1))].encode(),  # cut short
                good.replace('"Hi"', '"\\ud800"').encode(),  # a lone surrogate escape
                good.replace("4", "1e999").encode(),  # a double's overflow
                good.replace("4", "9" * 30).encode(),  # beyond 64 bits
                good.replace("4", "-" + "9" * 5000).encode(),  # beyond Python's int parsing limit
                good.replace("4", "NaN").encode(),
                good.encode("utf-16"),
                good.replace("Hi", "Hi\udcff").encode("utf-8", "surrogateescape"),  # invalid UTF-8
                ('{"prompt": ' + "[" * depth + "1" + "]" * depth + "}").encode(),
                (
                    '{"messages": [{"role": "user", "content": "Hi", "x": '
                    + '{"a":' * depth
                    + "1"
                    + "}" * depth
                    + "}]}"
                ).encode(),
                json.dumps({**valid_body(route), "pad": "x" * MAX_BODY}).encode(),  # over the limit
            ]
        )
        | st.binary(max_size=300)
        | json_values.map(lambda v: json.dumps(v).encode())
    )


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=60)


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[tuple[RunningSidecar, FakeUpstream]]:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile()), max_body_bytes=MAX_BODY) as running,
    ):
        yield running, fake


async def send(gate: RunningSidecar, route: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """POST and read the whole answer, within the hang guard."""
    async with (
        asyncio.timeout(HANG_GUARD_S),
        gate.session.post(gate.url + route, data=body, headers=headers or {}) as response,
    ):
        return response.status, await response.text()


def assert_deliberate(status: int, text: str) -> None:
    """A 4xx names the problem in an OpenAI-style body; anything else is a served or refused request."""
    assert status < 500, (status, text[:300])
    if status >= 400:
        error = json.loads(text)["error"]
        assert isinstance(error["message"], str)
        assert error["message"]
        assert error["type"] in ("invalid_request_error", "rate_limit_error")
    else:
        assert status == 200, (status, text[:300])


async def assert_books_empty(gate: RunningSidecar) -> None:
    assert await gate.wait_idle(), gate.sidecar.gate.ledger


@FUZZ
@given(st.sampled_from(ROUTES).flatmap(lambda r: st.tuples(st.just(r), mutated_bodies(r) | raw_bodies(r))))
async def test_any_body_on_any_route_is_answered_deliberately(
    gate: tuple[RunningSidecar, FakeUpstream], case: tuple[str, bytes]
) -> None:
    running, _ = gate
    route, body = case
    status, text = await send(running, route, body, {"Content-Type": "application/json"})
    assert_deliberate(status, text)
    await assert_books_empty(running)


@FUZZ
@given(
    st.sampled_from(ROUTES),
    st.dictionaries(
        st.sampled_from(["X-Slogate-Class", "Authorization", "Content-Type", "Accept", "X-Other", "Content-Encoding"]),
        header_text | st.sampled_from(["gzip", "deflate", "br", "identity", "application/json", "Bearer x"]),
        max_size=4,
    ),
)
async def test_any_header_values_are_answered_deliberately(
    gate: tuple[RunningSidecar, FakeUpstream], route: str, headers: dict[str, str]
) -> None:
    running, _ = gate
    status, text = await send(running, route, json.dumps(valid_body(route)).encode(), headers)
    if headers.get("Content-Encoding", "").strip().lower() in ("gzip", "deflate", "br", "zstd"):
        assert 400 <= status < 500  # a body that claims a compression it does not have
    else:
        assert_deliberate(status, text)
    await assert_books_empty(running)


@FUZZ
@given(st.sampled_from(ROUTES), st.text(max_size=200), st.integers(-(2**63) + 1, 2**63 - 1), st.booleans())
async def test_valid_requests_are_served_or_refused_with_reasons(
    gate: tuple[RunningSidecar, FakeUpstream], route: str, text: str, limit: int, stream: bool
) -> None:
    """Unicode prompts and limits of any size: served (200), or 400/429 with the gate's reasons."""
    running, fake = gate
    body: dict[str, Any] = valid_body(route) | {"stream": stream}
    if route == Route.CHAT:
        body["messages"] = [{"role": "user", "content": text}]
        body["max_tokens"] = limit
    else:
        body["prompt"] = text
        body["n_predict"] = limit
    started = fake.started
    status, answer = await send(running, route, json.dumps(body).encode())
    assert_deliberate(status, answer)
    reason = json.loads(answer)["error"]["param"] if status == 400 else None
    if limit < -1 or (limit == -1 and route == Route.CHAT) or limit > running.sidecar.settings.max_output_tokens:
        assert (status, reason) == (400, "n_predict" if route != Route.CHAT else "max_tokens")
    elif status == 200:
        assert fake.started == started + 1  # served by the upstream, exactly once
        if stream:
            assert answer.rstrip().endswith(("}", "[DONE]"))
        else:
            assert isinstance(json.loads(answer), dict)
    await assert_books_empty(running)


@pytest.mark.parametrize("field", ["n", "n_cmpl"])
async def test_several_generations_per_request_are_refused_on_every_route(
    gate: tuple[RunningSidecar, FakeUpstream], field: str
) -> None:
    """llama-server honours both n and its own n_cmpl with one slot per generation: one ticket
    cannot cover them."""
    running, fake = gate
    for route in ROUTES:
        for value in (2, 3.0, 0, True, "2"):
            status, text = await send(running, route, json.dumps({**valid_body(route), field: value}).encode())
            assert status == 400, (route, value)
            assert json.loads(text)["error"]["param"] == field
        status, _ = await send(running, route, json.dumps({**valid_body(route), field: 1}).encode())
        assert status == 200
    assert fake.started == len(ROUTES)


async def test_every_route_refuses_oversized_bodies_with_413(gate: tuple[RunningSidecar, FakeUpstream]) -> None:
    running, fake = gate
    for route in ROUTES:
        for size in (MAX_BODY + 1, 4 * MAX_BODY):
            body = json.dumps({**valid_body(route), "pad": "x" * size}).encode()
            status, text = await send(running, route, body)
            assert status == 413, (route, size, text[:200])
            assert "bytes" in json.loads(text)["error"]["message"]
    assert fake.started == 0
    await assert_books_empty(running)


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_wrong_methods_on_gated_routes_are_405_with_a_json_body(
    gate: tuple[RunningSidecar, FakeUpstream], method: str
) -> None:
    running, fake = gate
    for route in ROUTES:
        async with running.session.request(method, running.url + route) as response:
            assert response.status == 405
            assert "POST" in response.headers["Allow"]
            assert method in (await response.json())["error"]["message"]
    assert fake.started == 0


async def test_unknown_paths_are_404_with_a_json_body(gate: tuple[RunningSidecar, FakeUpstream]) -> None:
    running, _ = gate
    for path in ("/", "/v1/chat/completions/", "/v2/completions", "/%00", "/../etc/passwd", "/v1/embeddings"):
        async with running.session.get(running.url + path) as response:
            assert response.status == 404, path
            assert "not an endpoint" in (await response.json())["error"]["message"]


async def test_concurrent_garbage_leaves_no_trace(gate: tuple[RunningSidecar, FakeUpstream]) -> None:
    """Many malformed and valid requests at once: each answered, the books empty after."""
    running, fake = gate
    bodies = [b"{", b"[]", b'{"prompt": 5}', b'{"messages": []}', json.dumps(valid_body("/completion")).encode()]
    results = await asyncio.gather(*(send(running, "/completion", bodies[i % len(bodies)]) for i in range(100)))
    statuses = [status for status, _ in results]
    assert statuses.count(400) == 80
    assert statuses.count(200) + statuses.count(429) == 20
    assert fake.started == statuses.count(200)
    await assert_books_empty(running)


async def test_client_chosen_classes_never_become_metric_labels(
    gate: tuple[RunningSidecar, FakeUpstream],
) -> None:
    """Fifty distinct class headers: metrics stay labelled by the policy's classes only."""
    running, _ = gate
    for i in range(50):
        status, _ = await send(
            running, "/completion", b'{"prompt": [1, 2], "n_predict": 1}', {"X-Slogate-Class": f"c{i}"}
        )
        assert status == 200
    async with aiohttp.ClientSession() as session, session.get(running.admin_url + "/metrics") as response:
        exposition = await response.text()
    thresholds = running.sidecar.gate.thresholds
    assert thresholds is not None
    labels = {line.split('class="')[1].split('"')[0] for line in exposition.splitlines() if 'class="' in line}
    assert labels == {c.name for c in thresholds.classes}
