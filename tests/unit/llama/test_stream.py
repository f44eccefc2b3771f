"""llama-server's streams: framing, reassembly and token counts, on chunks recorded from the real binary.

Envelopes and values below are copied from this build's output (model path shortened,
``generation_settings`` trimmed); tool calls are the one exception: the bundled model
never emits them, so those chunks follow llama-server's OpenAI-style delta format.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from slogate_calibration.runtime import LlamaServer
from slogate_llama.routes import Route, as_upstream_stream
from slogate_llama.stream import Reassembler, carries_token, event, event_data, may_be_final, usage_of

CHAT, CMPL, NATIVE = Route.CHAT, Route.COMPLETIONS, Route.NATIVE

# fmt: off
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
HEAD = {"created": 1796215391, "id": "chatcmpl-6bj8026rrnxyTeJTRjFJt4VR2DD7FXXf", "model": MODEL}
TIMINGS = {"cache_n": 35, "prompt_n": 1, "prompt_ms": 9.24, "predicted_n": 4, "predicted_ms": 27.598}
USAGE = {"completion_tokens": 4, "prompt_tokens": 36, "total_tokens": 40, "prompt_tokens_details": {"cached_tokens": 35}}


def chat_chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0, **choice: Any) -> dict[str, Any]:
    choices = [{"finish_reason": finish, "index": index, "delta": delta, **choice}]
    return {"choices": choices, "created": HEAD["created"], "id": HEAD["id"], "model": MODEL,
            "system_fingerprint": "b0-unknown", "object": "chat.completion.chunk"}


def cmpl_chunk(text: str, finish: str | None = None, index: int = 0, **top: Any) -> dict[str, Any]:
    choices = [{"text": text, "index": index, "logprobs": None, "finish_reason": finish}]
    return {"choices": choices, "created": HEAD["created"], "model": MODEL, "system_fingerprint": "b0-unknown",
            "object": "text_completion", **top, "id": HEAD["id"]}


def cmpl_usage(completion: int, prompt: int, cached: int) -> dict[str, Any]:
    return {"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": completion + prompt,
            "prompt_tokens_details": {"cached_tokens": cached}}


def native_chunk(content: str, tokens: list[int], predicted: int, index: int = 0) -> dict[str, Any]:
    return {"index": index, "content": content, "tokens": tokens, "stop": False, "id_slot": -1,
            "tokens_predicted": predicted, "tokens_evaluated": 5}


def native_final(predicted: int, index: int = 0, prompt: str = "The capital of France is") -> dict[str, Any]:
    return {"index": index, "content": "", "tokens": [], "id_slot": 2, "stop": True, "model": MODEL,
            "tokens_predicted": predicted, "tokens_evaluated": 5,
            "generation_settings": {"temperature": 0.0, "n_predict": predicted, "stream": True, "n_probs": 0},
            "prompt": prompt, "has_new_line": True, "truncated": False, "stop_type": "limit",
            "stopping_word": "", "tokens_cached": 8, "timings": {"cache_n": 4, "prompt_n": 1, "predicted_n": predicted}}
# fmt: on


def lp(token_id: int, token: str, logprob: float) -> dict[str, Any]:
    entry = {"id": token_id, "token": token, "bytes": list(token.encode()), "logprob": logprob}
    return {**entry, "top_logprobs": [entry]}


def rebuild(route: Route, chunks: list[Any]) -> Any:
    r = Reassembler(route)
    for chunk in chunks:
        r.add(chunk)
    return r.result()


CHAT_STREAM = [
    chat_chunk({"role": "assistant", "content": None}),
    *(chat_chunk({"content": t}) for t in ["Hello", ",", " I", "'m"]),
    chat_chunk({}, "length"),
    {**chat_chunk({}), "choices": [], "usage": USAGE, "timings": TIMINGS},
]


def test_chat_stream_rebuilds_the_non_streaming_answer() -> None:
    message = {"role": "assistant", "content": "Hello, I'm"}
    # fmt: off
    assert rebuild(CHAT, CHAT_STREAM) == {
        "choices": [{"finish_reason": "length", "index": 0, "message": message}],
        **HEAD, "system_fingerprint": "b0-unknown", "object": "chat.completion", "usage": USAGE, "timings": TIMINGS,
    }
    # fmt: on
    # the key order of the real non-streaming answer
    keys = ["choices", "created", "model", "system_fingerprint", "object", "usage", "id", "timings"]
    assert list(rebuild(CHAT, CHAT_STREAM)) == keys


def test_chat_logprobs_are_concatenated_and_absent_when_not_sent() -> None:
    first, second = lp(19556, "Hello", -0.54), lp(17, "!", -0.33)
    # fmt: off
    chunks = [chat_chunk({"role": "assistant", "content": None}),
              chat_chunk({"content": "Hello"}, logprobs={"content": [first]}),
              chat_chunk({"content": "!"}, logprobs={"content": [second]}), chat_chunk({}, "length")]
    # fmt: on
    choice = rebuild(CHAT, chunks)["choices"][0]
    assert choice["logprobs"] == {"content": [first, second]}
    assert "logprobs" not in rebuild(CHAT, CHAT_STREAM)["choices"][0]


def test_chat_tool_calls_merge_by_index() -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather"}}
    # fmt: off
    chunks = [chat_chunk({"role": "assistant", "content": None}), chat_chunk({"tool_calls": [call]}),
              chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
              chat_chunk({"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "now"}}]}),
              chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
              chat_chunk({}, "tool_calls")]
    message = rebuild(CHAT, chunks)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}, "id": "call_1"},
        {"type": "function", "function": {"name": "now", "arguments": ""}, "id": "call_2"},
    ]}
    # fmt: on
    assert [carries_token(CHAT, c) for c in chunks] == [False, True, True, True, True, False]


def test_chat_reasoning_is_kept_apart_and_counts_as_the_first_token() -> None:
    chunks = [
        chat_chunk({"reasoning_content": "Hmm."}),
        chat_chunk({"content": "Hi"}),
        chat_chunk({}, "stop"),
    ]
    r = Reassembler(CHAT)
    r.add(chunks[0])
    assert r.first_token_seen
    for c in chunks[1:]:
        r.add(c)
    message = {"role": "assistant", "reasoning_content": "Hmm.", "content": "Hi"}
    assert r.result()["choices"][0]["message"] == message


def test_chat_stream_without_usage_keeps_timings_and_usage_of_falls_back_to_them() -> None:
    chunks = [*CHAT_STREAM[:-2], {**chat_chunk({}, "length"), "timings": TIMINGS}]
    result = rebuild(CHAT, chunks)
    assert "usage" not in result
    assert result["timings"] == TIMINGS
    assert usage_of(CHAT, result) == (36, 4)


def test_completions_stream_rebuilds_text_and_usage() -> None:
    usage = cmpl_usage(4, 5, cached=4)
    pieces = [cmpl_chunk(t) for t in [" Paris", ".", "\n", "\n"]]
    chunks = [*pieces, cmpl_chunk("", "length", usage=usage, timings=TIMINGS)]
    choice = {"text": " Paris.\n\n", "index": 0, "logprobs": None, "finish_reason": "length"}
    # fmt: off
    assert rebuild(CMPL, chunks) == {
        "choices": [choice], "created": HEAD["created"], "model": MODEL, "system_fingerprint": "b0-unknown",
        "object": "text_completion", "usage": usage, "id": HEAD["id"], "timings": TIMINGS,
    }
    # fmt: on
    assert usage_of(CMPL, rebuild(CMPL, chunks)) == (5, 4)


def test_completions_logprobs_are_chat_style_and_concatenated() -> None:
    first, second = lp(7042, " Paris", -0.26), lp(30, ".", -0.40)
    chunks = [cmpl_chunk(" Paris"), cmpl_chunk("."), cmpl_chunk("", "length")]
    chunks[0]["choices"][0]["logprobs"] = {"content": [first]}
    chunks[1]["choices"][0]["logprobs"] = {"content": [second]}
    assert rebuild(CMPL, chunks)["choices"][0]["logprobs"] == {"content": [first, second]}


def test_completions_batch_interleaves_indices_and_sums_per_prompt_usage() -> None:
    usage = cmpl_usage(2, 1, cached=0)
    # fmt: off
    chunks = [None, cmpl_chunk("\n", index=1), cmpl_chunk("-"), cmpl_chunk("\n", index=1),
              cmpl_chunk("", "length", index=1, usage=usage), cmpl_chunk("1"), cmpl_chunk("", "length", usage=usage)]
    # fmt: on
    result = rebuild(CMPL, chunks)
    texts = [(c["index"], c["text"], c["finish_reason"]) for c in result["choices"]]
    assert texts == [(0, "-1", "length"), (1, "\n\n", "length")]
    assert result["usage"] == cmpl_usage(4, 2, cached=0)


def test_native_stream_rebuilds_the_final_object() -> None:
    pieces = [(" Paris", [7042]), (".", [30]), ("\n", [198]), ("\n", [198])]
    chunks = [*(native_chunk(c, t, i + 1) for i, (c, t) in enumerate(pieces)), native_final(4)]
    result = rebuild(NATIVE, chunks)
    expected = native_final(4)
    expected.update(content=" Paris.\n\n", tokens=[7042, 30, 198, 198])
    expected["generation_settings"] = {**expected["generation_settings"], "stream": False}
    assert result == expected
    assert list(result) == list(native_final(4))
    assert usage_of(NATIVE, result) == (5, 4)


def test_native_probabilities_are_concatenated() -> None:
    first, second = lp(7042, " Paris", -0.26), lp(30, ".", -0.40)
    # fmt: off
    chunks = [{**native_chunk(" Paris", [7042], 1), "completion_probabilities": [first]},
              {**native_chunk(".", [30], 2), "completion_probabilities": [second]}, native_final(2)]
    # fmt: on
    assert rebuild(NATIVE, chunks)["completion_probabilities"] == [first, second]
    assert "completion_probabilities" not in rebuild(NATIVE, [native_final(2)])


def test_native_batch_is_an_array_like_llama_server_answers() -> None:
    # fmt: off
    chunks = [None, native_chunk("-", [29], 1, index=1), native_chunk("-", [29], 1), native_chunk("D", [52], 2, index=1),
              native_final(2, index=1, prompt="B"), native_chunk("zero", [13723], 2), native_final(2, prompt="A")]
    # fmt: on
    result = rebuild(NATIVE, chunks)
    got = [(r["index"], r["prompt"], r["content"], r["tokens"]) for r in result]
    assert got == [(0, "A", "-zero", [29, 13723]), (1, "B", "-D", [29, 52])]
    assert usage_of(NATIVE, result) == (10, 4)


def test_an_error_chunk_becomes_the_result() -> None:
    error = {"code": 500, "message": "context shift is disabled", "type": "server_error"}
    assert rebuild(CHAT, [CHAT_STREAM[0], CHAT_STREAM[1], {"error": error}]) == {"error": error}


def test_a_cut_off_stream_returns_what_arrived() -> None:
    message = {"role": "assistant", "content": "Hello,"}
    expected = [{"finish_reason": None, "index": 0, "message": message}]
    assert rebuild(CHAT, CHAT_STREAM[:3])["choices"] == expected
    cut = {"index": 0, "content": "Hi", "stop": False, "tokens": [1]}
    assert rebuild(NATIVE, [native_chunk("Hi", [1], 1)]) == cut
    assert rebuild(NATIVE, []) == {"index": 0, "content": "", "stop": False, "tokens": []}


@pytest.mark.parametrize(
    ("route", "chunk", "expected"),
    [
        (CHAT, CHAT_STREAM[0], False),  # role only, content null
        (CHAT, CHAT_STREAM[1], True),
        (CHAT, chat_chunk({"content": ""}), False),
        (CHAT, CHAT_STREAM[-2], False),  # finish_reason only
        (CHAT, CHAT_STREAM[-1], False),  # usage only
        (CHAT, None, False),  # batches stream a leading `data: null`
        (CHAT, {"choices": "junk"}, False),
        (CMPL, cmpl_chunk("-"), True),
        (CMPL, cmpl_chunk("", "length"), False),
        (NATIVE, native_chunk(",", [28], 1), True),
        (NATIVE, native_chunk("", [199], 1), True),  # a token whose text is empty
        (NATIVE, native_final(2), False),
        (NATIVE, [1, 2], False),
    ],
)
def test_carries_token(route: Route, chunk: Any, expected: bool) -> None:
    assert carries_token(route, chunk) is expected


def test_first_token_seen_turns_on_with_the_first_content() -> None:
    r = Reassembler(CHAT)
    seen = []
    for chunk in CHAT_STREAM:
        r.add(chunk)
        seen.append(r.first_token_seen)
    assert seen == [False, True, True, True, True, True, True]


# fmt: off
USAGE_CASES = [
    (CHAT, {"usage": {"prompt_tokens": 24, "completion_tokens": 3}, "timings": TIMINGS}, (24, 3)),
    (CMPL, {"usage": {"prompt_tokens": True, "completion_tokens": 2.0}}, (None, None)),
    (CHAT, {}, (None, None)),
    (NATIVE, {"tokens_evaluated": 9, "tokens_predicted": 2, "timings": {"prompt_n": 3, "cache_n": 4}}, (7, 2)),
    (NATIVE, {"tokens_evaluated": 9, "tokens_predicted": 2, "timings": {"prompt_n": 3}}, (9, 2)),
    (NATIVE, {"timings": {"prompt_n": 3, "cache_n": 0, "predicted_n": 8}}, (3, 8)),
    (NATIVE, [{"tokens_evaluated": 2, "tokens_predicted": 1}, {"tokens_predicted": 1}], (None, 2)),
    (NATIVE, [], (None, None)),
]
# fmt: on


@pytest.mark.parametrize(("route", "response", "expected"), USAGE_CASES)
def test_usage_of(route: Route, response: Any, expected: tuple[int | None, int | None]) -> None:
    assert usage_of(route, response) == expected


# --------------------------------------------------------------------------- framing


def compact(chunk: Any) -> bytes:
    """A ``data:`` line as llama-server prints it: compact JSON."""
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode()


def test_an_event_is_one_data_line_that_event_data_reads_back() -> None:
    error = {"error": {"message": "upstream failed mid-stream", "type": "server_error"}}
    frame = event(error)
    line, blank = frame.splitlines()  # the data line, then the blank line that ends the event
    assert blank == b""
    data = event_data(line)
    assert data is not None
    assert json.loads(data) == error


@pytest.mark.parametrize(
    ("line", "data"),
    [
        (b'data: {"index":0}', b'{"index":0}'),
        (b"data: null", b"null"),  # a batch's leading event
        (b"data: [DONE]", None),
        (b"", None),  # the blank line ending an event
        (b": keep-alive", None),
        (b"error: boom", None),
    ],
)
def test_event_data(line: bytes, data: bytes | None) -> None:
    assert event_data(line) == data


@pytest.mark.parametrize(
    ("chunk", "final"),
    [
        (CHAT_STREAM[-1], True),  # usage (and timings)
        (CHAT_STREAM[1], False),
        (CHAT_STREAM[-2], False),  # finish_reason alone: the usage chunk follows
        ({**cmpl_chunk("", "length"), "usage": cmpl_usage(4, 5, 0)}, True),
        (native_final(4), True),
        (native_chunk(",", [28], 1), False),
    ],
)
def test_may_be_final_finds_the_chunk_with_the_counts(chunk: Any, final: bool) -> None:
    assert may_be_final(compact(chunk)) is final


# --------------------------------------------------------------------------- the real server

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post(server: LlamaServer, route: Route, body: dict[str, Any]) -> bytes:
    headers = {"Content-Type": "application/json"}
    data = json.dumps(body).encode()
    request = urllib.request.Request(server.url + route, data=data, headers=headers, method="POST")
    with _OPENER.open(request, timeout=120) as response:
        answer: bytes = response.read()
        return answer


def _shape(value: Any) -> Any:
    """Keys and scalar types, recursively: what a client's parser depends on."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value if isinstance(v, dict)] or "list"
    return type(value).__name__


def _text(route: Route, response: dict[str, Any]) -> str:
    if route is CHAT:
        return str(response["choices"][0]["message"]["content"])
    return str(response["choices"][0]["text"] if route is CMPL else response["content"])


@pytest.mark.integration
@pytest.mark.parametrize(
    ("route", "body"),
    [
        (CHAT, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
        (CMPL, {"prompt": "The capital of France is", "max_tokens": 3}),
        (NATIVE, {"prompt": "The capital of France is", "n_predict": 3, "return_tokens": True}),
    ],
)
def test_reassembled_stream_has_the_real_non_streaming_shape(
    llama_server: LlamaServer, route: Route, body: dict[str, Any]
) -> None:
    body = {**body, "temperature": 0, "seed": 1}  # greedy: every top token leads by > 1 nat here
    direct = json.loads(_post(llama_server, route, body))
    lines = _post(llama_server, route, as_upstream_stream(body, route)).splitlines()
    data = [d for d in map(event_data, lines) if d is not None]
    r = Reassembler(route)
    for chunk in data:
        r.add(json.loads(chunk))
    rebuilt = r.result()
    # The relay's byte search finds the real final chunk, and not the first one.
    assert may_be_final(data[-1])
    assert not may_be_final(data[0])
    assert r.first_token_seen
    assert _shape(rebuilt) == _shape(direct)
    assert _text(route, rebuilt) == _text(route, direct)
    assert usage_of(route, rebuilt) == usage_of(route, direct)
    assert usage_of(route, rebuilt)[1] == 3
