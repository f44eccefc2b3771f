"""The policy's status: conditions and the summaries of what is in force.

Conditions follow the Kubernetes convention (type, status, reason, message,
lastTransitionTime, observedGeneration); lastTransitionTime moves only when the status
flips. Ready is derived from the others so it can never contradict them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_operator.timestamps import format_time


class ConditionType(StrEnum):
    """The conditions a policy reports."""

    READY = "Ready"
    """Thresholds of a current calibration are in force and every running sidecar has them."""
    CALIBRATED = "Calibrated"
    """A calibration of the target's current llama.cpp container is in force."""
    THRESHOLDS_PUSHED = "ThresholdsPushed"
    """Every running sidecar acknowledged the thresholds in force."""
    DEGRADED = "Degraded"
    """Something failed; the last good thresholds stay in force (reason says what)."""
    INVALID = "Invalid"
    """The spec passed the schema but not the operator's checks; nothing is changed."""
    AUTOSCALING_READY = "AutoscalingReady"
    """With ``spec.autoscaling.enabled``: every target has its ScaledObject or HPA and that
    HPA reports replicas. Absent while autoscaling is off. Not part of Ready, which says the
    gate is in force: a cluster without KEDA still gates (autoscalers.py)."""


class DegradedError(RuntimeError):
    """A step cannot go on; ``reason`` becomes the Degraded condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Condition:
    """One condition as the reconcile pass judged it."""

    type: ConditionType
    status: bool
    reason: str
    message: str = ""


def ready_condition(conditions: Sequence[Condition]) -> Condition:
    """Ready iff valid, not degraded, calibrated and pushed; else the first reason why not.

    AutoscalingReady stays out: Ready is the gate's promise, which holds without autoscaling."""
    by_type = {c.type: c for c in conditions}
    for kind, bad_when in (
        (ConditionType.INVALID, True),
        (ConditionType.DEGRADED, True),
        (ConditionType.CALIBRATED, False),
        (ConditionType.THRESHOLDS_PUSHED, False),
    ):
        condition = by_type.get(kind)
        if condition is not None and condition.status == bad_when:
            return Condition(ConditionType.READY, False, condition.reason, condition.message)
    return Condition(ConditionType.READY, True, "Ready", "thresholds in force on every running sidecar")


def condition_dicts(
    judged: Iterable[Condition], previous: Sequence[Mapping[str, Any]], *, now: datetime, generation: int
) -> list[dict[str, Any]]:
    """Conditions for the status; a condition keeps its lastTransitionTime unless it flipped."""
    before = {str(c.get("type")): c for c in previous}
    stamp = format_time(now)
    result = []
    for condition in judged:
        text = "True" if condition.status else "False"
        old = before.get(condition.type.value)
        transition = old.get("lastTransitionTime", stamp) if old and old.get("status") == text else stamp
        result.append(
            {
                "type": condition.type.value,
                "status": text,
                "reason": condition.reason,
                "message": condition.message[:2048],
                "lastTransitionTime": transition,
                "observedGeneration": generation,
            }
        )
    return result


def newly_true(judged: Iterable[Condition], previous: Sequence[Mapping[str, Any]]) -> list[Condition]:
    """Conditions that are True now and were not, or changed reason or message (for events)."""
    before = {str(c.get("type")): c for c in previous}
    fresh = []
    for condition in judged:
        old = before.get(condition.type.value)
        if condition.status and (
            old is None
            or old.get("status") != "True"
            or old.get("reason") != condition.reason
            or old.get("message") != condition.message[:2048]
        ):
            fresh.append(condition)
    return fresh


def calibration_summary(profile: CalibrationProfile, container_fingerprint: str, job: str) -> dict[str, Any]:
    """The calibration in force: identity and the figures that explain the thresholds."""
    return {
        "id": profile.id,
        "fingerprint": profile.fingerprint,
        "containerFingerprint": container_fingerprint,
        "job": job,
        "measuredAt": format_time(profile.measured_at),
        "model": profile.model.name,
        "quantization": profile.model.quantization,
        "summary": f"{profile.model.name} {profile.model.quantization}",
        "slots": profile.server.slots,
        "ctxPerSlot": profile.server.ctx_per_slot,
        "prefillInterceptSeconds": profile.prefill.intercept_s,
        "prefillLinearSeconds": profile.prefill.linear_s,
        "decodeTokensPerSecond": [round(p.tokens_per_second, 3) for p in profile.decode],
        "durationSeconds": round(profile.duration_s, 1),
    }


def thresholds_summary(thresholds: Thresholds, configmap: str) -> dict[str, Any]:
    """The thresholds in force (the whole document is in the ConfigMap).

    ``defaultClassTtftSeconds`` and ``tokenBudget`` are the default class's, for the
    Default-TTFT and Token-Budget printer columns: the SLO and the budget derived from it.
    ``tenantOutputWeight`` only with a tenant policy: the output weight in force, which the
    user may leave to the calibration."""
    default = thresholds.default_class_thresholds
    tenants = {} if thresholds.tenants is None else {"tenantOutputWeight": round(thresholds.tenants.output_weight, 3)}
    return {
        "calibrationId": thresholds.calibration_id,
        "derivedAt": format_time(thresholds.derived_at),
        "configMap": configmap,
        "prefillTokensPerSecond": round(thresholds.prefill_tokens_per_second, 3),
        "concurrencyCap": thresholds.concurrency_cap,
        "wMaxSeconds": round(thresholds.w_max_seconds, 3),
        "throughputRps": round(thresholds.throughput_rps, 4),
        "kvCapacityTokens": thresholds.kv_capacity_tokens,
        "perRequestMaxTokens": thresholds.per_request_max_tokens,
        "defaultClass": thresholds.default_class,
        "defaultClassTtftSeconds": default.ttft_slo_seconds,
        "tokenBudget": int(default.token_budget),
        **tenants,
        "classes": [
            {
                "name": c.name,
                "ttftSloSeconds": c.ttft_slo_seconds,
                "ttftBudgetSeconds": c.ttft_budget_seconds,
                "tokenBudget": int(c.token_budget),
                "concurrencyCap": c.concurrency_cap,
            }
            for c in thresholds.classes
        ],
    }
