"""Pure builders of the autoscalers a policy owns: one KEDA ScaledObject or one HPA v2 per
target Deployment, from ``spec.autoscaling``. Plain dicts out; no I/O (the step that applies
them is autoscalers.py). Unit tests validate what they build against KEDA's own CRD schema
and with kubernetes-validate.

Both engines ask the same thing: ρ, the workload's offered demand in pods' worth of its own
capacity, each first try priced in server-seconds on its pod's calibration (``demand_query``),
held at ``targetUtilization`` per pod with an AverageValue target. The HPA then wants
ceil(ρ / targetUtilization) pods (the HPA's AverageValue rule for a metric not tied to pods:
usage over the target per pod), so 2 pods' worth of demand at 0.7 asks for 3. Neither ever
writes the Deployment's ``spec.replicas`` itself: the HPA controller does, through the scale
subresource.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slogate_admission.scale_up import lasting_demand_window_s
from slogate_operator import names
from slogate_operator.builders import PolicyRef, policy_labels
from slogate_operator.demand_query import DEFAULT_WINDOW_S, demand_query
from slogate_operator.selectors import labelled
from slogate_operator.spec import AutoscalingSpec

EXTERNAL_METRIC = "slogate_demand_pods"
"""The External metric prometheus-adapter serves (adapter_rule.py) and the HPA engine targets."""
WORKLOAD_LABEL = "workload"
"""The series label naming the Deployment (set by the chart's PodMonitor)."""
COMPONENT = "autoscaler"
KEDA_API_VERSION = "keda.sh/v1alpha1"
HPA_SYNC_PERIOD_S = 15
"""The controller manager's ``--horizontal-pod-autoscaler-sync-period`` default: how often
the HPA engine reads its metric (KEDA's HPA reads ``pollingIntervalSeconds``)."""
HPA_API_VERSION = "autoscaling/v2"


@dataclass(frozen=True, slots=True)
class AutoscalerRequest:
    """Everything one autoscaler needs."""

    policy: PolicyRef
    deployment: str
    """The target Deployment (in the policy's namespace)."""
    spec: AutoscalingSpec
    prometheus_url: str
    """The Prometheus KEDA queries: the policy's own serverAddress, else the operator's setting."""
    startup_s: float | None = None
    """The target pods' measured start-up, creation to Ready (``pod_startup``); None: not measured yet."""

    @property
    def name(self) -> str:
        return names.autoscaler_name(self.policy.name, self.deployment)


def kind_of(engine: str) -> str:
    """The kind of object an engine's autoscaler is."""
    return "ScaledObject" if engine == "keda" else "HorizontalPodAutoscaler"


def hpa_name(engine: str, name: str) -> str:
    """The HPA whose status tells desired and current replicas: KEDA's own for a ScaledObject."""
    return f"{names.KEDA_HPA_PREFIX}{name}" if engine == "keda" else name


def quantity(value: float) -> str:
    """A positive number as a Kubernetes quantity: 0.7 -> "700m", 1 -> "1", 0.1234 -> "123400u"."""
    micro = round(value * 1_000_000)
    if micro <= 0:
        raise ValueError(f"a target must be positive, got {value!r}")
    if micro % 1_000_000 == 0:
        return str(micro // 1_000_000)
    if micro % 1000 == 0:
        return f"{micro // 1000}m"
    return f"{micro}u"


def scale_up_window_s(spec: AutoscalingSpec, startup_s: float | None) -> int:
    """The spec's scale-up window, or the one derived from the pods' start-up (0 while not
    measured), the engine's rate window and its polling interval (``slogate_admission.scale_up``)."""
    if spec.scale_up_stabilization_seconds is not None:
        return spec.scale_up_stabilization_seconds
    keda = spec.engine == "keda"
    rate_window_s = spec.metric_window_seconds if keda else DEFAULT_WINDOW_S  # the adapter's rule is fixed
    interval_s = spec.polling_interval_seconds if keda else HPA_SYNC_PERIOD_S
    return lasting_demand_window_s(startup_s or 0.0, rate_window_s, interval_s)


def behavior(spec: AutoscalingSpec, up_window_s: int) -> dict[str, Any]:
    """The HPA's stabilization windows (both engines: KEDA passes it to its HPA)."""
    return {
        "scaleUp": {"stabilizationWindowSeconds": up_window_s},
        "scaleDown": {"stabilizationWindowSeconds": spec.scale_down_stabilization_seconds},
    }


def metadata(request: AutoscalerRequest) -> dict[str, Any]:
    policy = request.policy
    return {
        "name": request.name,
        "namespace": policy.namespace,
        "labels": policy_labels(policy.name) | {names.LABEL_COMPONENT: COMPONENT},
        "annotations": {names.ANNOTATION_TARGET: request.deployment},
        "ownerReferences": [policy.owner_reference()],
    }


def scale_target(deployment: str) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment}


def scaled_object(request: AutoscalerRequest) -> dict[str, Any]:
    """The KEDA ScaledObject: a Prometheus trigger on the demand query, AverageValue target."""
    spec = request.spec
    assert spec.max_replicas is not None, "an enabled autoscaling spec has maxReplicas (validated)"
    trigger = {
        "type": "prometheus",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": request.prometheus_url,
            "query": demand_query(request.policy.namespace, request.deployment, spec.metric_window_seconds),
            # KEDA parses it as a float: the demand per pod, in pods' worth, to hold.
            "threshold": f"{spec.target_utilization:g}",
            # A Prometheus that answers no sample is read as 0, not as a failed scaler
            # (the query's `or vector(0)` already makes that rare).
            "ignoreNullValues": "true",
        },
    }
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": metadata(request),
        "spec": {
            "scaleTargetRef": scale_target(request.deployment),
            "minReplicaCount": spec.min_replicas,
            "maxReplicaCount": spec.max_replicas,
            "pollingInterval": spec.polling_interval_seconds,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": behavior(spec, scale_up_window_s(spec, request.startup_s))
                }
            },
            "triggers": [trigger],
        },
    }


def horizontal_pod_autoscaler(request: AutoscalerRequest) -> dict[str, Any]:
    """The HPA v2 on the External metric prometheus-adapter serves from the chart's rule."""
    spec = request.spec
    assert spec.max_replicas is not None, "an enabled autoscaling spec has maxReplicas (validated)"
    metric = {
        "type": "External",
        "external": {
            "metric": {"name": EXTERNAL_METRIC, "selector": labelled(WORKLOAD_LABEL, request.deployment).to_api()},
            "target": {"type": "AverageValue", "averageValue": quantity(spec.target_utilization)},
        },
    }
    return {
        "apiVersion": HPA_API_VERSION,
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(request),
        "spec": {
            "scaleTargetRef": scale_target(request.deployment),
            "minReplicas": spec.min_replicas,
            "maxReplicas": spec.max_replicas,
            "metrics": [metric],
            "behavior": behavior(spec, scale_up_window_s(spec, request.startup_s)),
        },
    }


def autoscaler(request: AutoscalerRequest) -> dict[str, Any]:
    """The object of the spec's engine."""
    return scaled_object(request) if request.spec.engine == "keda" else horizontal_pod_autoscaler(request)


def contains(actual: object, wanted: object) -> bool:
    """Whether ``actual`` holds everything of ``wanted`` (what the API server or a webhook
    defaulted in beside it does not count as a difference, so a pass patches only real drift)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(k in actual and contains(actual[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return actual == wanted
