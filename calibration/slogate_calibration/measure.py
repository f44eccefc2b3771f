"""The measured points: prefill per prompt length, decode per B, tokenizer density.

Each point drives the real llama-server and reads llama-server's own timings
(server-side: no HTTP or client overhead). A point is the median of repeated timings,
because this is a shared, noisy machine; how often each is repeated is decided in
``repetition``, and fitting and the profile are built elsewhere.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from slogate_admission.schema import CalibrationConfidence, DecodePoint, PrefillPoint, TokensPerChar
from slogate_calibration.repetition import Repeated, RepeatRule
from slogate_llama.client import LlamaClient, Timings, UpstreamError

Tick = Callable[[], None]
"""Called once per request finished: drives the progress bar."""


class Completer(Protocol):
    """What timing a point needs of a llama-server: ``LlamaClient.complete`` (or a test's script)."""

    async def complete(self, prompt: Sequence[int], n_predict: int) -> Timings: ...


def prefill_lengths(ctx_per_slot: int, reserve: int = 16) -> list[int]:
    """Prompt lengths from short to the per-slot context: 32, 128, 512, 1024, then the top.

    Quadrupling steps cover the curve's bend with few long (expensive) prompts: the
    whole sweep is ~3,700 tokens, ~14 s at 270 tok/s. The top length leaves
    ``reserve`` cells for the generated token.
    """
    top = ctx_per_slot - reserve
    lengths = [n for n in (32, 128, 512, 1024) if n < top]
    if not lengths or top > lengths[-1]:
        lengths.append(top)
    return lengths


class PromptMaker:
    """Token prompts of exact lengths, each starting at a fresh random place.

    ``cache_prompt: false`` already stops prefix reuse; distinct prompts make sure no
    other cache (a slot's leftover KV) can shorten the prefill we time.
    """

    def __init__(self, material: Sequence[int], seed: int = 0) -> None:
        if len(material) < 16:
            raise ValueError("prompt material too short")
        self._material = list(material)
        self._rng = random.Random(seed)

    def make(self, n: int) -> list[int]:
        """n token ids, cycling through the material from a random offset."""
        start = self._rng.randrange(len(self._material))
        m = self._material
        return [m[(start + i) % len(m)] for i in range(n)]


TOLERANCE = 0.03
"""A point is timed again while its median is uncertain by more than 3% (one standard error)."""
PREFILL_RULE = RepeatRule(tolerance=TOLERANCE, max_timings=6)
"""At most six timings of a prompt length: about what single timings scattering by 6%
(this 2-core VM) need to bring the median within 3%."""
DECODE_RULE = RepeatRule(tolerance=TOLERANCE, max_timings=6)
"""At most six rounds of B streams (whose timings scatter less)."""
SHORT_PROMPT_TOKENS = 512
"""Prompts up to this long are timed at least three times, longer ones at least twice.
The short ones are cheap (32 + 128 + 512 tokens are a fifth of a sweep) and decide the
rate at the derivation's 512-token reference prompt most; the long ones are most of the
budget and get more only while their median is uncertain and the budget has room."""
DECODE_MIN_ROUNDS = 3
"""Rounds of B streams every B gets: a round is cheap, and the median of three outvotes
one disturbed round before the rule has to notice it."""


def prefill_min_timings(n: int) -> int:
    """Timings a prompt length gets whatever they say (see SHORT_PROMPT_TOKENS)."""
    return 3 if n <= SHORT_PROMPT_TOKENS else 2


def prefill_points(
    client: Completer, maker: PromptMaker, lengths: Sequence[int], reference_tokens: int | None = None
) -> list[Repeated]:
    """One point per prompt length, each timed alone (no contention) with n_predict = 1:
    then ``prompt_ms`` is the prefill, in seconds. The length nearest ``reference_tokens``
    (the one ``confidence`` states) requires two timings."""
    reference = reference_length(lengths, reference_tokens) if reference_tokens is not None else None

    def timing(n: int) -> Callable[[], Awaitable[float]]:
        async def once() -> float:
            timings = await client.complete(maker.make(n), n_predict=1)
            if timings.cache_n:
                raise UpstreamError(f"prompt cache served {timings.cache_n} tokens; cannot time prefill")
            if timings.prompt_n != n:
                raise UpstreamError(f"asked to prefill {n} tokens, the server prefilled {timings.prompt_n}")
            return timings.prompt_ms / 1000

        return once

    return [
        Repeated(n, timing(n), PREFILL_RULE, prefill_min_timings(n), required=2 if n == reference else 1)
        for n in lengths
    ]


def reference_length(lengths: Sequence[int], reference_tokens: int) -> int:
    """The measured prompt length nearest the reference prompt (the shorter on a tie)."""
    return min(lengths, key=lambda n: (abs(n - reference_tokens), n))


def decode_points(
    client: Completer, maker: PromptMaker, max_streams: int, *, n_predict: int = 64, prompt_tokens: int = 16
) -> list[Repeated]:
    """One point per B = 1..max_streams: a round runs B streams at once, and its value is
    the median per-stream tokens/s of its streams.

    Short prompts keep prefill from polluting the decode timing; ``ignore_eos`` makes
    every stream decode exactly ``n_predict`` tokens."""

    def timing(streams: int) -> Callable[[], Awaitable[float]]:
        async def once() -> float:
            runs = [client.complete(maker.make(prompt_tokens), n_predict) for _ in range(streams)]
            return statistics.median(t.predicted_per_second for t in await asyncio.gather(*runs))

        return once

    # Every slot busy is the point ``confidence`` states: it requires two rounds.
    return [
        Repeated(b, timing(b), DECODE_RULE, DECODE_MIN_ROUNDS, required=2 if b == max_streams else 1)
        for b in range(1, max_streams + 1)
    ]


def prefill_point(point: Repeated) -> PrefillPoint:
    """The measured point, with how many timings it is the median of and their spread."""
    return PrefillPoint(prompt_tokens=point.key, seconds=point.median, timings=len(point.values), spread=point.spread)


def decode_point(point: Repeated) -> DecodePoint:
    """The measured point, with how many rounds it is the median of and their spread."""
    return DecodePoint(
        streams=point.key, tokens_per_second=point.median, timings=len(point.values), spread=point.spread
    )


def confidence(prefill: Sequence[Repeated], decode: Sequence[Repeated], reference_tokens: int) -> CalibrationConfidence:
    """The profile's stated confidence: the prefill point nearest the reference prompt, the
    decode point with every slot busy, and the points left unsettled."""
    ref_key = reference_length([p.key for p in prefill], reference_tokens)
    ref = next(p for p in prefill if p.key == ref_key)
    top = max(decode, key=lambda p: p.key)
    return CalibrationConfidence(
        tolerance=TOLERANCE,
        prefill_reference_tokens=ref.key,
        prefill_uncertainty=ref.uncertainty,
        decode_streams=top.key,
        decode_uncertainty=top.uncertainty,
        unsettled_prefill_tokens=tuple(p.key for p in prefill if not p.settled),
        unsettled_decode_streams=tuple(p.key for p in decode if not p.settled),
    )


async def measure_tokens_per_char(client: LlamaClient, samples: Sequence[str], tick: Tick) -> TokensPerChar:
    """Tokens per character over each sample: mean, p95 (nearest rank) and max."""
    ratios: list[float] = []
    for text in samples:
        ratios.append(len(await client.tokenize(text)) / len(text))
        tick()
    ordered = sorted(ratios)
    p95 = ordered[max(math.ceil(0.95 * len(ordered)), 1) - 1]
    return TokensPerChar(mean=statistics.fmean(ratios), p95=p95, max=ordered[-1], samples=len(ratios))
