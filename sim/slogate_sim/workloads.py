"""What the clients send: the one workload type, its named mixes, and the arrival schedule.

A ``Workload`` is read by the load generator (``schedule``: one request at a time from
``random.Random`` streams), by the simulator (batches from numpy) and by the capacity μ
(``capacity.capacity_rps``): the same lengths, classes and patience everywhere.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Literal

from slogate_admission.tenant_schema import DEFAULT_TENANT_HEADER
from slogate_sim.lengths import Lengths, LognormalLengths, MixedLengths, SampledLengths, TokenLengths

INTERACTIVE, BATCH = "interactive", "batch"
TENANT_HEADER = DEFAULT_TENANT_HEADER
ServiceMode = Literal["profile", "exponential"]
DEFAULT_CLIENT_TIMEOUT_S = 10.0
UNIFORM_PROMPTS, UNIFORM_OUTPUTS = TokenLengths.fixed(200), TokenLengths.fixed(32)
"""The default request: 200 tokens in, 32 out."""


@dataclass(frozen=True, slots=True)
class ClassMix:
    """Each request ``interactive`` with this probability, else ``batch``."""

    interactive_fraction: float
    """Within [0, 1]."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.interactive_fraction <= 1.0:
            raise ValueError(f"interactive fraction must be within [0, 1], not {self.interactive_fraction}")

    def one(self, rng: random.Random) -> str:
        """One request's class."""
        return INTERACTIVE if rng.random() < self.interactive_fraction else BATCH


@dataclass(frozen=True, slots=True)
class Workload:
    """What the clients send, and how patient they are."""

    prompt_tokens: Lengths = UNIFORM_PROMPTS
    """n_in of each request."""
    output_tokens: Lengths = UNIFORM_OUTPUTS
    """max_tokens of each request, generated in full (ignore_eos)."""
    classes: ClassMix | None = None
    """Each request's class, sent as X-Slogate-Class; None: no class header at all."""
    name: str = "custom"
    """What reports call it."""
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S
    """A client gives up after this long and hangs up (``math.inf``: never). The load generator
    applies it to the whole answer; the simulator to the first token (its decode is not cut short)."""
    service: ServiceMode = "profile"
    """The simulator's service times: the profile's curves, or Exp(``exponential_mean_s``) (M/M/1)."""
    exponential_mean_s: float = 1.0
    """Mean server seconds per request in the ``exponential`` service mode."""

    def __post_init__(self) -> None:
        if not self.client_timeout_s > 0:
            raise ValueError(f"client timeout must be > 0, got {self.client_timeout_s}")
        if not (math.isfinite(self.exponential_mean_s) and self.exponential_mean_s > 0):
            raise ValueError(f"exponential mean must be a finite number > 0, got {self.exponential_mean_s}")

    def class_of(self, rng: random.Random) -> str | None:
        """One request's class (None without a mix: nothing is taken from ``rng``)."""
        return None if self.classes is None else self.classes.one(rng)

    def draws(self, n: int, seed: int = 1) -> list[tuple[int, int]]:
        """``n`` (prompt tokens, max tokens) pairs, drawn as the schedule draws them."""
        rng = random.Random(seed)
        return [(self.prompt_tokens.one(rng), self.output_tokens.one(rng)) for _ in range(n)]


# Chat sized for a 2-core CPU box: a median of 100 tokens, σ = 0.7 puts the 99th percentile
# near 500, where a 2 s TTFT SLO fits prompts up to ~450 tokens.
CHAT_PROMPTS = LognormalLengths(median=100, sigma=0.7, low=16, high=1000)
CHAT_OUTPUTS = SampledLengths((32, 64, 128))

PRESETS: dict[str, Workload] = {
    "uniform": Workload(name="uniform"),
    "chat": Workload(CHAT_PROMPTS, CHAT_OUTPUTS, name="chat"),
    "heavy_tail": Workload(
        MixedLengths(((0.05, TokenLengths.fixed(1500)), (0.95, TokenLengths(100, 300)))),
        TokenLengths.fixed(32),
        name="heavy_tail",
    ),
    # The SLO promise's second workload, which no constant of the gate was tuned on: longer
    # prompts with a heavier tail than chat and a wider spread of outputs.
    "long_tail": Workload(
        LognormalLengths(median=180, sigma=0.8, low=16, high=1500),
        SampledLengths((16, 64, 256)),
        name="long_tail",
        # 256 tokens at a shared slot's ~20 tokens/s take 13 s: clients wait for their answer.
        client_timeout_s=30.0,
    ),
}
DESCRIPTIONS: dict[str, str] = {
    "uniform": "200-token prompts, 32 tokens out",
    "chat": "prompts lognormal around 100 tokens (σ 0.7, capped at 1,000; ~1.5% exceed what a 2 s SLO can "
    "prefill here), max_tokens from {32, 64, 128}",
    "heavy_tail": "100-300-token prompts plus 5% of 1,500 tokens (a prefill-heavy tail that a request "
    "count does not see), 32 tokens out",
    "long_tail": "prompts lognormal around 180 tokens (σ 0.8, capped at 1,500; about a fifth beyond what a 2 s "
    "SLO can prefill here), max_tokens from {16, 64, 256}, clients patient for 30 s: the promise's second "
    "workload, tuned on by nothing",
}
"""What each preset is, in words (the report quotes these)."""


def class_mix(interactive_fraction: float) -> ClassMix:
    """``interactive`` with this probability, else ``batch``."""
    return ClassMix(interactive_fraction)


def preset(name: str, *, interactive_fraction: float | None = None) -> Workload:
    """A named workload, optionally with a class mix (None: no class header at all)."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(PRESETS)}") from None
    if interactive_fraction is None:
        return base
    return dataclasses.replace(
        base, classes=ClassMix(interactive_fraction), name=f"{name}+{interactive_fraction:g}interactive"
    )


@dataclass(frozen=True, slots=True)
class Arrival:
    """One scheduled request: when (seconds after the start) and what."""

    at_s: float
    """Seconds after the run's start."""
    first_token_id: int
    """Its prompt's first token id (the next ones follow)."""
    prompt_tokens: int
    """n_in."""
    max_tokens: int
    """n_out, generated in full."""
    class_name: str | None
    """Sent as X-Slogate-Class; None: no header."""
    tenant: str | None = None
    """Sent as X-Slogate-Tenant; None: no header."""

    def prompt(self) -> list[int]:
        """Distinct token ids per request, so no prompt cache helps."""
        return list(range(self.first_token_id, self.first_token_id + self.prompt_tokens))

    def headers(self) -> dict[str, str]:
        """The headers that say its class and tenant (none for what is unset)."""
        headers = {"X-Slogate-Class": self.class_name} if self.class_name else {}
        if self.tenant:
            headers[TENANT_HEADER] = self.tenant
        return headers


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
        n_in = workload.prompt_tokens.one(contents)
        arrivals.append(Arrival(at, first, n_in, workload.output_tokens.one(contents), workload.class_of(classes)))
