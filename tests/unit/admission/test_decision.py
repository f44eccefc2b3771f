"""The per-arrival decision: outcomes, every failed reason, and the numbers behind them."""

import math

import pytest

from canned_profiles import NOW
from slogate_admission.decision import (
    Decision,
    GateConfig,
    LiveState,
    Outcome,
    Reason,
    Request,
    decide,
)
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy


@pytest.fixture
def gate(two_class_policy: Policy, profile: CalibrationProfile) -> GateConfig:
    return GateConfig.from_thresholds(derive_thresholds(two_class_policy, profile, derived_at=NOW))


def test_idle_server_admits(gate: GateConfig) -> None:
    d = decide(gate, Request(200, 128, "interactive"), LiveState(), now=0)
    assert d.outcome is Outcome.ADMIT
    assert d.reasons == ()
    assert d.retry_after_s is None
    assert d.predicted_ttft_s == pytest.approx(gate.prefill.seconds(200))
    assert d.kv_needed_tokens == 328


def test_ttft_miss_for_top_class_rejects_at_once(gate: GateConfig) -> None:
    rate = gate.prefill_tokens_per_s
    d = decide(gate, Request(200, 128, "interactive"), LiveState(queued_prefill_tokens=2 * rate), now=0)
    assert d.outcome is Outcome.REJECT
    assert d.reasons == (Reason.TTFT,)
    assert d.retry_after_s == pytest.approx((2 * rate - d.max_queued_tokens) / rate)
    assert d.fits_ever


def test_lower_class_defers_within_its_own_slo(gate: GateConfig) -> None:
    # batch may not admit past interactive's 1 s budget, but its own 10 s SLO has slack.
    rate = gate.prefill_tokens_per_s
    d = decide(gate, Request(200, 128, "batch"), LiveState(queued_prefill_tokens=2 * rate), now=100.0)
    assert d.outcome is Outcome.DEFER
    assert d.reasons == (Reason.TTFT,)
    # No max wait in the policy: it may wait as long as its own SLO leaves slack. The queue
    # ahead prefills while it waits, so that slack is the SLO less its own prefill.
    assert d.max_wait_s == pytest.approx(10.0 - d.own_prefill_s)
    assert d.defer_deadline == pytest.approx(100.0 + d.max_wait_s)


def test_all_failed_reasons_are_reported(gate: GateConfig) -> None:
    rate = gate.prefill_tokens_per_s
    state = LiveState(queued_prefill_tokens=5 * rate, streams=4, reserved_kv_tokens=8000)
    d = decide(gate, Request(500, 500, "interactive"), state, now=0)
    assert d.outcome is Outcome.REJECT
    assert set(d.reasons) == {Reason.TTFT, Reason.KV, Reason.CONCURRENCY, Reason.DECODE}


def test_kv_gate_uses_worst_case_reservation(gate: GateConfig) -> None:
    state = LiveState(reserved_kv_tokens=8192 - 1000)
    assert decide(gate, Request(200, 800, "interactive"), state, now=0).outcome is Outcome.ADMIT
    d = decide(gate, Request(200, 801, "interactive"), state, now=0)
    assert d.reasons == (Reason.KV,)
    assert d.kv_free_tokens == 1000
    assert d.kv_needed_tokens == 1001
    assert d.outcome is Outcome.DEFER  # slots free when a stream ends


def test_request_beyond_one_slot_never_fits(gate: GateConfig) -> None:
    d = decide(gate, Request(1500, 1000, "batch"), LiveState(), now=0)
    assert d.outcome is Outcome.REJECT
    assert d.reasons == (Reason.TTFT, Reason.KV)  # 1,500 tokens also exceed the 1 s admit budget
    assert not d.fits_ever
    assert d.retry_after_s is None


def test_degradation_clamps_max_tokens(two_class_policy: Policy, profile: CalibrationProfile) -> None:
    raw = two_class_policy.model_dump(by_alias=True)
    degrading = Policy.model_validate({**raw, "degradation": {"clampMaxTokens": True}})
    gate = GateConfig.from_thresholds(derive_thresholds(degrading, profile, derived_at=NOW))
    d = decide(gate, Request(200, 2000, "interactive"), LiveState(), now=0)
    assert d.outcome is Outcome.ADMIT
    assert d.clamped
    assert d.output_tokens == 2048 - 200


def test_reserved_slot_only_for_top_class(gate: GateConfig) -> None:
    state = LiveState(streams=3)
    assert decide(gate, Request(100, 100, "interactive"), state, now=0).outcome is Outcome.ADMIT
    d = decide(gate, Request(100, 100, "batch"), state, now=0)
    assert d.reasons == (Reason.CONCURRENCY,)
    assert d.concurrency_cap == 3


def test_unknown_class_gets_the_default(gate: GateConfig) -> None:
    assert decide(gate, Request(10, 10, "nope"), LiveState(), now=0).class_name == "batch"
    assert decide(gate, Request(10, 10, None), LiveState(), now=0).class_name == "batch"


def test_a_wait_is_bounded_by_the_slot_it_would_get(gate: GateConfig) -> None:
    """Its own bound, not a reference request's: it may wait when the slot it would get is
    expected within its SLO less its own prefill, and is refused at once (queue full) when not."""
    batch = gate.classes["batch"]
    request = Request(100, 100, "batch")
    own = decide(gate, request, LiveState(), now=0).own_prefill_s
    slack = batch.ttft_slo_s - own
    soon = decide(gate, request, LiveState(streams=3, slot_wait_s=slack - 0.01), now=0)
    assert (soon.outcome, soon.reasons) == (Outcome.DEFER, (Reason.CONCURRENCY,))
    assert soon.max_wait_s == pytest.approx(slack)
    for late in (slack + 0.01, math.inf):  # inf: more wait ahead of it than streams are in service
        refused = decide(gate, request, LiveState(streams=3, slot_wait_s=late), now=0)
        assert refused.outcome is Outcome.REJECT
        assert refused.reasons == (Reason.CONCURRENCY, Reason.QUEUE_FULL)
    # A queue too deep for its class's budget: it may wait for the queue to drain to that
    # depth when the drain comes within the slack, not when it does not.
    rate = gate.prefill_tokens_per_s
    shallow = decide(gate, request, LiveState(queued_prefill_tokens=2 * rate), now=0)
    assert (shallow.outcome, shallow.reasons) == (Outcome.DEFER, (Reason.TTFT,))
    deep = decide(gate, request, LiveState(queued_prefill_tokens=(slack + 2) * rate), now=0)
    assert deep.outcome is Outcome.REJECT


def test_time_spent_deferred_counts_against_the_budget(gate: GateConfig) -> None:
    fresh = decide(gate, Request(100, 10, "interactive"), LiveState(), now=0)
    waited = decide(gate, Request(100, 10, "interactive", waited_s=0.5), LiveState(), now=0)
    assert waited.predicted_ttft_s == pytest.approx(fresh.predicted_ttft_s + 0.5)
    assert waited.max_queued_tokens == pytest.approx(fresh.max_queued_tokens - 0.5 * gate.prefill_tokens_per_s)
    late = decide(gate, Request(100, 10, "interactive", waited_s=1.0), LiveState(), now=0)
    assert late.outcome is Outcome.REJECT
    assert late.reasons == (Reason.TTFT,)


def test_slower_live_rate_raises_prediction(gate: GateConfig) -> None:
    calibrated = decide(gate, Request(300, 10), LiveState(queued_prefill_tokens=100), now=0)
    slow = decide(
        gate,
        Request(300, 10),
        LiveState(queued_prefill_tokens=100, prefill_tokens_per_s=gate.prefill_tokens_per_s / 2),
        now=0,
    )
    assert slow.predicted_ttft_s == pytest.approx(2 * calibrated.predicted_ttft_s)


def test_retry_after_for_capacity_uses_next_release(gate: GateConfig) -> None:
    no_defer = GateConfig(**{**{f: getattr(gate, f) for f in gate.__slots__}, "max_wait_s": 0.0})
    d: Decision = decide(no_defer, Request(100, 100, "batch"), LiveState(streams=3, next_release_s=4.5), now=0)
    assert d.outcome is Outcome.REJECT
    assert d.retry_after_s == 4.5
