"""Adaptive repetitions against a scripted llama-server: how many timings each point gets.

The fake client answers every completion with the next scripted timing for that prompt
length (or number of concurrent streams) and moves a fake clock by it, so budgets are
tested on the fake clock, never on the wall clock.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest

from slogate_calibration.measure import (
    DECODE_MIN_ROUNDS,
    PREFILL_RULE,
    TOLERANCE,
    PromptMaker,
    confidence,
    decode_point,
    decode_points,
    prefill_point,
    prefill_points,
)
from slogate_calibration.repetition import (
    Allowance,
    Repeated,
    RepeatRule,
    median_uncertainty,
    relative_spread,
    repeat_unsettled,
    time_required,
)
from slogate_llama.client import Timings, UpstreamError

SHORT, LONG = 32, 1024  # at least three timings, at least two


class FakeClock:
    """Seconds that pass only when the scripted server says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ScriptedServer:
    """Prefill: the next scripted seconds for the prompt's length. Decode (n_predict > 1):
    the next scripted tokens/s for the round's number of streams, the same for each stream."""

    def __init__(self, clock: FakeClock, prefill: dict[int, list[float]], decode: dict[int, list[float]] | None = None):
        self.clock = clock
        self.prefill = {n: list(times) for n, times in prefill.items()}
        self.decode = {b: list(rates) for b, rates in (decode or {}).items()}
        self.in_flight = 0
        self.round: list[float] = []
        self.calls: list[int] = []

    async def complete(self, prompt: Sequence[int], n_predict: int) -> Timings:
        if n_predict == 1:
            seconds = self.prefill[len(prompt)].pop(0)
            self.calls.append(len(prompt))
            self.clock.now += seconds
            return Timings(prompt_n=len(prompt), prompt_ms=seconds * 1000, predicted_n=1, predicted_ms=1, cache_n=0)
        # A decode round: the streams arrive together; the first one draws the round's rate.
        self.in_flight += 1
        await asyncio.sleep(0)
        streams = self.in_flight
        if not self.round:
            rate = self.decode[streams].pop(0)
            self.round = [rate] * streams
            self.clock.now += n_predict / rate
        rate = self.round.pop()
        self.in_flight -= 1
        return Timings(
            prompt_n=len(prompt), prompt_ms=10, predicted_n=n_predict, predicted_ms=n_predict / rate * 1000, cache_n=0
        )


MAKER = PromptMaker(list(range(1000, 1100)))


async def sweep(server: ScriptedServer, lengths: Sequence[int], deadline: float = math.inf) -> list[Repeated]:
    points = prefill_points(server, MAKER, lengths)
    await time_required(points, server.clock, lambda: None)
    await repeat_unsettled(points, Allowance(deadline, server.clock), lambda: None)
    return points


async def test_a_quiet_machine_gets_the_minimum_timings() -> None:
    server = ScriptedServer(FakeClock(), {SHORT: [0.100, 0.101, 0.100], LONG: [4.00, 4.02]})
    short, long = await sweep(server, [SHORT, LONG])
    assert (len(short.values), len(long.values)) == (3, 2)
    assert short.settled
    assert long.settled
    assert server.calls == [SHORT, LONG, SHORT, LONG, SHORT]  # in rounds, not one length after another


async def test_one_disturbed_timing_costs_one_more_and_is_outvoted() -> None:
    server = ScriptedServer(FakeClock(), {SHORT: [0.1, 0.1, 0.1], LONG: [4.00, 6.00, 4.02, 99.0]})
    _, long = await sweep(server, [SHORT, LONG])
    assert long.values == [4.00, 6.00, 4.02]
    assert long.settled
    assert prefill_point(long).seconds == 4.02


async def test_persistent_noise_stops_at_the_maximum_and_says_so() -> None:
    noisy = [4.0, 5.0, 4.4, 3.6, 4.8, 3.7, 4.1, 4.9]
    server = ScriptedServer(FakeClock(), {SHORT: [0.1, 0.1, 0.1], LONG: noisy})
    short, long = await sweep(server, [SHORT, LONG])
    assert len(long.values) == PREFILL_RULE.max_timings
    assert not long.settled
    conf = confidence([short, long], [short], reference_tokens=512)
    assert conf.unsettled_prefill_tokens == (LONG,)


async def test_repetitions_stop_before_the_deadline_cheap_points_first() -> None:
    clock = FakeClock()
    noisy_short = [0.10, 0.13, 0.09, 0.12, 0.10, 0.13, 0.09]
    noisy_long = [4.0, 5.0, 4.4, 3.6, 4.8, 3.7, 4.1]
    server = ScriptedServer(clock, {SHORT: noisy_short, LONG: noisy_long})
    # One timing of each takes 4.1 s; a second long one (4 s) ends by 9.3 s; a third (5 s, its
    # dearest so far) would end past 14 s, after the deadline: only the short prompt goes on.
    long, short = await sweep(server, [LONG, SHORT], deadline=13.0)
    assert len(long.values) == 2
    assert len(short.values) == PREFILL_RULE.max_timings
    assert clock.now <= 13.0
    assert server.calls == [LONG, SHORT, SHORT, LONG] + [SHORT] * (PREFILL_RULE.max_timings - 2)


async def test_each_round_times_the_cheapest_points_first() -> None:
    noisy_short = [0.10, 0.13, 0.09, 0.12, 0.10, 0.13, 0.09]
    noisy_long = [4.0, 5.0, 4.4, 3.6, 4.8, 3.7, 4.1]
    server = ScriptedServer(FakeClock(), {SHORT: noisy_short, LONG: noisy_long})
    await sweep(server, [LONG, SHORT])
    assert server.calls[2:4] == [SHORT, LONG]  # the first round after the required timings, listed long first


async def test_a_long_point_is_repeated_only_while_it_would_end_in_time() -> None:
    clock = FakeClock()
    server = ScriptedServer(clock, {LONG: [4.0, 5.0, 4.4, 3.6, 4.8, 3.7]})
    points = prefill_points(server, MAKER, [LONG])
    await time_required(points, clock, lambda: None)
    taken = await repeat_unsettled(points, Allowance(19.0, clock), lambda: None)
    # After the required 4 s, each more is expected to cost its dearest so far (4, then 5 s):
    # three fit (by 9, 13.4 and 17 s); a fourth would end at 22 s.
    assert taken == 3
    assert clock.now == pytest.approx(17.0)


async def test_decode_rounds_minimum_and_one_disturbed_round() -> None:
    clock = FakeClock()
    server = ScriptedServer(clock, {}, {1: [100.0, 101.0, 100.0], 2: [60.0, 40.0, 60.5, 30.0]})
    points = decode_points(server, MAKER, 2)
    assert [p.required for p in points] == [1, 2]  # every slot busy: the confidence's point
    await time_required(points, clock, lambda: None)
    await repeat_unsettled(points, Allowance(math.inf, clock), lambda: None)
    one, two = points
    assert len(one.values) == DECODE_MIN_ROUNDS
    assert two.values == [60.0, 40.0, 60.5]  # the median of three already outvotes the slow round
    assert decode_point(two).tokens_per_second == 60.0
    assert decode_point(two).timings == 3


async def test_a_cached_prompt_cannot_be_timed() -> None:
    class Cached(ScriptedServer):
        async def complete(self, prompt: Sequence[int], n_predict: int) -> Timings:
            return Timings(prompt_n=len(prompt), prompt_ms=1, predicted_n=n_predict, predicted_ms=1, cache_n=5)

    (point,) = prefill_points(Cached(FakeClock(), {}), MAKER, [SHORT])
    with pytest.raises(UpstreamError, match="prompt cache"):
        await point.time_once(FakeClock())


def test_spread_and_uncertainty_of_known_values() -> None:
    # Two values: MAD = half their gap; b_2 = 1.196.
    assert relative_spread([1.00, 1.02]) == pytest.approx(1.4826 * 1.196 * 0.01 / 1.01)
    assert median_uncertainty([1.00, 1.02]) == pytest.approx(1.2533 * relative_spread([1.00, 1.02]) / math.sqrt(2))
    # One outlier among three: the MAD is the smaller gap to the median.
    assert relative_spread([1.00, 1.01, 1.50]) == pytest.approx(1.4826 * 1.495 * 0.01 / 1.01)
    assert median_uncertainty([1.00, 1.01, 1.50]) < TOLERANCE < median_uncertainty([1.00, 1.50])
    # More agreeing values narrow the median, the spread of one value stays.
    few, many = [1.0, 1.1, 0.9, 1.05], [1.0, 1.1, 0.9, 1.05] * 4
    assert median_uncertainty(many) < median_uncertainty(few) / 1.5
    assert median_uncertainty([1.0]) == math.inf
    assert relative_spread([1.0]) == 0.0


def test_confidence_names_the_reference_length_and_the_top_b() -> None:
    async def never() -> float:
        raise AssertionError("not timed")

    rule = RepeatRule(tolerance=TOLERANCE, max_timings=6)
    prefill = [
        Repeated(32, never, rule, 3, values=[0.1, 0.1, 0.1]),
        Repeated(496, never, rule, 3, values=[2.0, 2.04, 1.98]),
        Repeated(1024, never, rule, 2, values=[4.0, 5.0]),
    ]
    decode = [Repeated(b, never, rule, 3, values=[50.0 / b, 51.0 / b, 50.0 / b]) for b in (1, 2)]
    conf = confidence(prefill, decode, reference_tokens=512)
    assert conf.prefill_reference_tokens == 496  # the measured length nearest 512
    assert conf.prefill_uncertainty == pytest.approx(median_uncertainty([2.0, 2.04, 1.98]))
    assert (conf.decode_streams, conf.decode_uncertainty) == (2, pytest.approx(median_uncertainty([25, 25.5, 25])))
    assert conf.unsettled_prefill_tokens == (1024,)
    assert conf.unsettled_decode_streams == ()
    assert conf.tolerance == TOLERANCE
    point = prefill_point(prefill[2])
    assert (point.timings, point.seconds, point.spread) == (2, 4.5, pytest.approx(relative_spread([4.0, 5.0])))


async def test_a_timing_still_running_at_the_hard_stop_is_dropped() -> None:
    stuck = asyncio.Event()  # never set: the machine stalled past every estimate

    async def hangs() -> float:
        await stuck.wait()
        return 1.0

    clock = FakeClock()
    point = Repeated(LONG, hangs, PREFILL_RULE, 2, values=[4.0, 5.0], costs=[4.0, 5.0])
    taken = await repeat_unsettled([point], Allowance(math.inf, clock), lambda: None, stop_in_s=0.01)
    assert taken == 0
    assert point.values == [4.0, 5.0]  # what it had; the run goes on to fit them
    assert point.costs == [4.0, 5.0]


async def test_a_busy_machine_ends_in_time_with_the_timings_it_could_take() -> None:
    """Every prompt length four times slower than planned for: the required timings (one each,
    two of the reference length) end, the rest of the minimum stops at the deadline, and the
    confidence is stated on what was measured instead of the run failing."""
    clock = FakeClock()
    slow = {SHORT: [0.4] * 6, 512: [6.0, 6.1, 6.0, 6.05], LONG: [16.0, 16.2, 16.1]}
    server = ScriptedServer(clock, slow)
    points = prefill_points(server, MAKER, [SHORT, 512, LONG], reference_tokens=512)
    assert [p.required for p in points] == [1, 2, 1]
    await time_required(points, clock, lambda: None)
    assert clock.now == pytest.approx(0.4 + 6.0 + 16.0 + 6.1)
    await repeat_unsettled(points, Allowance(34.0, clock), lambda: None)
    short, reference, long = points
    assert len(long.values) == 1  # a second (16 s) would end past the deadline
    assert len(reference.values) == 2  # a third (6.1 s) too
    assert len(short.values) == 3
    assert clock.now <= 34.0
    stated = confidence(points, points[:1], reference_tokens=512)
    assert stated.prefill_reference_tokens == 512
    assert math.isfinite(stated.prefill_uncertainty)
    assert stated.unsettled_prefill_tokens == (LONG,)  # one timing: its median's error is unknown
