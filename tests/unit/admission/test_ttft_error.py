"""The TTFT error model: a bias by streams in service, a margin per class for the SLO's quantile."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Outcome, Reason, Request, decide
from slogate_admission.derivation import derive_thresholds, ttft_margin_prior
from slogate_admission.gate_machine import GateMachine
from slogate_admission.schema import CalibrationProfile, Policy, PrefillPoint, Thresholds
from slogate_admission.ttft_error import BiasByLoad, Margin, TtftErrorModel


def thresholds(quantile: float = 0.99, cap: int = 4) -> Thresholds:
    policy = Policy.model_validate({"slo": {"ttftSeconds": 2.0, "quantile": quantile}, "concurrency": {"max": cap}})
    return derive_thresholds(policy, smollm2_profile(), derived_at=NOW)


def test_the_bias_converges_per_bucket_and_is_bounded() -> None:
    bias = BiasByLoad(buckets=3, batch=4)
    # With two streams in service first tokens come 30% late: after one batch the factor says so ...
    for _ in range(4):
        bias.observe(2, 1.3)
    assert bias.factor(2) == pytest.approx(1.3)
    assert bias.factor(0) == bias.factor(1) == 1.0  # ... and only there
    # ... predictions made with it in force are right: the factor stays.
    for _ in range(4):
        bias.observe(2, 1.0)
    assert bias.factor(2) == pytest.approx(1.3)
    assert bias.factor(7) == bias.factor(2)  # beyond the last bucket: the last bucket's
    for _ in range(40):  # a pathological stretch cannot push it past the clamp
        bias.observe(0, 10.0)
    assert bias.factor(0) == 2.0


def test_the_margin_is_the_order_statistic_of_its_quantile() -> None:
    margin = Margin(quantile=0.9, prior=1.05)
    assert margin.value == 1.05  # nothing judged: the prior
    for ratio in (1.3, 0.9, 1.1):
        margin.observe(ratio)
    assert margin.value == 1.3  # fewer than q / (1 − q) = 9 samples: the largest seen
    for _ in range(16):
        margin.observe(1.0)
    # 19 samples: k = ⌈0.9 · 20⌉ = 18, the 18th smallest of 0.9, sixteen 1.0, 1.1, 1.3
    assert margin.value == 1.1
    for _ in range(30):
        margin.observe(1.0)
    # 49 samples: k = 45, a 1.0, below the prior: the prior holds
    assert margin.value == 1.05


def test_the_margin_slides_and_never_drops_below_one() -> None:
    margin = Margin(quantile=0.5, prior=1.0, window=3)
    for ratio in (3.0, 0.5, 0.6, 0.7):  # the 3.0 slides out of the window
        margin.observe(ratio)
    assert margin.samples == 3
    assert margin.value == 1.0  # the median ratio 0.6 is below 1: the gate keeps its median
    with pytest.raises(ValueError, match="window"):
        Margin(quantile=0.9, window=0)


@pytest.mark.parametrize("quantile", [0.9, 0.99])
def test_the_margin_covers_its_quantile_of_new_ratios_whatever_the_tail(quantile: float) -> None:
    """A heavy tail (Pareto-like: most ratios near 1, a few of 2 or 3): the share of new ratios
    above the margin in force is at most 1 − q, up to sampling noise."""
    rng = random.Random(7)
    margin = Margin(quantile=quantile, window=256)
    exceeded = judged = 0
    for i in range(40_000):
        ratio = math.exp(rng.gauss(0.0, 0.1)) * (1 + rng.paretovariate(3.0) / 4)
        if i >= 256:
            judged += 1
            exceeded += ratio > margin.value
        margin.observe(ratio)
    assert (1 - quantile) / 3 < exceeded / judged < (1 - quantile) * 1.5


def test_small_predictions_teach_the_bias_but_not_the_margin() -> None:
    model = TtftErrorModel.fresh(quantile=0.99, prior=1.0, max_streams=4)
    model.bias.batch = 1
    model.observe("default", slo_s=2.0, streams=1, predicted_s=0.2, actual_s=0.3)  # below SLO / 4
    assert model.bias.factor(1) == pytest.approx(1.5)
    assert "default" not in model.margins
    model.observe("default", slo_s=2.0, streams=1, predicted_s=0.01, actual_s=0.6)  # below 50 ms: nothing
    assert model.bias.factor(1) == pytest.approx(1.5)
    model.observe("default", slo_s=2.0, streams=1, predicted_s=1.0, actual_s=1.1)
    assert model.margins["default"].samples == 1


@given(
    queued=st.floats(0, 5000),
    prompt=st.integers(1, 1500),
    waited=st.floats(0, 1.5),
    margin=st.floats(1.0, 3.0),
)
def test_an_admitted_request_fits_the_slo_at_its_quantile(
    queued: float, prompt: int, waited: float, margin: float
) -> None:
    config = GateConfig.from_thresholds(thresholds())
    request = Request(prompt, 16, waited_s=waited)
    state = LiveState(queued_prefill_tokens=queued, ttft_margin=margin)
    d = decide(config, request, state, now=0.0)
    limits = config.limits_for(None)
    assert d.predicted_ttft_quantile_s == pytest.approx(waited + margin * (d.predicted_ttft_s - waited))
    if Reason.TTFT not in d.reasons:
        assert d.predicted_ttft_quantile_s <= limits.ttft_slo_s * (1 + 1e-9)
    # The margin only ever narrows what is admitted: admitted with it, admitted without.
    plain = decide(config, request, LiveState(queued_prefill_tokens=queued), now=0.0)
    if d.outcome is Outcome.ADMIT:
        assert plain.outcome is Outcome.ADMIT


def test_the_machine_learns_from_first_tokens_and_keeps_it_across_a_rederivation() -> None:
    machine = GateMachine()
    machine.load(thresholds(), 0.0)
    errors = machine.errors
    assert errors is not None
    errors.bias.batch = 2
    predicted = []
    for i in range(2):  # one at a time (B = 0), each first token 1.5x its prediction
        now = 10.0 * i
        verdict = machine.arrive(Request(400, 8), now)
        assert verdict.ticket is not None
        predicted.append(verdict.decision.predicted_ttft_s)
        machine.first_token(verdict.ticket, now + 1.5 * verdict.ticket.predicted_remaining_s)
        machine.release(verdict.ticket, now + 5.0)
    assert errors.bias.factor(0) == pytest.approx(1.5)
    assert machine.decide(Request(400, 8), 30.0).predicted_ttft_s == pytest.approx(1.5 * predicted[0])
    machine.load(thresholds().model_copy(update={"derived_at": NOW}), 31.0)  # the same server: kept
    assert machine.errors is errors
    machine.load(thresholds(quantile=0.95), 32.0)  # another promise: learned afresh
    assert machine.errors is not errors
    assert machine.errors is not None
    assert machine.errors.quantile == 0.95


def test_the_prior_is_the_calibrations_timing_noise_at_the_quantile() -> None:
    profile = smollm2_profile()

    def with_points(*points: PrefillPoint) -> CalibrationProfile:
        return profile.model_copy(update={"prefill": profile.prefill.model_copy(update={"points": points})})

    noisy = with_points(
        PrefillPoint(prompt_tokens=128, seconds=0.1, timings=5, spread=0.2),
        PrefillPoint(prompt_tokens=480, seconds=0.4, timings=5, spread=0.04),  # nearest 512
        PrefillPoint(prompt_tokens=1024, seconds=0.9, timings=5, spread=0.3),
    )
    assert ttft_margin_prior(noisy, 512, 0.99) == pytest.approx(math.exp(2.3263 * 0.04), rel=1e-4)
    assert ttft_margin_prior(noisy, 512, 0.5) == 1.0  # a median needs no margin
    assert ttft_margin_prior(with_points(PrefillPoint(prompt_tokens=480, seconds=0.4)), 512, 0.99) == 1.0
    assert ttft_margin_prior(with_points(), 512, 0.99) == 1.0
