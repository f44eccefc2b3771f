"""Issue 12.7: deferral is alive by default. L_max per class = cap + ⌊μ · W⌋, W the wait a
deferred request can afford within its own SLO; the decision lets such a request wait."""

import math

import pytest

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Outcome, Reason, Request, decide
from slogate_admission.derivation import (
    deferral_l_max,
    deferral_wait_s,
    derive_thresholds,
    prefill_curve,
)
from slogate_admission.schema import Policy, Thresholds

EXAMPLE_CLASSES = [
    {"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1},
    {"name": "batch", "ttftSeconds": 10},
]
"""The classes of examples/smollm2.yaml."""


def derived(**policy: object) -> Thresholds:
    return derive_thresholds(Policy.model_validate(policy), smollm2_profile(), derived_at=NOW)


def test_the_formula_with_numbers() -> None:
    # 4 slots, μ = 0.25/s: a 7.8 s wait frees ⌊1.95⌋ = 1 slot, an 8 s wait exactly 2.
    assert deferral_l_max(4, 0.25, 7.8) == 5
    assert deferral_l_max(4, 0.25, 8.0) == 6
    assert deferral_l_max(3, 0.25, 0.0) == 3
    # W = SLO − T_prefill(n_ref), never negative, capped by the policy's max wait.
    assert deferral_wait_s(10.0, 2.2, None) == pytest.approx(7.8)
    assert deferral_wait_s(1.0, 2.2, None) == 0.0
    assert deferral_wait_s(10.0, 2.2, 1.5) == 1.5


def test_each_class_gets_its_own_wait_and_l_max() -> None:
    t = derived(concurrency={"max": 4}, classes=EXAMPLE_CLASSES)
    reference_prefill = prefill_curve(smollm2_profile()).seconds(t.reference_prompt_tokens)
    interactive, batch = t.classes
    assert interactive.deferral_wait_seconds == pytest.approx(max(1.0 - reference_prefill, 0.0))
    assert batch.deferral_wait_seconds == pytest.approx(10.0 - reference_prefill)
    assert batch.concurrency_cap == 3  # one slot reserved above
    assert batch.l_max == 3 + math.floor(t.throughput_rps * (10.0 - reference_prefill))
    assert batch.l_max > batch.concurrency_cap
    assert t.l_max == max(interactive.l_max, batch.l_max)


def test_a_batch_request_that_finds_its_slots_busy_waits() -> None:
    """The issue's burst: slots busy, a 10 s SLO. It was refused with queue_full at once."""
    config = GateConfig.from_thresholds(derived(concurrency={"max": 4}, classes=EXAMPLE_CLASSES))
    busy = LiveState(streams=3)
    d = decide(config, Request(100, 64, "batch"), busy, now=50.0)
    assert d.outcome is Outcome.DEFER
    assert d.reasons == (Reason.CONCURRENCY,)  # no `decode`: no per-token SLO is set
    assert d.max_wait_s == pytest.approx(10.0 - d.predicted_ttft_s)


def test_max_wait_zero_turns_deferral_off() -> None:
    t = derived(concurrency={"max": 4}, classes=EXAMPLE_CLASSES, deferral={"maxWaitSeconds": 0})
    assert all(c.l_max == c.concurrency_cap for c in t.classes)
    d = decide(GateConfig.from_thresholds(t), Request(100, 64, "batch"), LiveState(streams=3), now=0)
    assert (d.outcome, d.reasons) == (Outcome.REJECT, (Reason.CONCURRENCY,))


def test_decode_is_a_reason_only_under_a_per_token_slo() -> None:
    without = GateConfig.from_thresholds(derived(slo={"ttftSeconds": 5.0}, concurrency={"max": 2}))
    d = decide(without, Request(50, 16), LiveState(streams=4), now=0)
    assert Reason.DECODE not in d.reasons
    with_tpot = GateConfig.from_thresholds(
        derived(slo={"ttftSeconds": 5.0, "timePerOutputTokenSeconds": 0.5}, concurrency={"max": 2})
    )
    d = decide(with_tpot, Request(50, 16), LiveState(streams=4), now=0)
    assert Reason.DECODE in d.reasons


def test_a_lower_class_that_waited_past_its_budget_is_still_admitted_within_its_slo() -> None:
    """Its admit-now budget (1 s, from the class above) bounds how deep a queue it enters,
    not how long it may have waited: 3 s deferred of a 10 s SLO, an empty queue: admit."""
    config = GateConfig.from_thresholds(derived(concurrency={"max": 4}, classes=EXAMPLE_CLASSES))
    d = decide(config, Request(100, 64, "batch", waited_s=3.0), LiveState(), now=0)
    assert d.outcome is Outcome.ADMIT
    assert d.predicted_ttft_s == pytest.approx(3.0 + config.prefill.seconds(100))
    # The queue depth still holds it to the class above's budget.
    deep = LiveState(queued_prefill_tokens=1.5 * config.prefill_tokens_per_s)
    assert decide(config, Request(100, 64, "batch", waited_s=3.0), deep, now=0).reasons == (Reason.TTFT,)
