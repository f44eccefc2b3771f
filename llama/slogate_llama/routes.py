"""llama-server's three generation routes, and what each reads of a request body.

Facts of this llama-server build (checked against the binary): ``n_predict`` is honoured
on every route and wins over ``max_completion_tokens`` (chat), which wins over
``max_tokens``; ``n_predict: -1`` means unlimited even next to a ``max_tokens``; and
``stream_options.include_usage`` (OpenAI routes) puts ``usage`` in the final chunk.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

__all__ = ["OUTPUT_LIMIT_FIELDS", "Route", "as_upstream_stream"]


class Route(StrEnum):
    """The generation endpoints (the value is the path)."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    NATIVE = "/completion"


OUTPUT_LIMIT_FIELDS: Mapping[Route, tuple[str, ...]] = {
    Route.CHAT: ("n_predict", "max_completion_tokens", "max_tokens"),
    Route.COMPLETIONS: ("n_predict", "max_tokens"),
    Route.NATIVE: ("n_predict", "max_tokens"),
}
"""The output-limit fields each route honours, highest precedence first."""


def as_upstream_stream(body: dict[str, Any], route: Route) -> dict[str, Any]:
    """A copy that streams, with usage in the final chunk on the OpenAI routes.

    The sidecar always streams from llama-server so it sees the first token exactly.
    """
    out = {**body, "stream": True}
    if route is not Route.NATIVE:
        options = body.get("stream_options")
        out["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
    return out
