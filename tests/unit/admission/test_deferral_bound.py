"""Issue 12.7 and 28.2: deferral is alive by default, and each request's wait is bounded by
its own slack and the slot it would get, not by a queue length sized for a reference request."""

import math

import pytest

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Outcome, Reason, Request, decide
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds

EXAMPLE_CLASSES = [
    {"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1},
    {"name": "batch", "ttftSeconds": 10},
]
"""The classes of examples/smollm2.yaml."""


def derived(**policy: object) -> Thresholds:
    return derive_thresholds(Policy.model_validate(policy), smollm2_profile(), derived_at=NOW)


def test_the_deprecated_l_max_fields_carry_the_caps_for_earlier_sidecars() -> None:
    """An earlier sidecar refused an arrival that found lMax ahead of it: at the cap it
    refuses rather than defers while an upgrade rolls. The gate reads neither field."""
    t = derived(concurrency={"max": 4}, classes=EXAMPLE_CLASSES)
    assert [(c.l_max, c.deferral_wait_seconds) for c in t.classes] == [(4, 0.0), (3, 0.0)]
    assert t.l_max == 4
    wire = t.model_dump(by_alias=True)
    assert wire["lMax"] == 4
    assert [c["lMax"] for c in wire["classes"]] == [4, 3]
    ignored = t.model_copy(update={"classes": tuple(c.model_copy(update={"l_max": 99}) for c in t.classes)})
    state = LiveState(streams=3, slot_wait_s=math.inf)
    for thresholds in (t, ignored):
        d = decide(GateConfig.from_thresholds(thresholds), Request(100, 64, "batch"), state, now=0.0)
        assert (d.outcome, d.reasons) == (Outcome.REJECT, (Reason.CONCURRENCY, Reason.QUEUE_FULL))


def test_a_batch_request_that_finds_its_slots_busy_waits_for_the_slot_it_would_get() -> None:
    """The issue's burst: slots busy, a 10 s SLO. It was refused with queue_full at once."""
    config = GateConfig.from_thresholds(derived(concurrency={"max": 4}, classes=EXAMPLE_CLASSES))
    own = config.prefill.seconds(100)  # at the margin LiveState defaults to (1)
    busy = LiveState(streams=3, slot_wait_s=6.0)
    d = decide(config, Request(100, 64, "batch"), busy, now=50.0)
    assert d.outcome is Outcome.DEFER
    assert d.reasons == (Reason.CONCURRENCY,)  # no `decode`: no per-token SLO is set
    assert d.max_wait_s == pytest.approx(10.0 - own)
    # Its slot expected after its slack: refused now, not at its deadline.
    late = LiveState(streams=3, slot_wait_s=10.0 - own + 0.01)
    refused = decide(config, Request(100, 64, "batch"), late, now=50.0)
    assert (refused.outcome, refused.reasons) == (Outcome.REJECT, (Reason.CONCURRENCY, Reason.QUEUE_FULL))
    assert refused.retry_after_s is not None  # it fits an idle server: a 429, never the 400


def test_max_wait_zero_turns_deferral_off() -> None:
    t = derived(concurrency={"max": 4}, classes=EXAMPLE_CLASSES, deferral={"maxWaitSeconds": 0})
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
