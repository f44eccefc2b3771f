"""The measuring stages: prefill sweep, decode sweep, tokenizer density.

Each stage drives the real llama-server with llama-server's own timings (server-side:
no HTTP or client overhead) and returns plain numbers; fitting and the profile are
built elsewhere. Medians over repetitions, because this is a shared, noisy machine.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections.abc import Callable, Sequence

from slogate_admission.schema import DecodePoint, PrefillPoint, TokensPerChar
from slogate_calibration.upstream import LlamaClient, UpstreamError

Tick = Callable[[], None]
"""Called once per request finished: drives the progress bar."""


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


def median_points(points: Sequence[PrefillPoint]) -> list[PrefillPoint]:
    """One point per prompt length: the median time of its repetitions.

    A neighbour's burst of CPU use doubles one measurement; the median of three
    ignores it where a mean (or a least-squares fit over raw points) would not.
    """
    by_length: dict[int, list[float]] = {}
    for p in points:
        by_length.setdefault(p.prompt_tokens, []).append(p.seconds)
    return [PrefillPoint(prompt_tokens=n, seconds=statistics.median(times)) for n, times in sorted(by_length.items())]


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


PREFILL_AGREEMENT = 0.10
"""Two timings of one length within 10% of each other are trusted; else a third decides."""


async def _time_prefill(client: LlamaClient, maker: PromptMaker, n: int) -> PrefillPoint:
    timings = await client.complete(maker.make(n), n_predict=1)
    if timings.cache_n:
        raise UpstreamError(f"prompt cache served {timings.cache_n} tokens; cannot time prefill")
    return PrefillPoint(prompt_tokens=timings.prompt_n, seconds=timings.prompt_ms / 1000)


async def measure_prefill(
    client: LlamaClient, maker: PromptMaker, lengths: Sequence[int], tick: Tick
) -> list[PrefillPoint]:
    """One request at a time (no contention), n_predict = 1: prompt_ms is the prefill.

    Each length is timed twice (in two passes, so a slow spell hits different
    lengths), and a third time only where the two disagree by more than 10%: the
    median of three then discards the disturbed one. Long prompts are most of the
    budget, so they are not repeated when they need not be.
    """
    passes: list[list[PrefillPoint]] = [[], []]
    for timed in passes:
        for n in lengths:
            timed.append(await _time_prefill(client, maker, n))
            tick()
    first, second = passes
    points = [*first, *second]
    for a, b in zip(first, second, strict=True):
        if abs(a.seconds - b.seconds) > PREFILL_AGREEMENT * min(a.seconds, b.seconds):
            points.append(await _time_prefill(client, maker, a.prompt_tokens))
    return points


async def measure_decode(
    client: LlamaClient,
    maker: PromptMaker,
    max_streams: int,
    repeats: int,
    tick: Tick,
    *,
    n_predict: int = 64,
    prompt_tokens: int = 16,
) -> list[DecodePoint]:
    """B = 1..max_streams streams at once; per-stream tokens/s is the median over streams and runs.

    Short prompts keep prefill from polluting the decode timing; ``ignore_eos`` makes
    every stream decode exactly ``n_predict`` tokens.
    """
    result: list[DecodePoint] = []
    for streams in range(1, max_streams + 1):
        rates: list[float] = []
        for _ in range(repeats):
            runs = [client.complete(maker.make(prompt_tokens), n_predict) for _ in range(streams)]
            rates.extend(t.predicted_per_second for t in await asyncio.gather(*runs))
            tick()
        result.append(DecodePoint(streams=streams, tokens_per_second=statistics.median(rates)))
    return result


async def measure_tokens_per_char(client: LlamaClient, samples: Sequence[str], tick: Tick) -> TokensPerChar:
    """Tokens per character over each sample: mean, p95 (nearest rank) and max."""
    ratios: list[float] = []
    for text in samples:
        ratios.append(len(await client.tokenize(text)) / len(text))
        tick()
    ordered = sorted(ratios)
    p95 = ordered[max(math.ceil(0.95 * len(ordered)), 1) - 1]
    return TokensPerChar(mean=statistics.fmean(ratios), p95=p95, max=ordered[-1], samples=len(ratios))
