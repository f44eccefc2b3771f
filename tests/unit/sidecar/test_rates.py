"""Live rates from llama-server's counter deltas, and the TTFT prediction-error window."""

from __future__ import annotations

import math
from itertools import accumulate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slogate_llama.counters import LlamaCounters
from slogate_sidecar.rates import RateEstimator, RateSettings, TtftErrorTracker


def counters(prompt_tokens: float, prompt_s: float, predicted: float = 0.0, predicted_s: float = 0.0) -> LlamaCounters:
    return LlamaCounters(
        prompt_tokens_total=prompt_tokens,
        prompt_seconds_total=prompt_s,
        tokens_predicted_total=predicted,
        tokens_predicted_seconds_total=predicted_s,
        n_decode_total=0.0,
        requests_processing=0.0,
        requests_deferred=0.0,
    )


def feed(est: RateEstimator, snapshots: list[LlamaCounters]) -> float:
    """Observe one snapshot a second from t = 0; returns the time of the last."""
    for i, snap in enumerate(snapshots):
        est.observe(snap, float(i))
    return float(len(snapshots) - 1)


def weight(tokens: float, half_life: float) -> float:
    return 1.0 - math.pow(0.5, tokens / half_life)


@pytest.mark.parametrize(("prefill_rate", "decode_rate"), [(330.0, 45.0), (290.0, 98.0), (1000.0, 175.0)])
def test_constant_rates_are_recovered(prefill_rate: float, decode_rate: float) -> None:
    est = RateEstimator()
    snaps = [counters(600 * i, 600 * i / prefill_rate, 100 * i, 100 * i / decode_rate) for i in range(6)]
    now = feed(est, snaps)
    assert est.prefill_tokens_per_s(now, max_age_s=5) == pytest.approx(prefill_rate)
    assert est.decode_tokens_per_s(now, max_age_s=5) == pytest.approx(decode_rate)
    assert est.prefill_samples == 5
    assert est.decode_samples == 5


def test_first_baseline_is_not_a_sample_and_first_sample_sets_the_rate() -> None:
    est = RateEstimator()
    est.observe(counters(10_000, 50.0, 3_000, 40.0), 0.0)  # long history: only a baseline
    assert est.prefill_tokens_per_s(0.0, max_age_s=5) is None
    est.observe(counters(10_300, 51.0, 3_050, 41.0), 1.0)
    assert est.prefill_tokens_per_s(1.0, max_age_s=5) == pytest.approx(300.0)
    assert est.decode_tokens_per_s(1.0, max_age_s=5) == pytest.approx(50.0)


def test_prefill_and_decode_are_sampled_independently() -> None:
    est = RateEstimator()
    feed(est, [counters(0, 0, 0, 0), counters(400, 2.0, 0, 0)])
    assert est.prefill_tokens_per_s(1.0, max_age_s=5) == pytest.approx(200.0)
    assert est.decode_tokens_per_s(1.0, max_age_s=5) is None
    assert est.decode_age_s(1.0) is None


@pytest.mark.parametrize(
    ("d_tokens", "d_seconds"),
    [
        (3, 0.001),  # a tiny prompt at an absurd rate
        (15, 0.5),  # one below min_tokens
        (500, 0.0),  # tokens with no measured time (six-digit rounding)
        (0, 0.0),  # idle
        (0, 1.0),
    ],
)
def test_uninformative_intervals_leave_the_estimate(d_tokens: int, d_seconds: float) -> None:
    est = RateEstimator(RateSettings(min_tokens=16))
    feed(est, [counters(0, 0), counters(300, 1.0)])
    est.observe(counters(300 + d_tokens, 1.0 + d_seconds), 2.0)
    assert est.prefill_samples == 1
    assert est.prefill_tokens_per_s(2.0, max_age_s=5) == pytest.approx(300.0)
    assert est.prefill_age_s(2.0) == pytest.approx(1.0)  # the age of the last real sample


def test_a_rate_overflowing_to_infinity_is_not_a_sample() -> None:
    est = RateEstimator()
    feed(est, [counters(0, 0), counters(500, 1e-320)])  # 5e322 tok/s: inf in floats
    assert est.prefill_samples == 0
    assert est.prefill_tokens_per_s(1.0, max_age_s=5) is None
    est.observe(counters(800, 1.0), 2.0)  # the baseline was kept: 800 tokens in 1 s
    assert est.prefill_tokens_per_s(2.0, max_age_s=5) == pytest.approx(800.0)


def test_small_intervals_accumulate_into_a_sample() -> None:
    # 10 tokens per scrape never reach min_tokens alone; the baseline is kept, so the
    # second scrape completes one 20-token interval at 20 / 0.2 = 100 tok/s.
    est = RateEstimator(RateSettings(min_tokens=16))
    feed(est, [counters(0, 0), counters(10, 0.1)])
    assert est.prefill_samples == 0
    est.observe(counters(20, 0.2), 2.0)
    assert est.prefill_samples == 1
    assert est.prefill_tokens_per_s(2.0, max_age_s=5) == pytest.approx(100.0)


def test_counter_going_backwards_rebases_without_a_sample() -> None:
    est = RateEstimator()
    feed(est, [counters(0, 0, 0, 0), counters(3_000, 10.0, 500, 10.0)])
    est.observe(counters(100, 0.5, 10, 0.1), 5.0)  # llama-server restarted
    assert est.restarts == 1
    assert est.prefill_samples == 1
    assert est.prefill_tokens_per_s(5.0, max_age_s=10) == pytest.approx(300.0)
    assert est.decode_tokens_per_s(5.0, max_age_s=10) == pytest.approx(50.0)
    # The next interval is measured from the restarted counters, not from before.
    est.observe(counters(100 + 2_000, 0.5 + 10.0, 10 + 2_000, 0.1 + 40.0), 6.0)
    assert est.prefill_tokens_per_s(6.0, max_age_s=10) == pytest.approx(300 + weight(2_000, 512) * (200 - 300))
    assert est.decode_tokens_per_s(6.0, max_age_s=10) == pytest.approx(50 + weight(2_000, 256) * (50 - 50))


def test_one_counter_backwards_is_a_restart() -> None:
    est = RateEstimator()
    feed(est, [counters(0, 0, 0, 0), counters(3_000, 10.0, 500, 10.0)])
    est.observe(counters(3_500, 11.0, 500, 9.0), 2.0)
    assert est.restarts == 1
    assert est.prefill_samples == 1  # the 500 prompt tokens were not taken as a sample


def test_non_finite_snapshot_is_ignored() -> None:
    est = RateEstimator()
    feed(est, [counters(0, 0), counters(300, 1.0)])
    est.observe(counters(math.nan, 2.0), 2.0)
    est.observe(counters(600, 2.0), 3.0)
    assert est.restarts == 0
    assert est.prefill_samples == 2
    assert est.prefill_tokens_per_s(3.0, max_age_s=5) == pytest.approx(300.0)


@pytest.mark.parametrize(
    ("now", "max_age_s", "fresh"),
    [(10.0, 5.0, True), (15.0, 5.0, True), (15.001, 5.0, False), (100.0, 5.0, False)],
)
def test_bounded_staleness(now: float, max_age_s: float, fresh: bool) -> None:
    est = RateEstimator()
    est.observe(counters(0, 0, 0, 0), 9.0)
    est.observe(counters(330, 1.0, 45, 1.0), 10.0)
    prefill = est.prefill_tokens_per_s(now, max_age_s)
    decode = est.decode_tokens_per_s(now, max_age_s)
    assert (prefill, decode) == ((pytest.approx(330.0), pytest.approx(45.0)) if fresh else (None, None))
    assert est.prefill_age_s(now) == pytest.approx(now - 10.0)
    assert est.decode_age_s(now) == pytest.approx(now - 10.0)


def test_seed_alone_is_not_a_live_rate() -> None:
    est = RateEstimator(prefill_start=330.0, decode_start=45.0)
    est.observe(counters(0, 0, 0, 0), 0.0)
    assert est.prefill_tokens_per_s(0.0, max_age_s=1e9) is None
    assert est.decode_tokens_per_s(0.0, max_age_s=1e9) is None
    assert est.prefill_age_s(0.0) is None


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (16, 100 + weight(16, 512) * 100),
        (512, 150.0),  # the half-life: half way
        (1024, 175.0),
        (2_000, 100 + weight(2_000, 512) * 100),
    ],
)
def test_weight_grows_with_tokens(tokens: int, expected: float) -> None:
    est = RateEstimator(prefill_start=100.0)
    feed(est, [counters(0, 0), counters(tokens, tokens / 200)])
    assert est.prefill_tokens_per_s(1.0, max_age_s=5) == pytest.approx(expected)


def test_a_few_tokens_barely_move_a_big_interval_moves_a_lot() -> None:
    small = RateEstimator(RateSettings(min_tokens=1), prefill_start=300.0)
    feed(small, [counters(0, 0), counters(3, 3 / 30)])  # 30 tok/s, 3 tokens
    big = RateEstimator(RateSettings(min_tokens=1), prefill_start=300.0)
    feed(big, [counters(0, 0), counters(2_000, 2_000 / 30)])
    small_rate = small.prefill_tokens_per_s(1.0, max_age_s=5)
    big_rate = big.prefill_tokens_per_s(1.0, max_age_s=5)
    assert small_rate is not None
    assert big_rate is not None
    assert 298.0 < small_rate < 300.0  # moved < 1 % of the way
    assert 30.0 < big_rate < 60.0  # moved > 90 % of the way


@pytest.mark.parametrize(
    "kwargs",
    [{"min_tokens": 0}, {"prefill_half_life_tokens": 0.0}, {"decode_half_life_tokens": math.inf}],
)
def test_invalid_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        RateSettings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("start", [0.0, -1.0, math.nan])
def test_invalid_start_is_refused(start: float) -> None:
    with pytest.raises(ValueError, match="prefill_start"):
        RateEstimator(prefill_start=start)


intervals = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=5_000),
        st.floats(min_value=1e-3, max_value=100.0, allow_nan=False),
    ),
    min_size=1,
    max_size=40,
)


@given(intervals, st.one_of(st.none(), st.floats(min_value=1.0, max_value=5_000.0)))
def test_estimate_lies_between_the_interval_rates(steps: list[tuple[int, float]], start: float | None) -> None:
    # Ignored intervals are merged into the next one; a merged rate is a mediant
    # (Σ tokens / Σ seconds), so the bounds hold over every interval fed.
    est = RateEstimator(prefill_start=start)
    tokens = [0.0, *accumulate(float(t) for t, _ in steps)]
    seconds = [0.0, *accumulate(s for _, s in steps)]
    for i, (t, s) in enumerate(zip(tokens, seconds, strict=True)):
        est.observe(counters(t, s), float(i))
    value = est.prefill_tokens_per_s(float(len(steps)), max_age_s=math.inf)
    rates = [t / s for t, s in steps] + ([] if start is None else [start])
    if value is None:
        assert sum(t for t, _ in steps) < est.settings.min_tokens
    else:
        assert min(rates) * (1 - 1e-9) <= value <= max(rates) * (1 + 1e-9)


snapshot_values = st.floats(min_value=0.0, max_value=1e7, allow_nan=False)


@given(st.lists(st.tuples(snapshot_values, snapshot_values, snapshot_values, snapshot_values)))
def test_estimate_is_never_negative_even_with_restarts(
    snaps: list[tuple[float, float, float, float]],
) -> None:
    est = RateEstimator()
    for i, snap in enumerate(snaps):
        est.observe(counters(*snap), float(i))
        for value in (
            est.prefill_tokens_per_s(float(i), math.inf),
            est.decode_tokens_per_s(float(i), math.inf),
        ):
            assert value is None or (math.isfinite(value) and value >= 0)


def test_medians_of_error_and_ratio() -> None:
    tracker = TtftErrorTracker()
    for predicted, actual in [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0)]:
        tracker.record(predicted, actual, slo_s=1.5)
    summary = tracker.summary()
    assert summary.samples == 3
    assert summary.median_abs_relative_error == pytest.approx(0.5)  # of 0.5, 0, 1
    assert summary.median_ratio == pytest.approx(1.0)  # of 2, 1, 0.5
    assert (summary.met, summary.missed) == (2, 1)


def test_window_keeps_the_latest_but_counts_everything() -> None:
    tracker = TtftErrorTracker(window=3)
    for actual in [10.0, 10.0, 1.0, 1.0, 2.0]:
        tracker.record(1.0, actual, slo_s=5.0)
    assert len(tracker) == 3
    assert tracker.median_ratio() == pytest.approx(1.0)  # of 1, 1, 2: the 10s are gone
    assert (tracker.met, tracker.missed) == (3, 2)


def test_empty_tracker_has_no_medians() -> None:
    summary = TtftErrorTracker().summary()
    assert (summary.samples, summary.median_abs_relative_error, summary.median_ratio) == (
        0,
        None,
        None,
    )


@pytest.mark.parametrize(("predicted", "actual"), [(0.0, 1.0), (1.0, 0.0), (math.inf, 1.0)])
def test_degenerate_pairs_count_for_the_slo_only(predicted: float, actual: float) -> None:
    tracker = TtftErrorTracker()
    tracker.record(predicted, actual, slo_s=2.0)
    assert len(tracker) == 0
    assert tracker.met == 1


def test_window_must_hold_something() -> None:
    with pytest.raises(ValueError, match="window"):
        TtftErrorTracker(window=0)
