"""What the load generator sends: workload mixes and the arrival schedule drawn from a seed."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

INTERACTIVE, BATCH = "interactive", "batch"


@dataclass(frozen=True, slots=True)
class Workload:
    """What each request looks like; every draw takes the schedule's random source."""

    prompt_tokens: Callable[[random.Random], int] = lambda _rng: 200
    max_tokens: Callable[[random.Random], int] = lambda _rng: 32
    class_name: Callable[[random.Random], str | None] = lambda _rng: None
    name: str = "custom"

    def draws(self, n: int, seed: int = 1) -> list[tuple[int, int]]:
        """``n`` (prompt tokens, max tokens) pairs, for the calibrated capacity of a mix.

        A mix's μ is 1 / mean(server seconds per request) over these draws, not the
        server seconds of the mean request: service time is not linear in the prompt.
        """
        rng = random.Random(seed)
        return [(self.prompt_tokens(rng), self.max_tokens(rng)) for _ in range(n)]


def _chat_prompt(rng: random.Random) -> int:
    # Lognormal with median 100 tokens; σ = 0.7 puts the 99th percentile near 500: chat
    # sized for a 2-core CPU box, where a 2 s TTFT SLO fits prompts up to ~450 tokens.
    return max(16, min(1000, round(rng.lognormvariate(math.log(100), 0.7))))


def _heavy_tail_prompt(rng: random.Random) -> int:
    return 1500 if rng.random() < 0.05 else rng.randint(100, 300)


PRESETS: dict[str, Workload] = {
    "uniform": Workload(name="uniform"),
    "chat": Workload(_chat_prompt, lambda rng: rng.choice((32, 64, 128)), name="chat"),
    "heavy_tail": Workload(_heavy_tail_prompt, lambda _rng: 32, name="heavy_tail"),
}
DESCRIPTIONS: dict[str, str] = {
    "uniform": "200-token prompts, 32 tokens out",
    "chat": "prompts lognormal around 100 tokens (σ 0.7, capped at 1,000; ~1.5% exceed what a 2 s SLO can "
    "prefill here), max_tokens from {32, 64, 128}",
    "heavy_tail": "100-300-token prompts plus 5% of 1,500 tokens (a prefill-heavy tail that a request "
    "count does not see), 32 tokens out",
}
"""What each preset is, in words (the report quotes these)."""


def class_mix(interactive_fraction: float) -> Callable[[random.Random], str]:
    """A class draw: ``interactive`` with this probability, else ``batch`` (sent as X-Slogate-Class)."""
    if not 0.0 <= interactive_fraction <= 1.0:
        raise ValueError(f"interactive fraction must be within [0, 1], not {interactive_fraction}")
    return lambda rng: INTERACTIVE if rng.random() < interactive_fraction else BATCH


def preset(name: str, *, interactive_fraction: float | None = None) -> Workload:
    """A named workload, optionally with a class mix (None: no class header at all)."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(PRESETS)}") from None
    if interactive_fraction is None:
        return base
    return Workload(base.prompt_tokens, base.max_tokens, class_mix(interactive_fraction),
                    name=f"{name}+{interactive_fraction:g}interactive")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Arrival:
    """One scheduled request: when (seconds after the start) and what."""

    at_s: float
    first_token_id: int
    prompt_tokens: int
    max_tokens: int
    class_name: str | None

    def prompt(self) -> list[int]:
        """Distinct token ids per request, so no prompt cache helps."""
        return list(range(self.first_token_id, self.first_token_id + self.prompt_tokens))


def schedule(rate_rps: float, duration_s: float, workload: Workload, *, seed: int = 1) -> list[Arrival]:
    """Poisson arrivals at ``rate_rps`` for ``duration_s``.

    Three random streams, so the arrival times do not depend on the request contents
    and neither depends on the class mix: the same traffic with or without classes.
    """
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    times, contents, classes = (random.Random(f"{seed}/{part}") for part in ("times", "contents", "classes"))
    arrivals: list[Arrival] = []
    at = 0.0
    while True:
        at += times.expovariate(rate_rps)
        if at > duration_s:
            return arrivals
        first = contents.randrange(1000, 40000)
        n_in = workload.prompt_tokens(contents)
        arrivals.append(Arrival(at, first, n_in, workload.max_tokens(contents), workload.class_name(classes)))
