"""What a reconcile pass reports: the status it writes, the events it posts, the metrics it
exports, and the Degraded reason of a step that raised ("failures are visible, never silent")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slogate_operator import builders, metrics
from slogate_operator.client import POLICIES, ApiError
from slogate_operator.context import Runtime
from slogate_operator.push import PushReport
from slogate_operator.spec import AdmissionPolicySpec
from slogate_operator.status import Condition, ConditionType, DegradedError, condition_dicts, newly_true
from slogate_operator.timestamps import parse_time

C = ConditionType


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
    status: dict[str, Any],
    judged: list[Condition],
    events: list[tuple[str, str, str]],
) -> None:
    """Write the status if it changed; post events for new trouble and for what was done."""
    before = list(previous.get("conditions") or [])
    status["conditions"] = condition_dicts(judged, before, now=rt.clock(), generation=status["observedGeneration"])
    status = {k: v for k, v in status.items() if v is not None}
    if status != previous:
        replace_status = [{"op": "add", "path": "/status", "value": status}]
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
