"""n_in: how many prompt tokens an arrival brings.

Token-id prompts are counted exactly for free. Text prompts are either estimated
(characters x the calibrated p95 tokens-per-character: no upstream call) or counted
by llama-server itself (/apply-template for chat, then /tokenize): exact, at the
price of one or two loopback calls. docs/sidecar.md gives the measured cost and error
of both and why tokenize is the default.
"""

from __future__ import annotations

import math

import aiohttp

from slogate_llama.client import LlamaClient
from slogate_llama.routes import Route
from slogate_sidecar.requests import ParsedRequest

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
    """Exact n_in from llama-server's own template and tokenizer (``LlamaClient.count_tokens``).

    Raises aiohttp.ClientResponseError when llama-server refuses (4xx: the prompt) or
    fails, and the ``timeout``'s errors when it is silent: a stalled server must not
    hold the caller.
    """
    if parsed.prompt_token_count is not None:
        return parsed.prompt_token_count
    llama = LlamaClient(upstream, session)
    if parsed.route is Route.CHAT:
        return await llama.count_tokens(await llama.apply_template(parsed.messages, timeout), timeout)
    prompt = parsed.body["prompt"]
    pieces = prompt if isinstance(prompt, list) else [prompt]
    total = 0
    for piece in pieces:
        total += await llama.count_tokens(piece, timeout)
    return total
