"""What a reconcile pass decided and reports. Each step of a pass returns a ``Decision``; the
pass folds them (``fold``) into the status it writes, the conditions it judges (``judge``),
the events it posts and when it must run again; ``publish`` writes and posts them, ``export``
sets the policy's metrics. A step that raised becomes the Degraded reason
("failures are visible, never silent"), and an invalid spec is judged by the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from slogate_operator import autoscalers, builders, metrics
from slogate_operator.client import POLICIES, ApiError
from slogate_operator.context import Runtime
from slogate_operator.push import PushReport
from slogate_operator.spec import AdmissionPolicySpec
from slogate_operator.status import (
    Condition,
    ConditionType,
    DegradedError,
    condition_dicts,
    newly_true,
    ready_condition,
)
from slogate_operator.timestamps import parse_time

C = ConditionType
T = TypeVar("T")
Event = tuple[str, str, str]
"""(type, reason, message) of an Event about the policy."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What one step of a pass decided. Unset fields: the step has nothing to say there."""

    status: Mapping[str, Any] = field(default_factory=dict)
    """Status fields this step sets (None: the field goes)."""
    problems: tuple[str, ...] = ()
    """Targets the policy cannot gate: Invalid, TargetUnusable."""
    degraded: tuple[tuple[str, str], ...] = ()
    """(reason, message) of what went wrong: Degraded."""
    events: tuple[Event, ...] = ()
    calibrated: Condition | None = None
    wake_at: datetime | None = None
    """Run again no later than this."""
    rolling: tuple[str, ...] | None = None
    """Targets whose pods wait to roll onto the gate; a later gating's word replaces an earlier's."""
    ungated: tuple[str, ...] = ()
    """Targets whose pods serve without the gate (targets.ungated)."""
    report: PushReport | None = None
    autoscaling: tuple[Condition, ...] | None = None
    """AutoscalingReady as the autoscaling step judged it (empty: off); None: the step did not run."""
    spec_error: str | None = None
    """The spec is invalid: nothing else is decided, what is in force stays."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """A pass's decisions folded."""

    status: Mapping[str, Any]
    problems: tuple[str, ...]
    degraded: tuple[tuple[str, str], ...]
    events: tuple[Event, ...]
    calibrated: Condition | None
    wake_at: datetime | None
    ungated: tuple[str, ...]
    report: PushReport | None
    autoscaling: tuple[Condition, ...] | None
    spec_error: str | None


def fold(
    previous: Mapping[str, Any], generation: int, decided: Sequence[Decision], failure: tuple[str, str] | None = None
) -> Outcome:
    """The decisions in the order they were made; ``failure``: (reason, message) of a step that raised.

    A pass that failed, or met an invalid spec, did not get to every step: what it did not
    decide stays as the last pass saw it (the ``previous`` status under this pass's fields).
    """
    spec_error = next((d.spec_error for d in decided if d.spec_error is not None), None)
    status: dict[str, Any] = {}
    if failure is not None or spec_error is not None:
        status = {k: v for k, v in previous.items() if k not in ("conditions", "observedGeneration")}
    status["observedGeneration"] = generation
    rolling: tuple[str, ...] = ()
    for decision in decided:
        status.update(decision.status)
        rolling = decision.rolling if decision.rolling is not None else rolling
    wakes = [d.wake_at for d in decided if d.wake_at is not None]
    return Outcome(
        status=status,
        # A step run twice (the gating, once more after fresh thresholds) says the same again: once is enough.
        problems=_once(p for d in decided for p in d.problems),
        degraded=_once([*([failure] if failure else []), *(g for d in decided for g in d.degraded)]),
        events=_once(e for d in decided for e in d.events),
        calibrated=next((d.calibrated for d in reversed(decided) if d.calibrated is not None), None),
        wake_at=min(wakes) if wakes else None,
        ungated=(*rolling, *(u for d in decided for u in d.ungated)),
        report=next((d.report for d in reversed(decided) if d.report is not None), None),
        autoscaling=next((d.autoscaling for d in reversed(decided) if d.autoscaling is not None), None),
        spec_error=spec_error,
    )


def judge(outcome: Outcome, previous: Mapping[str, Any]) -> list[Condition]:
    """The conditions, Ready first (derived from the others, so it never contradicts them)."""
    if outcome.spec_error is not None:
        invalid = Condition(C.INVALID, True, "InvalidSpec", outcome.spec_error)
        held = "the spec is invalid: the thresholds in force are kept"
        kinds = (C.DEGRADED, C.CALIBRATED, C.THRESHOLDS_PUSHED, *autoscalers.kept(previous))
        judged = [invalid, *(Condition(kind, False, "InvalidSpec", held) for kind in kinds)]
        return [ready_condition(judged), *judged]
    invalid = (
        Condition(C.INVALID, True, "TargetUnusable", "; ".join(outcome.problems))
        if outcome.problems
        else Condition(C.INVALID, False, "Valid", "the spec passed every check")
    )
    degraded = (
        Condition(C.DEGRADED, True, outcome.degraded[0][0], "; ".join(m for _, m in outcome.degraded))
        if outcome.degraded
        else Condition(C.DEGRADED, False, "AsExpected", "")
    )
    calibrated = outcome.calibrated or Condition(C.CALIBRATED, False, "NotCalibrated", "no calibration yet")
    judged = [invalid, degraded, calibrated, _pushed(outcome)]
    autoscaling = outcome.autoscaling
    if autoscaling is None:  # the pass failed before that step: as the last pass saw it
        autoscaling = autoscalers.previous_conditions(previous)
    return [ready_condition(judged), *judged, *autoscaling]


def _pushed(outcome: Outcome) -> Condition:
    report = outcome.report
    if "thresholds" not in outcome.status:
        return Condition(C.THRESHOLDS_PUSHED, False, "NoThresholds", "no thresholds derived yet")
    if report is None:
        return Condition(C.THRESHOLDS_PUSHED, False, "NoTarget", "no target to push to")
    if outcome.ungated:
        return Condition(C.THRESHOLDS_PUSHED, False, "UngatedPods", "; ".join(outcome.ungated))
    if report.complete:
        calibration = outcome.status["thresholds"]["calibrationId"]
        text = f"{report.text} running sidecars serve calibration {calibration}"
        return Condition(C.THRESHOLDS_PUSHED, True, "AllAcknowledged", text)
    behind = "; ".join(f"{pod}: {why}" for pod, why in report.behind[:3])
    return Condition(C.THRESHOLDS_PUSHED, False, "PushPending", f"{report.text} acknowledged; {behind}")


def _once(items: Iterable[T]) -> tuple[T, ...]:
    found: list[T] = []
    for item in items:
        if item not in found:
            found.append(item)
    return tuple(found)


def failure_of(error: Exception) -> tuple[str, str]:
    """The Degraded reason and message of a step that raised."""
    if isinstance(error, DegradedError):
        return error.reason, str(error)
    if isinstance(error, ApiError):
        reason = {403: "Forbidden", 0: "ApiUnreachable"}.get(error.status, "ApiError")
        return reason, str(error)
    return "ReconcileError", f"{type(error).__name__}: {error}"


async def publish(
    rt: Runtime,
    policy: builders.PolicyRef,
    *,
    previous: Mapping[str, Any],
    status: Mapping[str, Any],
    judged: list[Condition],
    events: Sequence[Event],
) -> None:
    """Write the status if it changed; post events for new trouble and for what was done."""
    before = list(previous.get("conditions") or [])
    written = dict(status)
    written["conditions"] = condition_dicts(judged, before, now=rt.clock(), generation=status["observedGeneration"])
    written = {k: v for k, v in written.items() if v is not None}
    if written != previous:
        replace_status = [{"op": "add", "path": "/status", "value": written}]
        await rt.client.json_patch(POLICIES, policy.namespace, policy.name, replace_status, subresource="status")
    for condition in newly_true(judged, before):
        if condition.type in (C.DEGRADED, C.INVALID):
            await rt.post_event(policy, "Warning", condition.reason, condition.message)
    for kind, reason, message in events:
        await rt.post_event(policy, kind, reason, message)


def export(
    policy: builders.PolicyRef,
    spec: AdmissionPolicySpec,
    judged: list[Condition],
    report: PushReport | None,
    status: Mapping[str, Any],
) -> None:
    """The policy's operator metrics: conditions, sidecars, alerting ratios, calibration age."""
    labels = (policy.namespace, policy.name)
    for condition in judged:
        metrics.condition.labels(*labels, condition.type.value).set(1 if condition.status else 0)
    metrics.sidecars.labels(*labels, "targeted").set(report.targeted if report else 0)
    metrics.sidecars.labels(*labels, "acknowledged").set(len(report.acknowledged) if report else 0)
    alerting = spec.operator.alerting
    metrics.rejection_ratio.labels(*labels, "warning").set(alerting.rejection_ratio_warning)
    metrics.rejection_ratio.labels(*labels, "critical").set(alerting.rejection_ratio_critical)
    measured = parse_time((status.get("calibration") or {}).get("measuredAt"))
    if measured is not None:
        metrics.calibrated_at.labels(*labels).set(measured.timestamp())
