"""Live prefill rates after days of uptime, from counters printed with six significant digits.

A replay of llama-server's /metrics: true prompt counters at a constant 1,200 tok/s (one
scrape a second, 0-3 prompts of 40-500 tokens finishing per scrape, ~380 tokens on average),
printed by `exposition` exactly as llama-server prints them (``%g``: 1.00000e+08 moves in
steps of 1,000) and read back by the real parser. Each magnitude must give a live rate
within the estimator's bound, or no live rate at all (the gate's calibrated fallback).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from canned_profiles import smollm2_profile
from fake_upstream import FakeUpstream, llama_app, serve
from sidecar_harness import sidecar_in_front_of, thresholds_for
from slogate_llama.counters import LlamaCounters, rounding_step
from slogate_llama.exposition import IDLE, exposition
from slogate_sidecar.rates import RateEstimator, RateSettings
from slogate_sidecar.settings import SidecarSettings

TRUE_RATE = 1_200.0
BOUND = RateSettings().max_rounding_error
"""The promise under test: every live value within 2 % of the true rate."""
MAX_AGE_S = SidecarSettings(upstream="http://127.0.0.1:8080").rate_max_age_s
"""The sidecar's default staleness bound (30 s) the gate reads the live rate with."""
SCRAPES = 900
"""A quarter of an hour of scrapes, one a second."""


def truth(tokens: float, seconds: float, scrapes: int, seed: int, rate: float = TRUE_RATE) -> list[tuple[float, float]]:
    """True (unrounded) prompt counters at each scrape; prompts land whole, as in llama-server."""
    rng = random.Random(seed)
    out = [(tokens, seconds)]
    for _ in range(scrapes - 1):
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            prompt = rng.randint(40, 500)
            tokens += prompt
            seconds += prompt / rate
        out.append((tokens, seconds))
    return out


def printed(tokens: float, seconds: float) -> str:
    """llama-server's /metrics body for these true counters."""
    return exposition(replace(IDLE, prompt_tokens_total=tokens, prompt_seconds_total=seconds))


@dataclass
class Replay:
    estimates: list[float | None]
    """The estimate after each scrape, whatever its age or span."""
    live: list[float]
    """Every live value the gate would have read, one per scrape that had one."""
    fallbacks: int
    """Scrapes at which the gate would have used the calibrated rate."""
    first_sample: int | None
    """Index of the scrape that produced the first sample."""
    estimate: float | None
    """The estimate at the end, whatever its age or span."""
    samples: int


def replay(texts: list[str]) -> Replay:
    """Feed one /metrics body a second and read the rate as the gate does after each."""
    est = RateEstimator()
    estimates: list[float | None] = []
    live: list[float] = []
    first: int | None = None
    for i, text in enumerate(texts):
        est.observe(LlamaCounters.from_text(text), float(i))
        if first is None and est.prefill_samples:
            first = i
        estimates.append(est.prefill_tokens_per_s(float(i), math.inf))
        value = est.prefill_tokens_per_s(float(i), MAX_AGE_S)
        if value is not None:
            live.append(value)
    return Replay(estimates, live, len(texts) - len(live), first, estimates[-1], est.prefill_samples)


def relative_error(value: float) -> float:
    return abs(value / TRUE_RATE - 1)


def test_the_replay_prints_like_llama_server() -> None:
    text = printed(100_000_400, 83_333.37)
    assert "llamacpp:prompt_tokens_total 1.00000e+08" not in text  # %g drops trailing zeros
    assert "llamacpp:prompt_tokens_total 1e+08\n" in text
    assert "llamacpp:prompt_seconds_total 83333.4\n" in text
    counters = LlamaCounters.from_text(text)
    assert (counters.prompt_tokens_total, counters.prompt_seconds_total) == (1e8, 83_333.4)
    assert (rounding_step(1e8), rounding_step(83_333.4)) == (1_000.0, 0.1)


@pytest.mark.parametrize(
    ("tokens", "seconds", "outcome"),
    [
        (1e6, 1e6 / TRUE_RATE, "live"),  # steps of 10 tokens, 1 ms
        (1e7, 1e7 / TRUE_RATE, "live"),  # 100 tokens, 10 ms: a sample every ~15 scrapes
        (1e8, 1e8 / TRUE_RATE, "fallback"),  # 1,000 tokens: ~51,000 tokens (~160 s) a sample
        (1e7, 1e5, "fallback"),  # the seconds counter alone is too coarse (steps of 1 s)
        (1e8, 1e6, "fallback"),  # steps of 10 s: not one sample in a quarter of an hour
    ],
)
def test_live_rate_is_within_the_bound_or_absent(tokens: float, seconds: float, outcome: str) -> None:
    run = replay([printed(t, s) for t, s in truth(tokens, seconds, SCRAPES, seed=7)])
    if outcome == "live":
        assert run.first_sample is not None
        assert run.fallbacks == run.first_sample  # live at every scrape from the first sample on
        assert max(relative_error(v) for v in run.live) <= BOUND
    else:
        assert run.live == []  # the gate used the calibrated rate throughout
    # Samples still come, just too slowly to be live; each is within the bound all the same.
    if run.estimate is not None:
        assert relative_error(run.estimate) <= BOUND
    assert (run.samples > 0) == (seconds < 1e6)


@pytest.mark.parametrize(
    ("tokens", "interval_worst", "average_worst"), [(1e6, 0.1, 0.0), (1e7, 0.5, 0.1), (1e8, 5.0, 1.0)]
)
def test_naive_per_scrape_deltas_would_be_wrong(tokens: float, interval_worst: float, average_worst: float) -> None:
    # What the estimator did before: a sample from every interval with >= 16 printed tokens
    # and some printed seconds, averaged with weight 1 - 2^(-tokens / 512). On the same data
    # its samples are off by > 10 % / 50 % / 500 % and its average by > 10 % / 100 % at
    # 10^7 / 10^8 (at 10^6 the average hides it): the tests above can fail.
    history = truth(tokens, tokens / TRUE_RATE, 300, seed=7)
    counters = [LlamaCounters.from_text(printed(t, s)) for t, s in history]
    samples: list[float] = []
    averages: list[float] = []
    base = counters[0]
    for c in counters[1:]:
        d_tokens = c.prompt_tokens_total - base.prompt_tokens_total
        d_seconds = c.prompt_seconds_total - base.prompt_seconds_total
        if d_tokens >= 16 and d_seconds > 0:
            rate = d_tokens / d_seconds
            samples.append(rate)
            last = averages[-1] if averages else rate
            averages.append(last + (1 - 0.5 ** (d_tokens / 512)) * (rate - last))
            base = c
    assert max(relative_error(r) for r in samples) > interval_worst
    assert max(relative_error(r) for r in averages) > average_worst


def observe_printed(est: RateEstimator, history: list[tuple[float, float]], start: int = 0) -> float:
    """Observe each true state as printed, one a second from ``start``; returns the last time."""
    for i, (t, s) in enumerate(history, start):
        est.observe(LlamaCounters.from_text(printed(t, s)), float(i))
    return float(start + len(history) - 1)


def test_a_sample_gathered_over_more_than_max_age_is_not_live() -> None:
    # 10^7 tokens, 100 a second: 2 % needs ~51 steps of 100 tokens, i.e. ~51 s of traffic.
    est = RateEstimator()
    now = observe_printed(est, [(1e7 + 100 * i, (1e7 + 100 * i) / TRUE_RATE) for i in range(60)])
    assert est.prefill_samples == 1
    assert est.prefill_age_s(now) is not None
    assert est.prefill_age_s(now) <= MAX_AGE_S  # fresh, yet...
    assert est.prefill_tokens_per_s(now, MAX_AGE_S) is None  # ...gathered too slowly to be live
    live = est.prefill_tokens_per_s(now, 2 * MAX_AGE_S)
    assert live is not None
    assert relative_error(live) <= BOUND


def test_idle_time_does_not_make_a_sample_slow() -> None:
    # Unchanged counters restart the interval's clock: after 100 s of idle, one busy second
    # at 10^6 (1,000 tokens: 100 steps of 10) is a live sample at once.
    est = RateEstimator()
    idle = [(1e6, 1e6 / TRUE_RATE)] * 100
    now = observe_printed(est, [*idle, (1e6 + 1_000, (1e6 + 1_000) / TRUE_RATE)])
    live = est.prefill_tokens_per_s(now, MAX_AGE_S)
    assert live is not None
    assert relative_error(live) <= BOUND


@given(st.floats(min_value=1e-300, max_value=1e300))
def test_a_printed_value_is_within_half_a_step_of_the_true_one(true: float) -> None:
    shown = LlamaCounters.from_text(printed(true, 0.0)).prompt_tokens_total
    assert abs(shown - true) <= rounding_step(shown) / 2 * (1 + 1e-9)


magnitudes = st.floats(min_value=5.0, max_value=10.0)
rates = st.floats(min_value=50.0, max_value=5_000.0)
histories = st.floats(min_value=0.2, max_value=20.0)


@settings(max_examples=40, deadline=None)
@given(magnitudes, rates, histories, st.integers(min_value=0, max_value=2**32))
def test_every_estimate_is_within_the_bound(magnitude: float, rate: float, history: float, seed: int) -> None:
    # Any uptime (10^5 .. 10^10 prompt tokens), any true rate, a seconds counter that went
    # at another rate before (history x): never a value off by more than the bound.
    tokens = float(round(10**magnitude))
    est = RateEstimator()
    for i, (t, s) in enumerate(truth(tokens, tokens / rate * history, 240, seed, rate)):
        est.observe(LlamaCounters.from_text(printed(t, s)), float(i))
        value = est.prefill_tokens_per_s(float(i), math.inf)
        assert value is None or abs(value / rate - 1) <= BOUND + 1e-12


def test_decode_counters_are_held_to_the_same_bound() -> None:
    # 10^8 generated tokens at 45 tok/s per stream: rounding would swamp per-scrape deltas.
    est = RateEstimator()
    for i, (t, s) in enumerate(truth(1e8, 1e8 / 45.0, SCRAPES, seed=3, rate=45.0)):
        text = exposition(replace(IDLE, tokens_predicted_total=t, tokens_predicted_seconds_total=s))
        est.observe(LlamaCounters.from_text(text), float(i))
    value = est.decode_tokens_per_s(float(SCRAPES), math.inf)
    assert est.decode_samples > 0
    assert value is not None
    assert abs(value / 45.0 - 1) <= BOUND
    assert est.decode_tokens_per_s(float(SCRAPES), MAX_AGE_S) is None  # too slow to be live


class ReplayUpstream(FakeUpstream):
    """The fake llama-server, its /metrics replaying one body per scrape once started.

    Before `start` it serves the first body again and again (the sidecar's baseline);
    after, each scrape first records ``probe()``, the sidecar's estimate after the
    previous body, then gets the next body (the last one for ever once the replay ends).
    """

    def __init__(self, texts: list[str]) -> None:
        super().__init__()
        self.texts = texts
        self.served = 0
        self.probe: Callable[[], float | None] | None = None
        self.seen: list[float | None] = []

    def start(self, probe: Callable[[], float | None]) -> None:
        self.probe, self.served = probe, 1

    async def metrics(self, _r: web.Request) -> web.Response:
        if self.probe is None:
            return web.Response(text=self.texts[0])
        self.seen.append(self.probe())
        text = self.texts[min(self.served, len(self.texts) - 1)]
        self.served += 1
        return web.Response(text=text)


@pytest.mark.parametrize("tokens", [1e6, 1e7, 1e8])
async def test_sidecar_scraping_a_replaying_upstream(tokens: float, tmp_path: Path) -> None:
    # The real poller, HTTP client and parser must produce the replay's estimates, scrape
    # for scrape. Scrapes come faster than 1 s here, so staleness is lifted (max_age inf,
    # rate_max_age_s) to keep wall time out of the assertions: the live/fallback
    # decision is the replay test's.
    texts = [printed(t, s) for t, s in truth(tokens, tokens / TRUE_RATE, 400, seed=11)]
    expected = replay(texts)
    upstream = ReplayUpstream(texts)
    async with (
        serve(llama_app(upstream)) as url,
        sidecar_in_front_of(
            url, tmp_path, thresholds_for(smollm2_profile()), poll_interval_s=0.0, rate_max_age_s=1e9
        ) as gate,
    ):
        rates = gate.sidecar.rates
        upstream.start(lambda: rates.prefill_tokens_per_s(time.monotonic(), math.inf))
        for _ in range(2_000):  # a guard against hangs, not a speed claim
            if upstream.served > len(texts):
                break
            await asyncio.sleep(0.01)
        state = (await gate.state())["rates"]["prefillTokensPerSecond"]
    assert upstream.seen[: len(texts)] == expected.estimates
    assert rates.prefill_samples == expected.samples > 0
    assert all(v is None or relative_error(v) <= BOUND for v in upstream.seen)
    assert state["live"] == expected.estimate
    assert state["calibrated"] != pytest.approx(state["live"], rel=0.5)  # live replaced the seed
