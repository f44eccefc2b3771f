"""llama-server's streams: their framing, what each route's chunks carry, and the
non-streaming answer rebuilt from them.

The sidecar always streams from llama-server, so it sees the first token exactly (the
TTFT the gate protects: ``carries_token``), and rebuilds the answer for clients that did
not ask to stream. Each event is one ``data: <JSON>`` line (``event_data`` reads it; the
OpenAI routes end with ``data: [DONE]``). Feed every parsed value to ``Reassembler.add``;
``result()`` is the response, ``usage_of`` reads token counts from it or from a final chunk.

Rebuilt, per route (formats recorded from this llama-server build):

* chat: ``choices[i]`` by index with ``message.role``, ``message.content`` (deltas
  concatenated; null when empty and tool calls are present), ``message.reasoning_content``
  (when any arrived), ``message.tool_calls`` (merged by index: ``id``/``type``/
  ``function.name`` from the first delta carrying them, ``function.arguments``
  concatenated), ``finish_reason``, ``logprobs.content`` (concatenated; the key appears
  only if any chunk carried logprobs); top level ``created``/``model``/
  ``system_fingerprint``/``id`` from the first chunk, ``object: "chat.completion"``,
  ``usage`` and ``timings`` from the chunks that carry them.
* completions: the same top level with ``object: "text_completion"``; ``choices[i].text``
  concatenated, ``finish_reason``, ``logprobs`` = ``{"content": [...]}`` concatenated (this
  build sends chat-style logprobs here, not OpenAI's legacy arrays) or null.
* native ``/completion``: the final (``stop: true``) chunk with ``content`` and ``tokens``
  concatenated, ``completion_probabilities`` concatenated (when any arrived) and
  ``stream: false`` wherever ``stream`` appears (top level, ``generation_settings``).
  A batch (prompt = array of strings) is a JSON array of such objects, one per index,
  exactly as llama-server answers it.

Deliberately different from llama-server's own non-streaming answer:

* native ``tokens`` is filled; llama-server sends ``[]`` unless ``return_tokens`` is set.
* ``id``/``created`` are the stream's, not those a separate request would have got.
* a completions batch streams one ``usage`` per prompt; they are summed, whereas
  llama-server's non-streaming ``usage`` reports only prompt 0 (it undercounts).

Not rebuilt: OpenAI's legacy completions logprobs (``tokens``/``token_logprobs``/
``text_offset``), any field llama-server adds only to non-streaming answers, and a stream
cut off early (``result()`` then returns what arrived, ``finish_reason`` null or
``stop: false``). A mid-stream ``{"error": ...}`` chunk makes ``result()`` that error.
Batches stream a leading ``data: null``; non-object values are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from slogate_llama.routes import Route

__all__ = ["Reassembler", "Response", "carries_token", "event", "event_data", "may_be_final", "usage_of"]

Response = dict[str, Any] | list[dict[str, Any]]
"""A rebuilt answer: an object, or an array for a native batch."""

_DATA = b"data: "
_DONE = b"data: [DONE]"


def event(value: object) -> bytes:
    """One server-sent event carrying ``value`` as JSON (a ``data:`` line and a blank one)."""
    return _DATA + json.dumps(value).encode() + b"\n\n"


def event_data(line: bytes) -> bytes | None:
    """The JSON text of a ``data:`` line; None for any other line and for ``[DONE]``."""
    if not line.startswith(_DATA) or line.startswith(_DONE):
        return None
    return line[len(_DATA) :]


def may_be_final(line: bytes) -> bool:
    """Whether a ``data:`` line may be a stream's last chunk, the one with the token counts:
    ``usage`` on the OpenAI routes, ``"stop":true`` on the native one.

    A byte search, so a relay parses only these and the lines before the first token;
    it relies on llama-server printing compact JSON (no space after the colon).
    """
    return b'"usage"' in line or b'"stop":true' in line


def carries_token(route: Route, chunk: object) -> bool:
    """Whether a stream chunk carries generated output: the first one marks TTFT.

    Chat counts reasoning deltas too: a reasoning model's first token is its first
    thought. Native counts a chunk with token ids even if their text is empty.
    """
    if not isinstance(chunk, dict):
        return False
    if route is Route.NATIVE:
        return _nonempty(chunk.get("content")) or _nonempty(chunk.get("tokens"))
    for choice in _choices(chunk):
        if route is Route.CHAT:
            delta = _obj(choice.get("delta"))
            if any(_nonempty(delta.get(k)) for k in ("content", "reasoning_content", "tool_calls")):
                return True
        elif _nonempty(choice.get("text")):
            return True
    return False


@dataclass(slots=True)
class _Choice:
    """One OpenAI choice, accumulated."""

    text: list[str] = field(default_factory=list)
    """Content (chat) or text (completions) pieces, in order."""
    reasoning: list[str] = field(default_factory=list)
    """``reasoning_content`` pieces, in order."""
    role: str = "assistant"
    """The last role a delta named."""
    finish_reason: Any = None
    """The last non-null ``finish_reason``."""
    logprobs: list[Any] | None = None
    """``logprobs.content`` entries concatenated; None until a chunk carries some."""
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Tool calls by index, merged across deltas."""


@dataclass(slots=True)
class _Native:
    """One native result (one prompt of a batch), accumulated."""

    content: list[str] = field(default_factory=list)
    """``content`` pieces, in order."""
    tokens: list[Any] = field(default_factory=list)
    """``tokens`` ids, in order."""
    probabilities: list[Any] | None = None
    """``completion_probabilities`` concatenated; None until a chunk carries some."""
    final: dict[str, Any] | None = None
    """The ``stop: true`` chunk, once it came."""


class Reassembler:
    """Accumulates one stream; ``result()`` is the answer a non-streaming request gets."""

    def __init__(self, route: Route) -> None:
        self._route = route
        self._first_token_seen = False
        self._head: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._native: dict[int, _Native] = {}
        self._usage: dict[int | None, dict[str, Any]] = {}
        """Per choice index (a batch streams one each); None: a whole-request usage."""
        self._timings: dict[str, Any] | None = None
        self._error: Any = None

    @property
    def first_token_seen(self) -> bool:
        """Whether a chunk carrying generated output has arrived."""
        return self._first_token_seen

    def add(self, chunk: object) -> None:
        """Take one parsed SSE ``data:`` value."""
        if not isinstance(chunk, dict):
            return
        self._first_token_seen = self._first_token_seen or carries_token(self._route, chunk)
        if "error" in chunk:
            self._error = chunk["error"]
        elif self._route is Route.NATIVE:
            self._add_native(chunk)
        else:
            self._add_openai(chunk)

    def result(self) -> Response:
        """The rebuilt non-streaming answer (see the module docstring for its fields)."""
        if self._error is not None:
            return {"error": self._error}
        if self._route is Route.NATIVE:
            results = [self._native_result(i, n) for i, n in sorted(self._native.items())]
            if len(results) > 1:
                return results
            return results[0] if results else self._native_result(0, _Native())
        choices = [self._choice_result(i, c) for i, c in sorted(self._choices.items())]
        out: dict[str, Any] = {"choices": choices}
        for key in ("created", "model", "system_fingerprint"):
            if key in self._head:
                out[key] = self._head[key]
        out["object"] = "chat.completion" if self._route is Route.CHAT else "text_completion"
        usage = self._merged_usage()
        if usage is not None:
            out["usage"] = usage
        if "id" in self._head:
            out["id"] = self._head["id"]
        if self._timings is not None:
            out["timings"] = self._timings
        return out

    # ------------------------------------------------------------------ OpenAI routes

    def _add_openai(self, chunk: dict[str, Any]) -> None:
        chat = self._route is Route.CHAT
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in chunk:
                self._head.setdefault(key, chunk[key])
        choices = _choices(chunk)
        for choice in choices:
            state = self._choices.setdefault(_index(choice), _Choice())
            payload = _obj(choice.get("delta")) if chat else choice
            text = payload.get("content" if chat else "text")
            if isinstance(text, str):
                state.text.append(text)
            if chat:
                _add_delta(state, payload)
            if choice.get("finish_reason") is not None:
                state.finish_reason = choice["finish_reason"]
            logprobs = _obj(choice.get("logprobs")).get("content")
            if isinstance(logprobs, list):
                state.logprobs = [*(state.logprobs or []), *logprobs]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage[_index(choices[0]) if len(choices) == 1 else None] = usage
        if isinstance(chunk.get("timings"), dict):
            self._timings = chunk["timings"]

    def _choice_result(self, index: int, c: _Choice) -> dict[str, Any]:
        text = "".join(c.text)
        logprobs = None if c.logprobs is None else {"content": c.logprobs}
        if self._route is Route.COMPLETIONS:
            return {
                "text": text,
                "index": index,
                "logprobs": logprobs,
                "finish_reason": c.finish_reason,
            }
        message: dict[str, Any] = {"role": c.role}
        if c.reasoning:
            message["reasoning_content"] = "".join(c.reasoning)
        message["content"] = None if not text and c.tool_calls else text
        if c.tool_calls:
            message["tool_calls"] = [c.tool_calls[i] for i in sorted(c.tool_calls)]
        out = {"finish_reason": c.finish_reason, "index": index, "message": message}
        if logprobs is not None:
            out["logprobs"] = logprobs
        return out

    def _merged_usage(self) -> dict[str, Any] | None:
        if None in self._usage:
            return self._usage[None]
        merged: dict[str, Any] | None = None
        for _, usage in sorted(self._usage.items(), key=lambda kv: kv[0] or 0):
            merged = usage if merged is None else _sum_counts(merged, usage)
        return merged

    # ------------------------------------------------------------------ native route

    def _add_native(self, chunk: dict[str, Any]) -> None:
        state = self._native.setdefault(_index(chunk), _Native())
        if isinstance(chunk.get("content"), str):
            state.content.append(chunk["content"])
        if isinstance(chunk.get("tokens"), list):
            state.tokens.extend(chunk["tokens"])
        if isinstance(chunk.get("completion_probabilities"), list):
            state.probabilities = [*(state.probabilities or []), *chunk["completion_probabilities"]]
        if chunk.get("stop") is True:
            state.final = chunk

    @staticmethod
    def _native_result(index: int, n: _Native) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index, **(n.final or {"content": "", "stop": False})}
        out["content"] = "".join(n.content)
        out["tokens"] = list(n.tokens)
        if "stream" in out:
            out["stream"] = False
        settings = out.get("generation_settings")
        if isinstance(settings, dict) and "stream" in settings:
            out["generation_settings"] = {**settings, "stream": False}
        if n.probabilities is not None:
            out["completion_probabilities"] = n.probabilities
        return out


def usage_of(route: Route, response: Response) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) of a finished answer or final chunk; None: unknown.

    OpenAI routes read ``usage`` and fall back to ``timings`` (a chat stream without
    ``include_usage`` carries only those). Native prefers ``timings.prompt_n + cache_n``
    over ``tokens_evaluated``. A native batch sums its results, unknown if any is.
    """
    if isinstance(response, list):
        pairs = [usage_of(route, r) for r in response]
        prompts, completions = [p for p, _ in pairs], [c for _, c in pairs]
        return _total(prompts), _total(completions)
    timings = _obj(response.get("timings"))
    prompt_n, cache_n = _count(timings.get("prompt_n")), _count(timings.get("cache_n"))
    timed_prompt = None if prompt_n is None or cache_n is None else prompt_n + cache_n
    timed_completion = _count(timings.get("predicted_n"))
    if route is Route.NATIVE:
        prompt = _first(timed_prompt, _count(response.get("tokens_evaluated")))
        return prompt, _first(_count(response.get("tokens_predicted")), timed_completion)
    usage = _obj(response.get("usage"))
    return (
        _first(_count(usage.get("prompt_tokens")), timed_prompt),
        _first(_count(usage.get("completion_tokens")), timed_completion),
    )


# --------------------------------------------------------------------------- helpers


def _add_delta(state: _Choice, delta: dict[str, Any]) -> None:
    """Merge the chat-only parts of a delta: role, reasoning, tool calls."""
    if isinstance(delta.get("role"), str):
        state.role = delta["role"]
    if isinstance(delta.get("reasoning_content"), str):
        state.reasoning.append(delta["reasoning_content"])
    calls = delta.get("tool_calls")
    for position, call in enumerate(calls if isinstance(calls, list) else []):
        if not isinstance(call, dict):
            continue
        index = call["index"] if type(call.get("index")) is int else position
        merged = state.tool_calls.setdefault(
            index, {"type": "function", "function": {"name": "", "arguments": ""}, "id": ""}
        )
        function, part = merged["function"], _obj(call.get("function"))
        if _nonempty(call.get("id")) and not merged["id"]:
            merged["id"] = call["id"]
        if _nonempty(call.get("type")) and isinstance(call["type"], str):
            merged["type"] = call["type"]
        if _nonempty(part.get("name")) and isinstance(part["name"], str) and not function["name"]:
            function["name"] = part["name"]
        if isinstance(part.get("arguments"), str):
            function["arguments"] += part["arguments"]


def _choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    choices = chunk.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def _index(item: dict[str, Any]) -> int:
    index = item.get("index")
    return index if type(index) is int else 0


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _nonempty(value: object) -> bool:
    return isinstance(value, (str, list)) and len(value) > 0


def _count(value: object) -> int | None:
    return value if type(value) is int else None


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _total(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if values and len(known) == len(values) else None


def _sum_counts(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Add two usage objects field by field (nested objects too); other fields from ``a``."""
    out = {**b, **a}
    for key, value in b.items():
        mine = a.get(key)
        if type(mine) is int and type(value) is int:
            out[key] = mine + value
        elif isinstance(mine, dict) and isinstance(value, dict):
            out[key] = _sum_counts(mine, value)
    return out
