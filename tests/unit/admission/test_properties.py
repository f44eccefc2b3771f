"""Hypothesis properties of the decision: monotone in load, ordered by class."""

import math

from hypothesis import given
from hypothesis import strategies as st

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Outcome, Reason, Request, decide
from slogate_admission.derivation import derive_thresholds
from slogate_admission.kv import kv_gate
from slogate_admission.retry import retry_after_s
from slogate_admission.schema import Policy

POLICY = Policy.model_validate(
    {
        "slo": {"timePerOutputTokenSeconds": 0.05},  # every class sets its own TTFT SLO
        "classes": [
            {"name": "gold", "ttftSeconds": 1.0, "reservedSlots": 1},
            {"name": "silver", "ttftSeconds": 3.0, "reservedSlots": 1},
            {"name": "bronze", "ttftSeconds": 10.0},
        ],
    }
)
GATE = GateConfig.from_thresholds(derive_thresholds(POLICY, smollm2_profile(), derived_at=NOW))
CLASSES = ["gold", "silver", "bronze"]

requests = st.builds(
    Request,
    prompt_tokens=st.integers(0, 2500),
    output_tokens=st.integers(0, 2500),
    class_name=st.sampled_from([*CLASSES, None, "unknown"]),
)
states = st.builds(
    LiveState,
    queued_prefill_tokens=st.floats(0, 20_000),
    streams=st.integers(0, 6),
    reserved_kv_tokens=st.integers(0, 8192),
    deferred=st.integers(0, 20),
    prefill_tokens_per_s=st.none() | st.floats(50, 2000),
    next_release_s=st.floats(0, 60),
    slot_wait_s=st.floats(0, 60) | st.just(math.inf),
    ttft_margin=st.floats(1, 3),
)


@given(requests, states, st.floats(0, 20_000))
def test_more_queued_tokens_never_turns_reject_into_admit(r: Request, s: LiveState, extra: float) -> None:
    before = decide(GATE, r, s, now=0)
    after = decide(
        GATE,
        r,
        LiveState(**{**_fields(s), "queued_prefill_tokens": s.queued_prefill_tokens + extra}),
        now=0,
    )
    if before.outcome is not Outcome.ADMIT:
        assert after.outcome is not Outcome.ADMIT
    assert after.predicted_ttft_s >= before.predicted_ttft_s


@given(requests, states, st.floats(0, 20_000))
def test_retry_after_non_negative_and_non_decreasing_in_queue(r: Request, s: LiveState, extra: float) -> None:
    before = decide(GATE, r, s, now=0)
    after = decide(
        GATE,
        r,
        LiveState(**{**_fields(s), "queued_prefill_tokens": s.queued_prefill_tokens + extra}),
        now=0,
    )
    for d in (before, after):
        assert d.retry_after_s is None or d.retry_after_s >= 0
    if before.retry_after_s is not None and after.retry_after_s is not None:
        assert after.retry_after_s >= before.retry_after_s


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e6), st.floats(1, 5000))
def test_retry_after_formula_monotone(q: float, extra: float, admissible: float, rate: float) -> None:
    assert 0 <= retry_after_s(q, admissible, rate) <= retry_after_s(q + extra, admissible, rate)


@given(requests, states, st.sampled_from(CLASSES), st.sampled_from(CLASSES))
def test_higher_class_admitted_whenever_lower_is(r: Request, s: LiveState, a: str, b: str) -> None:
    high, low = sorted((a, b), key=CLASSES.index)
    low_decision = decide(GATE, Request(r.prompt_tokens, r.output_tokens, low), s, now=0)
    if low_decision.outcome is Outcome.ADMIT:
        assert decide(GATE, Request(r.prompt_tokens, r.output_tokens, high), s, now=0).outcome is Outcome.ADMIT


@given(requests, states, st.integers(0, 8192))
def test_kv_gate_monotone_in_free_memory(r: Request, s: LiveState, freed: int) -> None:
    more_free = LiveState(**{**_fields(s), "reserved_kv_tokens": max(s.reserved_kv_tokens - freed, 0)})
    if decide(GATE, r, s, now=0).outcome is Outcome.ADMIT:
        assert decide(GATE, r, more_free, now=0).outcome is Outcome.ADMIT


@given(st.floats(0, 1e9), st.floats(0, 1e9), st.floats(0, 1e9))
def test_kv_gate_formula_monotone(free: float, more: float, needed: float) -> None:
    if kv_gate(free, needed):
        assert kv_gate(free + more, needed)


@given(requests, states)
def test_decision_is_internally_consistent(r: Request, s: LiveState) -> None:
    d = decide(GATE, r, s, now=5.0)
    assert (d.outcome is Outcome.ADMIT) == (not d.reasons)
    if d.outcome is Outcome.DEFER:
        assert 0 < d.max_wait_s <= GATE.max_wait_s
        assert d.defer_deadline == 5.0 + d.max_wait_s
        slo = GATE.limits_for(d.class_name).ttft_slo_s
        # The queue ahead prefills during the wait: what is left after it is its own prefill.
        assert r.waited_s + s.ttft_margin * d.own_prefill_s + d.max_wait_s <= slo + 1e-9
        assert d.predicted_ttft_quantile_s <= slo + 1e-9
        if {Reason.CONCURRENCY, Reason.KV, Reason.DECODE} & set(d.reasons):
            assert s.slot_wait_s <= d.max_wait_s  # the slot it waits for is expected in time
    if d.outcome is Outcome.ADMIT:
        assert d.predicted_ttft_s <= d.ttft_budget_s + 1e-9
        assert d.kv_needed_tokens <= d.kv_free_tokens


def _fields(s: LiveState) -> dict[str, object]:
    return {f: getattr(s, f) for f in LiveState.__slots__}
