"""llama-server's generation routes: the streaming request the sidecar makes of a client's body."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slogate_llama.routes import OUTPUT_LIMIT_FIELDS, Route, as_upstream_stream

CHAT, CMPL, NATIVE = Route.CHAT, Route.COMPLETIONS, Route.NATIVE
MSGS = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": MSGS, **fields}


def text(prompt: object = "Hi", **fields: Any) -> dict[str, Any]:
    return {"prompt": prompt, **fields}


@pytest.mark.parametrize(
    ("route", "body", "expected"),
    [
        (CHAT, chat(), chat(stream=True, stream_options={"include_usage": True})),
        (
            CMPL,
            text(stream=False, stream_options={"include_usage": False, "x": 1}),
            text(stream=True, stream_options={"include_usage": True, "x": 1}),
        ),
        (
            CMPL,
            text(stream_options="junk"),
            text(stream=True, stream_options={"include_usage": True}),
        ),
        (NATIVE, text(stream=False), text(stream=True)),
    ],
)
def test_as_upstream_stream(route: Route, body: dict[str, Any], expected: dict[str, Any]) -> None:
    before = json.dumps(body)
    assert as_upstream_stream(body, route) == expected
    assert json.dumps(body) == before


def test_routes_are_paths_and_n_predict_wins_everywhere() -> None:
    assert Route("/v1/chat/completions") is CHAT
    assert {route: fields[0] for route, fields in OUTPUT_LIMIT_FIELDS.items()} == dict.fromkeys(Route, "n_predict")
    assert OUTPUT_LIMIT_FIELDS[CHAT] == ("n_predict", "max_completion_tokens", "max_tokens")
