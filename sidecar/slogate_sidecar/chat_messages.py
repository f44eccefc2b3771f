"""Validate a chat request's messages and tools the way llama-server will read them.

llama-server answers 500 ("Failed to parse messages/tools") to many malformed chat
bodies, and the gate would relay that as a 502: a client's mistake reported as a
server fault. So the gate checks, before deciding, every field that build parses
strictly (checked against the binary, see tests/integration/test_faults_bad_input.py):

* a message's ``role`` is a string; ``name``, ``tool_call_id`` and
  ``reasoning_content`` are strings; ``content`` is a string, null, or text parts;
* content parts other than ``text`` (images, audio) are refused: the gate cannot
  count their tokens, so it could not bound their prefill (and this server has no
  multimodal projector: it answers 500 to them);
* ``tool_calls`` is an array of ``{"type": "function", "function": {"name": str}}``
  with an optional string ``id``; ``tools`` an array of the same function shape;
* ``reasoning_format`` is one of llama-server's names.

``null`` means "absent" (as in OpenAI's API), but llama-server fails on a null
``name``, ``id``, ``tool_call_id``...: such keys are dropped from what is forwarded.
"""

from __future__ import annotations

from typing import Any

from slogate_sidecar.bad_request import invalid, missing, wrong_type

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
"""llama-server's accepted ``reasoning_format`` names (anything else is its 500)."""
_STRING_FIELDS = ("name", "tool_call_id", "reasoning_content")
_EXPECTED_MESSAGES = "a non-empty array of message objects"


def without_nulls(obj: dict[str, Any], keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The object without null-valued keys (all, or only ``keys``): null means absent."""
    return {k: v for k, v in obj.items() if v is not None or (keys is not None and k not in keys)}


def chat_prompt(body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """(the body to forward, its messages, characters of their text content)."""
    if "messages" not in body:
        missing("messages", _EXPECTED_MESSAGES)
    messages = body["messages"]
    if not isinstance(messages, list):
        wrong_type("messages", _EXPECTED_MESSAGES, messages)
    if not messages:
        invalid("messages", f"'messages' must be {_EXPECTED_MESSAGES}")
    cleaned = [_message(f"messages[{i}]", message) for i, message in enumerate(messages)]
    chars = sum(_content_chars(f"messages[{i}]", message.get("content")) for i, message in enumerate(cleaned))
    forwarded = {**body, "messages": cleaned}
    if body.get("tools") is not None:
        forwarded["tools"] = _tools(body["tools"])
    reasoning = body.get("reasoning_format")
    if reasoning is None:
        forwarded.pop("reasoning_format", None)
    elif reasoning not in REASONING_FORMATS:
        if not isinstance(reasoning, str):
            wrong_type("reasoning_format", "a string", reasoning)
        invalid("reasoning_format", f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}")
    return forwarded, cleaned, chars


def _message(where: str, message: object) -> dict[str, Any]:
    """One message, checked, as forwarded (null string fields and tool calls dropped)."""
    if not isinstance(message, dict):
        wrong_type(where, "an object", message)
    if not isinstance(message.get("role"), str):
        wrong_type(f"{where}.role", "a string", message.get("role"))
    for field in _STRING_FIELDS:
        value = message.get(field)
        if value is not None and not isinstance(value, str):
            wrong_type(f"{where}.{field}", "a string", value)
    checked = dict(message)
    if message.get("tool_calls") is not None:
        checked["tool_calls"] = _tool_calls(f"{where}.tool_calls", message["tool_calls"])
    return without_nulls(checked, (*_STRING_FIELDS, "tool_calls"))


def _content_chars(where: str, content: object) -> int:
    """Characters of one message's content: a string, text parts, or null."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        wrong_type(f"{where}.content", "a string, an array of content parts, or null", content)
    chars = 0
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            wrong_type(at, "a content part object", part)
        kind = part.get("type")
        if not isinstance(kind, str):
            wrong_type(f"{at}.type", "a string", kind)
        if kind != "text":
            invalid(
                f"{at}.type",
                f"'{at}.type' is {kind!r}: only text parts can be gated (their tokens cannot be counted)",
                code="slogate_text_only",
            )
        text = part.get("text")
        if not isinstance(text, str):
            wrong_type(f"{at}.text", "a string", text)
        chars += len(text)
    return chars


def _function(where: str, item: object, key: str) -> dict[str, Any]:
    """A ``{"type": "function", key: {"name": str, ...}}`` object, nulls dropped."""
    if not isinstance(item, dict):
        wrong_type(where, "an object", item)
    if item.get("type") != "function":
        if not isinstance(item.get("type"), str):
            wrong_type(f"{where}.type", "a string", item.get("type"))
        invalid(f"{where}.type", f"'{where}.type' must be 'function', got {item['type']!r}")
    function = item.get(key)
    if not isinstance(function, dict):
        wrong_type(f"{where}.{key}", "an object", function)
    if not isinstance(function.get("name"), str):
        wrong_type(f"{where}.{key}.name", "a string", function.get("name"))
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        wrong_type(f"{where}.{key}.description", "a string", description)
    return without_nulls({**item, key: without_nulls(function)})


def _tool_calls(where: str, calls: object) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        wrong_type(where, "an array of tool calls", calls)
    checked = []
    for k, call in enumerate(calls):
        at = f"{where}[{k}]"
        function = _function(at, call, "function")
        if "id" in function and not isinstance(function["id"], str):
            wrong_type(f"{at}.id", "a string", function["id"])
        checked.append(function)
    return checked


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        wrong_type("tools", "an array of function tools", tools)
    return [_function(f"tools[{k}]", tool, "function") for k, tool in enumerate(tools)]
