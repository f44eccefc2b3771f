"""Request parsing: every validation rule, and that nothing but BadRequest ever escapes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slogate_llama.routes import Route
from slogate_sidecar.requests import (
    MAX_JSON_DEPTH,
    BadRequest,
    ParsedRequest,
    parse_request,
    with_output_limit,
)

CHAT, CMPL, NATIVE = Route.CHAT, Route.COMPLETIONS, Route.NATIVE
LIMIT = 4096
MSGS = [{"role": "user", "content": "Hi"}]


def parse(route: Route, body: object, *, max_body_bytes: int = 1_000_000) -> ParsedRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(route, raw, max_body_bytes=max_body_bytes, max_output_tokens=LIMIT)


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": MSGS, **fields}


def text(prompt: object = "Hi", **fields: Any) -> dict[str, Any]:
    return {"prompt": prompt, **fields}


def parts(*items: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(items)}]}


def nested(levels: int) -> dict[str, Any]:
    """A valid chat body whose deepest container sits exactly ``levels`` deep."""
    deep: list[Any] = []
    for _ in range(levels - 2):
        deep = [deep]
    return chat(deep=deep)


# fmt: off
REJECTED = [
    # (route, body, status, param, message fragment)
    (CHAT, b"\xff\xfe{}", 400, None, "not valid UTF-8"),
    (CHAT, '{"messages": []}'.encode("utf-16"), 400, None, "not valid UTF-8"),
    (CHAT, b'\xef\xbb\xbf{"messages": []}', 400, None, "not valid JSON"),
    (CHAT, b'{"messages": [', 400, None, "not valid JSON"),
    (CHAT, b"", 400, None, "not valid JSON"),
    (CHAT, b'{"messages": NaN}', 400, None, "not valid JSON"),
    (NATIVE, b'{"prompt": "x", "n_predict": Infinity}', 400, None, "not valid JSON"),
    (NATIVE, b'{"prompt": [' + b"9" * 5000 + b"]}", 400, None, "not valid JSON"),
    (CHAT, b"[" * 100_000 + b"]" * 100_000, 400, None, "nested deeper"),
    (CHAT, json.dumps(nested(MAX_JSON_DEPTH + 1)).encode(), 400, None, "nested deeper"),
    (CHAT, b"[]", 400, None, "must be a JSON object, got array"),
    (CMPL, b'"prompt"', 400, None, "must be a JSON object, got string"),
    (NATIVE, b"null", 400, None, "must be a JSON object, got null"),
    (CHAT, {}, 400, "messages", "is required"),
    (CHAT, {"messages": "Hi"}, 400, "messages", "non-empty array of message objects, got string"),
    (CHAT, {"messages": None}, 400, "messages", "got null"),
    (CHAT, {"messages": []}, 400, "messages", "non-empty array"),
    (CHAT, {"messages": ["Hi"]}, 400, "messages[0]", "must be an object, got string"),
    (CHAT, {"messages": [{"content": "Hi"}]}, 400, "messages[0].role", "a string, got null"),
    (CHAT, {"messages": [*MSGS, {"role": 1}]}, 400, "messages[1].role", "got integer"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "an array of content parts, or null"),
    (CHAT, {"messages": [{"role": "user", "content": {"text": "x"}}]}, 400, "messages[0].content", "got object"),
    (CHAT, parts("Hi"), 400, "messages[0].content[0]", "a content part object, got string"),
    (CHAT, parts({"text": "Hi"}), 400, "messages[0].content[0].type", "a string, got null"),
    (CHAT, parts({"type": "text", "text": 3}), 400, "messages[0].content[0].text", "a string, got integer"),
    (CHAT, parts({"type": "text", "text": "a"}, {"type": "text"}), 400, "messages[0].content[1].text", "got null"),
    (CMPL, {}, 400, "prompt", "is required"),
    (NATIVE, {"content": "Hi"}, 400, "prompt", "is required"),
    (NATIVE, text(5), 400, "prompt", "a string, a non-empty array of strings, or a non-empty array of token ids, got integer"),
    (CMPL, text(None), 400, "prompt", "got null"),
    (NATIVE, text({"prompt_string": "Hi"}), 400, "prompt", "got object"),
    (CMPL, text([]), 400, "prompt", "non-empty array"),
    (CMPL, text([True, False]), 400, "prompt[0]", "a string or a token id (integer), got boolean"),
    (NATIVE, text([1.5, 2.0]), 400, "prompt[0]", "got number"),
    (CMPL, text([[1, 2]]), 400, "prompt[0]", "got array"),
    (NATIVE, text([1, True]), 400, "prompt[1]", "a token id (integer), like prompt[0], got boolean"),
    (NATIVE, text([1, "a"]), 400, "prompt[1]", "got string"),
    (CMPL, text(["a", 1]), 400, "prompt[1]", "a string, like prompt[0], got integer"),
    (NATIVE, text([3, -1]), 400, "prompt[1]", "token id (0 or more), got -1"),
    (CHAT, chat(stream="true"), 400, "stream", "must be a boolean, got string"),
    (NATIVE, text(stream=1), 400, "stream", "must be a boolean, got integer"),
    (CHAT, chat(max_tokens=True), 400, "max_tokens", "must be an integer, got boolean"),
    (CHAT, chat(max_tokens=12.5), 400, "max_tokens", "must be an integer, got number"),
    (CHAT, chat(max_tokens="12"), 400, "max_tokens", "got string"),
    (CHAT, chat(max_tokens=-1), 400, "max_tokens", "0 or more, got -1"),
    (CHAT, chat(max_tokens=LIMIT + 1), 400, "max_tokens", "absurd"),
    (CHAT, chat(max_completion_tokens=False), 400, "max_completion_tokens", "got boolean"),
    (CHAT, chat(max_completion_tokens=-3), 400, "max_completion_tokens", "0 or more"),
    (CHAT, chat(max_completion_tokens=10**12), 400, "max_completion_tokens", "absurd"),
    (CHAT, chat(max_tokens=10, n_predict=10**9), 400, "n_predict", "absurd"),
    (CMPL, text(max_tokens=1.5), 400, "max_tokens", "got number"),
    (CMPL, text(max_tokens=-1), 400, "max_tokens", "0 or more"),
    (CMPL, text(n_predict=True), 400, "n_predict", "got boolean"),
    (NATIVE, text(n_predict=True), 400, "n_predict", "got boolean"),
    (NATIVE, text(n_predict=64.5), 400, "n_predict", "got number"),
    (NATIVE, text(n_predict=-2), 400, "n_predict", "-1 (unlimited) or more, got -2"),
    (NATIVE, text(n_predict=LIMIT + 1), 400, "n_predict", "absurd"),
    (NATIVE, text(max_tokens=-1), 400, "max_tokens", "0 or more"),
]

ACCEPTED = [
    # (route, body, (stream, max_tokens, prompt_chars, prompt_token_count, prompt_count))
    (CHAT, chat(), (False, None, 2, None, 1)),
    (CHAT, chat(stream=True, max_tokens=5), (True, 5, 2, None, 1)),
    (CHAT, chat(stream=None, max_tokens=None), (False, None, 2, None, 1)),
    (CHAT, chat(max_tokens=0), (False, 0, 2, None, 1)),
    (CHAT, chat(max_tokens=LIMIT), (False, LIMIT, 2, None, 1)),
    (CHAT, chat(max_tokens=10, max_completion_tokens=3), (False, 3, 2, None, 1)),
    (CHAT, chat(max_completion_tokens=10, n_predict=4), (False, 4, 2, None, 1)),
    (CHAT, chat(max_tokens=5, n_predict=-1), (False, None, 2, None, 1)),
    (CMPL, text("Once upon", max_tokens=7, stream=False), (False, 7, 9, None, 1)),
    (CMPL, text(["ab", "cde", ""]), (False, None, 5, None, 3)),
    (CMPL, text([1, 2, 3], n_predict=2, max_tokens=9), (False, 2, 0, 3, 1)),
    (CMPL, text(""), (False, None, 0, None, 1)),
    (NATIVE, text("héllo", n_predict=16, stream=True), (True, 16, 5, None, 1)),
    (NATIVE, text("x", n_predict=-1, max_tokens=3), (False, None, 1, None, 1)),
    (NATIVE, text("x", max_tokens=3), (False, 3, 1, None, 1)),
    (NATIVE, text([0, 7], n_predict=0), (False, 0, 0, 2, 1)),
    (NATIVE, text(["a"]), (False, None, 1, None, 1)),
]
# fmt: on


@pytest.mark.parametrize(("route", "body", "status", "param", "fragment"), REJECTED)
def test_rejected(
    route: Route,
    body: object,
    status: int,
    param: str | None,
    fragment: str,
) -> None:
    with pytest.raises(BadRequest) as caught:
        parse(route, body)
    bad = caught.value
    assert (bad.status, bad.param) == (status, param)
    assert fragment in bad.message
    assert bad.code is not None
    error = {
        "message": bad.message,
        "type": "invalid_request_error",
        "param": param,
        "code": bad.code,
    }
    assert bad.body() == {"error": error}


def test_a_body_over_the_limit_is_413_and_one_at_the_limit_parses() -> None:
    raw = json.dumps(chat()).encode()
    assert parse(CHAT, raw, max_body_bytes=len(raw)).messages == MSGS
    with pytest.raises(BadRequest) as caught:
        parse(CHAT, raw, max_body_bytes=len(raw) - 1)
    bad = caught.value
    assert (bad.status, bad.param, bad.code) == (413, None, "request_too_large")
    assert f"more than the limit of {len(raw) - 1}" in bad.message


def test_nesting_up_to_the_depth_limit_parses() -> None:
    assert parse(CHAT, nested(MAX_JSON_DEPTH)).prompt_chars == 2


@pytest.mark.parametrize(("route", "body", "expected"), ACCEPTED)
def test_accepted(route: Route, body: dict[str, Any], expected: tuple[Any, ...]) -> None:
    p = parse(route, body)
    assert (p.route, p.body) == (route, body)
    got = (p.stream, p.max_tokens, p.prompt_chars, p.prompt_token_count, p.prompt_count)
    assert got == expected
    assert p.messages == (body["messages"] if route is CHAT else None)


def test_chat_prompt_chars_count_strings_and_text_parts_only() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "¿Qué?"}]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": [{"type": "text", "text": "42"}], "tool_call_id": "c1"},
            {"role": "assistant"},
        ]
    }
    assert parse(CHAT, body).prompt_chars == len("Be brief.") + len("¿Qué?") + len("42")


def test_integral_numbers_are_integers_as_in_json() -> None:
    """12.0 is the JSON number 12 (JSON Schema agrees); beyond 2**53 a double is not exact."""
    parsed = parse_request(NATIVE, b'{"prompt": [1.0, 2e0], "n_predict": 12.0, "temperature": 1.0, "top_p": 0.5}',
                           max_body_bytes=1000, max_output_tokens=LIMIT)  # fmt: skip
    assert (parsed.max_tokens, parsed.prompt_token_count) == (12, 2)
    assert [type(v) for v in (*parsed.body["prompt"], parsed.body["temperature"])] == [int, int, int]
    assert type(parsed.body["top_p"]) is float
    big = parse_request(NATIVE, b'{"prompt": "x", "seed": 1e300}', max_body_bytes=1000, max_output_tokens=LIMIT)
    assert type(big.body["seed"]) is float


def test_non_text_parts_are_refused_they_cannot_be_counted() -> None:
    image = {"type": "image_url", "image_url": {"url": "x"}}
    with pytest.raises(BadRequest) as refused:
        parse(CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, image]}]})
    assert (refused.value.param, refused.value.code) == ("messages[0].content[1].type", "slogate_text_only")


@pytest.mark.parametrize(
    ("route", "body", "expected"),
    [
        (CHAT, chat(max_tokens=9, max_completion_tokens=8, n_predict=-1), chat(max_tokens=5)),
        (CMPL, text(n_predict=100, stream=True), text(max_tokens=5, stream=True)),
        (NATIVE, text(max_tokens=100, n_predict=-1), text(n_predict=5)),
        (NATIVE, text(), text(n_predict=5)),
    ],
)
def test_with_output_limit_leaves_one_limit_the_upstream_cannot_override(
    route: Route, body: dict[str, Any], expected: dict[str, Any]
) -> None:
    parsed = parse(route, body)
    assert with_output_limit(parsed, 5) == expected
    assert parsed.body == body  # a copy: the parsed body is untouched
    assert parse(route, with_output_limit(parsed, 5)).max_tokens == 5


@pytest.mark.parametrize("n", [0, -1, True])
def test_with_output_limit_refuses_a_limit_the_upstream_would_not_honour(n: int) -> None:
    with pytest.raises(ValueError, match="integer >= 1"):
        with_output_limit(parse(CHAT, chat()), n)


# --------------------------------------------------------------------------- properties

# fmt: off
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually ``valid``, sometimes any JSON: examples then reach every rule, not just the first."""
    return st.one_of(valid, valid, valid, json_values)


part = st.fixed_dictionaries({"type": mostly(st.sampled_from(["text", "image_url"]))}, optional={"text": mostly(st.text())})
message_like = st.fixed_dictionaries(
    {"role": mostly(st.text()), "content": mostly(st.lists(mostly(part), min_size=1, max_size=3) | st.text() | st.none())}
)
messages_values = mostly(st.lists(mostly(message_like), min_size=1, max_size=3))
prompt_values = mostly(st.text() | st.lists(st.text(), min_size=1, max_size=3) | st.lists(st.integers(-2, 50), min_size=1, max_size=3))
limits = mostly(st.integers(-3, LIMIT + 3))
known = st.fixed_dictionaries({}, optional={
    "messages": messages_values, "prompt": prompt_values, "stream": mostly(st.booleans()),
    "max_tokens": limits, "max_completion_tokens": limits, "n_predict": limits,
})
json_objects = st.builds(lambda k, extra: {**extra, **k}, known, st.dictionaries(st.text(max_size=8), json_values, max_size=3))
# fmt: on


def outcome(route: Route, raw: bytes) -> ParsedRequest | BadRequest:
    try:
        return parse_request(route, raw, max_body_bytes=2_000, max_output_tokens=LIMIT)
    except BadRequest as bad:
        return bad


def assert_well_formed(result: ParsedRequest | BadRequest) -> None:
    if isinstance(result, BadRequest):
        assert result.status in (400, 413)
        assert set(result.body()["error"]) == {"message", "type", "param", "code"}
    else:
        assert result.prompt_chars >= 0
        assert result.max_tokens is None or 0 <= result.max_tokens <= LIMIT


@settings(deadline=None, max_examples=300)
@given(st.sampled_from(Route), st.binary(max_size=3_000))
def test_arbitrary_bytes_only_ever_raise_bad_request(route: Route, raw: bytes) -> None:
    assert_well_formed(outcome(route, raw))


@settings(deadline=None, max_examples=500)
@given(st.sampled_from(Route), json_objects | json_values)
def test_arbitrary_json_only_ever_raises_bad_request(route: Route, value: object) -> None:
    assert_well_formed(outcome(route, json.dumps(value).encode()))


@settings(deadline=None, max_examples=500)
@given(st.sampled_from(Route), messages_values, prompt_values)
def test_arbitrary_messages_and_prompts_only_ever_raise_bad_request(
    route: Route,
    msgs: object,
    prompt: object,
) -> None:
    assert_well_formed(outcome(route, json.dumps({"messages": msgs, "prompt": prompt}).encode()))


text_part = st.builds(lambda t: {"type": "text", "text": t}, st.text())
content = st.none() | st.text() | st.lists(text_part, max_size=3)
role = st.sampled_from(["system", "user", "assistant"])
message = st.fixed_dictionaries({"role": role, "content": content})
messages = st.lists(message, min_size=1, max_size=5)


def content_chars(c: Any) -> int:
    if isinstance(c, list):
        return sum(len(p["text"]) for p in c if p["type"] == "text")
    return len(c or "")


@settings(deadline=None)
@given(messages, st.none() | st.integers(0, LIMIT), st.booleans(), st.integers(1, LIMIT))
def test_valid_chat_bodies_parse_and_count_their_characters(
    msgs: list[dict[str, Any]], max_tokens: int | None, stream: bool, limit: int
) -> None:
    parsed = parse(CHAT, {"messages": msgs, "max_tokens": max_tokens, "stream": stream})
    assert parsed.prompt_chars == sum(content_chars(m["content"]) for m in msgs)
    assert (parsed.max_tokens, parsed.stream, parsed.messages) == (max_tokens, stream, msgs)
    assert parse(CHAT, with_output_limit(parsed, limit)).max_tokens == limit
