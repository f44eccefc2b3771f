"""Parse and validate a client's request body before the gate decides on it.

The gate needs three numbers from a body (prompt size, output-token limit, streaming)
and must never be crashed or fooled by one, so every input either parses into a
``ParsedRequest`` or raises ``BadRequest`` with an OpenAI-style error: nothing else.

Facts about this llama-server build that shape the rules (checked against the binary):

* every output-limit field a route honours (``slogate_llama.routes.OUTPUT_LIMIT_FIELDS``:
  ``n_predict`` first, and ``-1`` is unlimited even next to a ``max_tokens``) is
  validated and the effective one is reported, else a client could slip an unlimited
  ``n_predict`` past a ``max_tokens`` the gate reserved KV for. ``with_output_limit``
  removes all of them and sets one.
* llama-server itself accepts ``max_tokens: 12.5`` and ``max_tokens: true``; the gate
  does not: a fraction or a bool is not a token count. ``12.0`` is 12, as in JSON (and
  JSON Schema): every integral number is read as that integer.
* ``max_tokens: 0`` / ``n_predict: 0`` still generate one token upstream.
* A prompt that is an array of strings is a *batch*: one result (and one slot) per
  string; an array of integers is one prompt given as token ids.
* ``null`` for an optional field means "absent", as OpenAI reads it (llama-server does
  for the top-level fields, not inside chat messages: see ``chat_messages``).
* Numbers must survive the trip: ``1e400`` (Python's inf, forwarded as ``Infinity``)
  makes llama-server's JSON parser fail, so it is a 400 here; an integer beyond 64 bits,
  which would overflow that parser, travels as the double it equals.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, NoReturn

from slogate_llama.routes import OUTPUT_LIMIT_FIELDS, Route
from slogate_sidecar.bad_request import BadRequest, invalid, json_type, missing, wrong_type
from slogate_sidecar.chat_messages import chat_prompt

__all__ = ["MAX_JSON_DEPTH", "BadRequest", "ParsedRequest", "parse_request", "with_output_limit"]

MAX_JSON_DEPTH = 64
"""Deeper bodies are refused: later serialisation must not hit the recursion limit."""
_TOO_DEEP = f"request body is nested deeper than {MAX_JSON_DEPTH} levels"
EXACT_INTEGERS = 2**53
"""Doubles are exact integers up to here: 12.0 below it is read as 12."""
MAX_JSON_INTEGER = 2**63 - 1
"""Integers beyond 64 bits overflow llama-server's JSON parser: they are read as the
(double) number they are, as JSON has it, and refused only if no double holds them."""


_ALL_LIMIT_FIELDS = frozenset(field for fields in OUTPUT_LIMIT_FIELDS.values() for field in fields)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated request: the body plus what the gate needs to know about it."""

    route: Route
    body: dict[str, Any]
    """The validated JSON object (chat: null message fields dropped, see ``chat_messages``);
    derive upstream bodies with the helpers below."""
    stream: bool
    """Whether the client asked for server-sent events."""
    max_tokens: int | None
    """The output-token limit the upstream would apply; None means unlimited."""
    prompt_chars: int
    """Characters of prompt text (0 when the prompt is token ids)."""
    prompt_token_count: int | None
    """Exact prompt length when the client sent token ids; None otherwise."""
    messages: list[Any] | None
    """The chat messages (chat route only)."""
    prompt_count: int = 1
    """Prompts in a batch (an array of strings): each takes its own slot upstream."""


def parse_request(
    route: Route,
    raw: bytes,
    *,
    max_body_bytes: int,
    max_output_tokens: int,
) -> ParsedRequest:
    """Validate ``raw`` for ``route``; raise ``BadRequest`` (and only that) when it is unfit.

    ``max_output_tokens`` bounds every output-limit field: a larger one is absurd for
    this server, and would make the KV reservation meaningless.
    """
    if len(raw) > max_body_bytes:
        raise BadRequest(
            f"request body is {len(raw)} bytes, more than the limit of {max_body_bytes}",
            status=413,
            code="request_too_large",
        )
    body = _decode(raw)
    stream = body.get("stream")
    if stream is not None and type(stream) is not bool:
        wrong_type("stream", "a boolean", stream)
    max_tokens = _output_limit(route, body, max_output_tokens)
    messages: list[Any] | None = None
    token_count: int | None = None
    count = 1
    if route is Route.CHAT:
        body, messages, chars = chat_prompt(body)
    else:
        chars, token_count, count = _text_prompt(body)
    return ParsedRequest(
        route=route,
        body=body,
        stream=stream is True,
        max_tokens=max_tokens,
        prompt_chars=chars,
        prompt_token_count=token_count,
        messages=messages,
        prompt_count=count,
    )


def with_output_limit(parsed: ParsedRequest, n: int) -> dict[str, Any]:
    """A copy of the body asking the upstream for at most ``n`` output tokens.

    Every limit field the upstream reads is removed first, so none can override ``n``.
    ``n`` must be at least 1: llama-server generates one token even when asked for 0,
    so a 0 here would silently differ from what the gate reserved.
    """
    if type(n) is not int or n < 1:
        raise ValueError(f"the output limit must be an integer >= 1, got {n!r}")
    out = {k: v for k, v in parsed.body.items() if k not in _ALL_LIMIT_FIELDS}
    out["n_predict" if parsed.route is Route.NATIVE else "max_tokens"] = n
    return out


# --------------------------------------------------------------------------- helpers


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(literal: str) -> float | int:
    """A JSON number that fits a double (1e400 would travel on as Infinity, which
    llama-server's parser refuses); an integral one is that integer, as JSON has it
    (12.0 is 12), while it is exact (|x| <= 2**53)."""
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"the number {literal[:40]} is out of range")
    if value.is_integer() and abs(value) <= EXACT_INTEGERS:
        return int(value)
    return value


def _bounded_int(literal: str) -> int | float:
    """A JSON integer; beyond 64 bits, the double it equals (see MAX_JSON_INTEGER)."""
    value = int(literal)  # ValueError past 4,300 digits: far beyond any double too
    if -MAX_JSON_INTEGER <= value <= MAX_JSON_INTEGER:
        return value
    return _finite_float(literal)


def _decode(raw: bytes) -> dict[str, Any]:
    """Strict UTF-8, strict JSON (no NaN/Infinity), bounded depth, an object at the top."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"request body is not valid UTF-8 (byte {exc.start})"
        raise BadRequest(message, code="invalid_encoding") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except RecursionError:  # the C scanner's own depth guard
        raise BadRequest(_TOO_DEEP, code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, and over-long integer literals
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if _deeper_than(value, MAX_JSON_DEPTH):
        raise BadRequest(_TOO_DEEP, code="invalid_json")
    if "\\u" in text and _has_lone_surrogate(value):
        # Only a \uD800-\uDFFF escape can carry one (strict UTF-8 cannot); llama-server's
        # parser refuses it, on /tokenize too, so it would come back as a server error.
        raise BadRequest("request body contains an unpaired UTF-16 surrogate escape", code="invalid_json")
    if not isinstance(value, dict):
        message = f"request body must be a JSON object, got {json_type(value)}"
        raise BadRequest(message, code="invalid_type")
    return value


def _has_lone_surrogate(value: object) -> bool:
    """Whether any string in ``value`` (keys included) holds an unpaired surrogate."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _deeper_than(value: object, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels; iterative, so never recursing."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[Any] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _output_limit(route: Route, body: dict[str, Any], ceiling: int) -> int | None:
    """Validate every limit field present; return the one the upstream would apply."""
    effective: int | None = None
    found = False
    for field in OUTPUT_LIMIT_FIELDS[route]:
        value = body.get(field)
        if value is None:
            continue
        if type(value) is float and value.is_integer():  # beyond 2**53: an integer, absurdly large
            invalid(field, f"'{field}' is {value:.0f}: absurd here, the server allows {ceiling}")
        if type(value) is not int:
            wrong_type(field, "an integer", value)
        unlimited = field == "n_predict" and value == -1
        if value < 0 and not unlimited:
            minimum = "-1 (unlimited) or more" if field == "n_predict" else "0 or more"
            invalid(field, f"'{field}' must be {minimum}, got {value}")
        if value > ceiling:
            invalid(field, f"'{field}' is {value}: absurd here, the server allows {ceiling}")
        if not found:
            found, effective = True, None if unlimited else value
    return effective


def _text_prompt(body: dict[str, Any]) -> tuple[int, int | None, int]:
    """(characters, exact token count or None, prompts in the batch) of ``prompt``."""
    expected = "a string, a non-empty array of strings, or a non-empty array of token ids"
    if "prompt" not in body:
        missing("prompt", expected)
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return len(prompt), None, 1
    if not isinstance(prompt, list):
        wrong_type("prompt", expected, prompt)
    if not prompt:
        invalid("prompt", f"'prompt' must be {expected}")
    first = prompt[0]
    if not isinstance(first, str) and type(first) is not int:
        wrong_type("prompt[0]", "a string or a token id (integer)", first)
    kind = type(first)
    for i, item in enumerate(prompt):
        if type(item) is not kind:
            what = "a string" if kind is str else "a token id (integer)"
            wrong_type(f"prompt[{i}]", f"{what}, like prompt[0]", item)
        if isinstance(item, int) and item < 0:
            invalid(f"prompt[{i}]", f"'prompt[{i}]' must be a token id (0 or more), got {item}")
    if kind is str:
        return sum(len(s) for s in prompt), None, len(prompt)
    return 0, len(prompt), 1
