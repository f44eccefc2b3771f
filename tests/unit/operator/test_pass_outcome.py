"""How a pass folds its steps' decisions (outcome.fold) and judges them (outcome.judge). Pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from slogate_operator.outcome import Decision, fold, judge
from slogate_operator.push import PushReport
from slogate_operator.status import Condition, ConditionType

C = ConditionType
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
PREVIOUS: dict[str, Any] = {
    "observedGeneration": 3,
    "thresholds": {"calibrationId": "cal-1"},
    "autoscaling": {"engine": "keda"},
    "notes": ["an old note"],
    "conditions": [{"type": "AutoscalingReady", "status": "True", "reason": "Scaling", "message": "1 -> 1"}],
}


def by_type(conditions: list[Condition]) -> dict[ConditionType, tuple[bool, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in conditions}


def test_the_earliest_wake_up_of_any_step_stands() -> None:
    """A calibration step with no backoff of its own does not cancel the gating's wait for its
    webhook entry (the pass used to take the calibration's word, None, and slept a resync)."""
    settle = NOW + timedelta(seconds=2)
    steps = [Decision(wake_at=settle), Decision(calibrated=Condition(C.CALIBRATED, False, "Calibrating"))]
    assert fold({}, 1, steps).wake_at == settle
    backoff = NOW + timedelta(seconds=1)
    assert fold({}, 1, [*steps, Decision(wake_at=backoff)]).wake_at == backoff
    assert fold({}, 1, [Decision(), Decision()]).wake_at is None


def test_an_invalid_spec_keeps_what_is_in_force_and_says_why_in_every_condition() -> None:
    folded = fold(PREVIOUS, 4, [Decision(spec_error="spec.slo: field required")])
    assert dict(folded.status) == {k: v for k, v in PREVIOUS.items() if k != "conditions"} | {"observedGeneration": 4}
    judged = judge(folded, PREVIOUS)
    assert [c.type for c in judged] == [C.READY, C.INVALID, C.DEGRADED, C.CALIBRATED, C.THRESHOLDS_PUSHED,
                                        C.AUTOSCALING_READY]  # fmt: skip
    held = (False, "InvalidSpec", "the spec is invalid: the thresholds in force are kept")
    assert by_type(judged) == {
        C.READY: (False, "InvalidSpec", "spec.slo: field required"),
        C.INVALID: (True, "InvalidSpec", "spec.slo: field required"),
        C.DEGRADED: held, C.CALIBRATED: held, C.THRESHOLDS_PUSHED: held, C.AUTOSCALING_READY: held,
    }  # fmt: skip
    never_scaled = {k: v for k, v in PREVIOUS.items() if k != "autoscaling"}
    invalid = fold(never_scaled, 4, [Decision(spec_error="spec.slo: field required")])
    assert C.AUTOSCALING_READY not in by_type(judge(invalid, never_scaled))


def test_a_failed_pass_keeps_what_it_did_not_get_to_and_says_the_failure_first() -> None:
    steps = [Decision(status={"target": "x", "notes": None}, degraded=(("TargetsDiffer", "a=1, b=2"),))]
    folded = fold(PREVIOUS, 3, steps, failure=("Forbidden", "403: no"))
    assert folded.status["target"] == "x"
    assert folded.status["thresholds"] == PREVIOUS["thresholds"]  # kept: the pass never got there
    assert folded.status["notes"] is None  # decided by this pass: the field goes
    assert "conditions" not in folded.status
    judged = by_type(judge(folded, PREVIOUS))
    assert judged[C.DEGRADED] == (True, "Forbidden", "403: no; a=1, b=2")
    assert judged[C.AUTOSCALING_READY] == (True, "Scaling", "1 -> 1")  # as the last pass saw it
    assert judged[C.THRESHOLDS_PUSHED][1] == "NoTarget"


def test_a_pass_that_did_not_fail_starts_its_status_afresh() -> None:
    folded = fold(PREVIOUS, 3, [Decision(status={"target": "x"}, autoscaling=())])
    assert dict(folded.status) == {"observedGeneration": 3, "target": "x"}
    judged = by_type(judge(folded, PREVIOUS))
    assert C.AUTOSCALING_READY not in judged  # the step ran and found autoscaling off
    assert judged[C.THRESHOLDS_PUSHED][1] == "NoThresholds"


def test_the_last_gatings_word_on_rolling_pods_replaces_the_first_and_ungated_pods_add_up() -> None:
    report = PushReport(targeted=2, acknowledged=("p1", "p2"), behind=())
    first = Decision(rolling=("Deployment a: its pods roll onto the gate once its webhook entry is read",),
                     events=(("Normal", "SidecarInjected", "a"),))  # fmt: skip
    again = Decision(rolling=(), events=(("Normal", "SidecarInjected", "a"),))
    pushed = Decision(status={"thresholds": {"calibrationId": "cal-2"}}, ungated=("Deployment b: 1 of 2",),
                      report=report)  # fmt: skip
    folded = fold({}, 1, [first, again, pushed])
    assert folded.ungated == ("Deployment b: 1 of 2",)
    assert folded.events == (("Normal", "SidecarInjected", "a"),)  # said once, though two gatings saw it
    assert by_type(judge(folded, {}))[C.THRESHOLDS_PUSHED] == (False, "UngatedPods", "Deployment b: 1 of 2")
    all_gated = Decision(status=pushed.status, report=report)
    served = by_type(judge(fold({}, 1, [first, again, all_gated]), {}))
    assert served[C.THRESHOLDS_PUSHED] == (True, "AllAcknowledged", "2/2 running sidecars serve calibration cal-2")
    assert served[C.READY][0] is False  # nothing calibrated yet
    still_rolling = by_type(judge(fold({}, 1, [first, pushed]), {}))[C.THRESHOLDS_PUSHED]
    assert still_rolling[1] == "UngatedPods"
    assert "roll onto the gate" in still_rolling[2]
