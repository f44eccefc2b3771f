"""n_in: how many prompt tokens an arrival brings.

Token-id prompts are counted exactly for free. Text prompts are either estimated
(characters x the calibrated p95 tokens-per-character: no upstream call) or counted
by llama-server itself (/apply-template for chat, then /tokenize): exact, at the
price of one or two loopback calls. docs/sidecar.md gives the measured cost and error
of both and why tokenize is the default.
"""

from __future__ import annotations

import math
from typing import Any

import aiohttp

from slogate_sidecar.requests import ParsedRequest, Route

CHAT_TOKENS_PER_MESSAGE = 5
"""Estimate mode: role markers and separators the chat template adds per message
(SmolLM2's ChatML: <|im_start|>role\\n ... <|im_end|>\\n)."""


def estimate_prompt_tokens(parsed: ParsedRequest, tokens_per_char: float) -> int:
    """Conservative n_in from characters (exact for token-id prompts)."""
    if parsed.prompt_token_count is not None:
        return parsed.prompt_token_count
    tokens = math.ceil(parsed.prompt_chars * tokens_per_char)
    if parsed.route is Route.CHAT and parsed.messages is not None:
        tokens += CHAT_TOKENS_PER_MESSAGE * (len(parsed.messages) + 1)
    return tokens


COUNT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=2.0, sock_read=60.0)
"""The sidecar's defaults for connecting and for upstream silence (settings override them)."""


async def count_prompt_tokens(
    session: aiohttp.ClientSession, upstream: str, parsed: ParsedRequest, timeout: aiohttp.ClientTimeout = COUNT_TIMEOUT
) -> int:
    """Exact n_in from llama-server's own template and tokenizer.

    Raises aiohttp.ClientResponseError when llama-server refuses (4xx: the prompt) or
    fails, and the ``timeout``'s errors when it is silent: a stalled server must not
    hold the caller.
    """
    if parsed.prompt_token_count is not None:
        return parsed.prompt_token_count
    if parsed.route is Route.CHAT:
        templated = await _post_json(session, upstream + "/apply-template", {"messages": parsed.messages}, timeout)
        text: Any = templated["prompt"]
        return await _tokenize(session, upstream, text, timeout)
    prompt = parsed.body["prompt"]
    pieces = prompt if isinstance(prompt, list) else [prompt]
    total = 0
    for piece in pieces:
        total += await _tokenize(session, upstream, piece, timeout)
    return total


async def _tokenize(session: aiohttp.ClientSession, upstream: str, text: str, timeout: aiohttp.ClientTimeout) -> int:
    answer = await _post_json(session, upstream + "/tokenize", {"content": text, "add_special": True}, timeout)
    return len(answer["tokens"])


async def _post_json(session: aiohttp.ClientSession, url: str, body: object, timeout: aiohttp.ClientTimeout) -> Any:
    async with session.post(url, json=body, timeout=timeout) as response:
        response.raise_for_status()
        return await response.json(content_type=None)
