"""The operator's Prometheus metrics, on a registry of its own (served on SLOGATE_OPERATOR_METRICS_PORT).

Per policy (labels ``namespace``, ``policy``): its conditions, how many sidecars have
its thresholds, when it was last calibrated, and the shedding ratios its alert rules
compare against (``spec.alerting``), so one rule serves every policy.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from slogate_operator.status import ConditionType

REGISTRY = CollectorRegistry(auto_describe=True)
POLICY = ("namespace", "policy")

reconciles = Counter(
    "slogate_operator_reconciles", "Reconcile passes, by result (ok, error).", [*POLICY, "result"], registry=REGISTRY
)
calibrations = Counter(
    "slogate_operator_calibrations",
    "Calibration Jobs by outcome: started, succeeded, failed, timed_out, invalid_result, rejected.",
    [*POLICY, "outcome"],
    registry=REGISTRY,
)
condition = Gauge(
    "slogate_operator_policy_condition",
    "1 when the policy's condition of this type is True, else 0.",
    [*POLICY, "type"],
    registry=REGISTRY,
)
sidecars = Gauge(
    "slogate_operator_sidecars",
    "Running sidecars of the policy's targets (state=targeted) and those serving its thresholds (acknowledged).",
    [*POLICY, "state"],
    registry=REGISTRY,
)
calibrated_at = Gauge(
    "slogate_operator_calibration_timestamp_seconds",
    "When the calibration in force was measured (Unix time).",
    POLICY,
    registry=REGISTRY,
)
rejection_ratio = Gauge(
    "slogate_operator_alerting_rejection_ratio",
    "spec.alerting of the policy: the shedding ratio that warns (severity=warning) or pages (critical).",
    [*POLICY, "severity"],
    registry=REGISTRY,
)
ALL = (reconciles, calibrations, condition, sidecars, calibrated_at, rejection_ratio)


def forget(namespace: str, policy: str) -> None:
    """Drop a deleted policy's series."""
    for metric in ALL:
        for labels in list(metric._metrics):  # prometheus_client keeps children by label tuple
            if labels[:2] == (namespace, policy):
                metric.remove(*labels)


def condition_types() -> list[str]:
    return [c.value for c in ConditionType]
