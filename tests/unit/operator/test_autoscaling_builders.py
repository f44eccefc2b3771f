"""The autoscalers a policy owns, built pure (slogate_operator.autoscaling): a ScaledObject
valid against KEDA's own CRD, an HPA valid for Kubernetes, both asking the lead's demand
query at the policy's target, named deterministically, owned by the policy; and
``spec.autoscaling`` as the models read it."""

from __future__ import annotations

import math
from typing import Any

import kubernetes_validate
import pytest
import yaml

from keda_reference import keda_errors
from project_files import ROOT
from slogate_operator import names
from slogate_operator.autoscaling import (
    EXTERNAL_METRIC,
    AutoscalerRequest,
    autoscaler,
    contains,
    horizontal_pod_autoscaler,
    hpa_name,
    quantity,
    scale_up_window_s,
    scaled_object,
)
from slogate_operator.builders import PolicyRef
from slogate_operator.demand_query import demand_query
from slogate_operator.spec import AutoscalingSpec, SpecError, parse_spec

K8S = "1.33.0"
POLICY = PolicyRef(name="smollm2", namespace="llm", uid="6f1c1a52-0000-4000-8000-000000000001")
URL = "http://prometheus-operated.monitoring.svc:9090"


def parse_quantity(text: str) -> float:
    """A decimal-suffixed Kubernetes quantity (the only suffixes the builders write)."""
    scale = {"m": 1e-3, "u": 1e-6}.get(text[-1])
    return float(text[:-1]) * scale if scale else float(text)


def request(deployment: str = "smollm2", startup_s: float | None = None, **spec: Any) -> AutoscalerRequest:
    parsed = AutoscalingSpec.model_validate({"enabled": True, "maxReplicas": 6} | spec)
    return AutoscalerRequest(POLICY, deployment, parsed, URL, startup_s)


def up_window(built: dict[str, Any]) -> int:
    spec = built["spec"]
    behavior = spec["behavior"] if "behavior" in spec else spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    return int(behavior["scaleUp"]["stabilizationWindowSeconds"])


@pytest.mark.parametrize("engine", ["keda", "hpa"])
def test_unset_the_scale_up_window_is_the_pods_start_up_plus_the_rate_window_plus_a_poll(engine: str) -> None:
    """A burst shorter than a pod's start-up reads above the baseline for its length plus the
    rate window; the window outlasts that by one recommendation, so the burst buys no pod."""
    assert up_window(autoscaler(request(engine=engine, startup_s=30.0))) == 30 + 60 + 15
    assert up_window(autoscaler(request(engine=engine, startup_s=30.2))) == 106  # whole seconds, up
    assert up_window(autoscaler(request(engine=engine))) == 60 + 15  # not measured yet
    # The adapter's rule has a fixed 60 s window and the controller manager polls every 15 s:
    # the KEDA fields move only KEDA's window.
    tuned = autoscaler(request(engine=engine, startup_s=30.0, metricWindowSeconds=120, pollingIntervalSeconds=30))
    assert up_window(tuned) == (30 + 120 + 30 if engine == "keda" else 30 + 60 + 15)
    assert up_window(autoscaler(request(engine=engine, startup_s=3590.0))) == 3600  # the HPA's bound


@pytest.mark.parametrize("window", [0, 45, 3600])
def test_a_scale_up_window_set_in_the_spec_is_the_one_in_force(window: int) -> None:
    built = autoscaler(request(startup_s=30.0, scaleUpStabilizationSeconds=window))
    assert up_window(built) == window
    assert scale_up_window_s(AutoscalingSpec(scale_up_stabilization_seconds=window), 30.0) == window


def test_the_scaled_object_is_valid_against_kedas_own_crd() -> None:
    for variant in ({}, {"minReplicas": 2, "maxReplicas": 2, "targetUtilization": 1},
                    {"scaleUpStabilizationSeconds": 3600, "pollingIntervalSeconds": 1, "targetUtilization": 0.05}):  # fmt: skip
        built = scaled_object(request(**variant))
        assert keda_errors(built) == [], variant


def test_kedas_crd_refuses_what_it_should_so_the_check_can_fail() -> None:
    built = scaled_object(request())
    built["spec"]["minReplicaCount"], built["spec"]["maxReplicaCount"] = 5, 2  # its CEL rule
    assert keda_errors(built)
    built = scaled_object(request())
    del built["spec"]["triggers"][0]["type"]
    assert keda_errors(built)


def test_the_scaled_object_asks_the_demand_query_at_the_target_per_pod() -> None:
    built = scaled_object(request(targetUtilization=0.7, metricWindowSeconds=120))
    spec = built["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "smollm2"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (1, 6, 15)
    (trigger,) = spec["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    meta = trigger["metadata"]
    assert meta == {
        "serverAddress": URL,
        "query": demand_query("llm", "smollm2", 120),
        "threshold": "0.7",
        "ignoreNullValues": "true",
    }
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's trigger metadata is map[string]string
    # AverageValue: the HPA wants ceil(value / threshold) pods; two pods' worth at 0.7 is three.
    assert math.ceil(2.0 / float(meta["threshold"])) == 3
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    # Unset and no start-up measured yet: the rate window and the polling interval, 120 + 15.
    assert behavior == {
        "scaleUp": {"stabilizationWindowSeconds": 135},
        "scaleDown": {"stabilizationWindowSeconds": 300},
    }


def test_the_hpa_is_valid_for_kubernetes_and_targets_the_adapters_metric() -> None:
    built = horizontal_pod_autoscaler(request(engine="hpa", scaleDownStabilizationSeconds=60))
    try:
        kubernetes_validate.validate(built, K8S, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{error.message} at {list(error.path)}")
    spec = built["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 6)
    (metric,) = spec["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"] == {
        "name": EXTERNAL_METRIC,
        "selector": {"matchLabels": {"workload": "smollm2"}},
    }
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "700m"}
    assert spec["behavior"]["scaleDown"] == {"stabilizationWindowSeconds": 60}
    assert autoscaler(request(engine="hpa")) == horizontal_pod_autoscaler(request(engine="hpa"))
    assert autoscaler(request())["kind"] == "ScaledObject"


@pytest.mark.parametrize("engine", ["keda", "hpa"])
def test_each_autoscaler_is_the_policys_labelled_and_never_touches_replicas(engine: str) -> None:
    built = autoscaler(request(engine=engine))
    meta = built["metadata"]
    assert (meta["name"], meta["namespace"]) == ("smollm2-smollm2", "llm")
    assert meta["ownerReferences"] == [POLICY.owner_reference()]
    assert meta["ownerReferences"][0]["controller"] is True
    assert meta["labels"] == {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_POLICY: "smollm2",
                              names.LABEL_COMPONENT: "autoscaler"}  # fmt: skip
    assert meta["annotations"] == {names.ANNOTATION_TARGET: "smollm2"}
    assert "replicas" not in built["spec"]
    assert hpa_name(engine, meta["name"]) == ("keda-hpa-smollm2-smollm2" if engine == "keda" else "smollm2-smollm2")


@pytest.mark.parametrize(
    ("value", "text"), [(0.7, "700m"), (1, "1"), (0.5, "500m"), (0.05, "50m"), (0.1234, "123400u"), (0.0001, "100u")]
)
def test_targets_become_exact_kubernetes_quantities(value: float, text: str) -> None:
    assert quantity(value) == text
    assert parse_quantity(text) == pytest.approx(value)


def test_a_target_too_small_to_write_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        quantity(1e-9)


def test_names_are_deterministic_labels_and_long_pairs_do_not_collide() -> None:
    assert names.autoscaler_name("chat", "llama") == "chat-llama"
    long_a, long_b = "p" * 60, "p" * 59
    first, second = names.autoscaler_name(long_a, "x-d"), names.autoscaler_name(long_b, "px-d")
    assert first != second  # they join alike: the hash is of the pair
    dotted = names.autoscaler_name("team.chat", "llama")
    for name in (first, second, dotted, names.autoscaler_name("a" * 253, "b" * 253)):
        assert len(name) <= 63, name
        assert names._DNS_LABEL.fullmatch(name), name
    assert names.autoscaler_name("team.chat", "llama") == dotted
    assert len(hpa_name("keda", first)) <= 253


def test_contains_ignores_what_the_server_defaulted_and_sees_drift() -> None:
    wanted = {"a": 1, "b": {"c": [{"d": 2}]}}
    assert contains({"a": 1, "b": {"c": [{"d": 2, "e": 3}], "f": 4}}, wanted)
    assert not contains({"a": 1, "b": {"c": [{"d": 3}]}}, wanted)
    assert not contains({"a": 1, "b": {"c": [{"d": 2}, {"d": 2}]}}, wanted)
    assert not contains({"b": {"c": [{"d": 2}]}}, wanted)


# ------------------------------------------------------------------------------ the spec


def spec_with(autoscaling: dict[str, Any]) -> dict[str, Any]:
    return {"targetRef": {"name": "smollm2"}, "slo": {"ttftSeconds": 2}, "autoscaling": autoscaling}


def test_autoscaling_is_off_by_default_with_the_documented_defaults() -> None:
    off = parse_spec({"targetRef": {"name": "smollm2"}, "slo": {"ttftSeconds": 2}}).operator.autoscaling
    assert off == AutoscalingSpec()
    assert (off.enabled, off.engine, off.min_replicas, off.max_replicas, off.target_utilization) == (
        False, "keda", 1, None, 0.7,
    )  # fmt: skip
    assert (off.scale_up_stabilization_seconds, off.scale_down_stabilization_seconds) == (None, 300)
    assert (off.polling_interval_seconds, off.metric_window_seconds, off.prometheus.server_address) == (15, 60, None)


@pytest.mark.parametrize(
    ("autoscaling", "problem"),
    [
        ({"enabled": True}, "maxReplicas is required"),
        ({"enabled": True, "minReplicas": 3, "maxReplicas": 2}, "must be at least minReplicas"),
        ({"maxReplicas": 1, "minReplicas": 2}, "must be at least minReplicas"),
        ({"enabled": True, "maxReplicas": 2, "targetUtilization": 0}, "targetUtilization"),
        ({"enabled": True, "maxReplicas": 2, "targetUtilization": 1.5}, "targetUtilization"),
        ({"enabled": True, "maxReplicas": 2, "engine": "vpa"}, "engine"),
        ({"enabled": True, "maxReplicas": 2, "scaleDownStabilizationSeconds": 3601}, "scaleDownStabilizationSeconds"),
        ({"enabled": True, "maxReplicas": 2, "prometheus": {"serverAddress": "prometheus:9090"}}, "serverAddress"),
    ],
)
def test_invalid_autoscaling_is_refused_with_its_path(autoscaling: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError, match=problem):
        parse_spec(spec_with(autoscaling))


def test_disabled_autoscaling_needs_no_max() -> None:
    assert parse_spec(spec_with({"enabled": False, "minReplicas": 3})).operator.autoscaling.max_replicas is None


def test_the_examples_scaled_object_is_valid_for_keda_and_asks_what_it_says() -> None:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "policy-autoscaling.yaml").read_text()) if d]
    spec = parse_spec(doc["spec"]).operator.autoscaling
    assert spec.enabled
    assert spec.engine == "keda"
    built = scaled_object(AutoscalerRequest(POLICY, doc["spec"]["targetRef"]["name"], spec, URL))
    assert keda_errors(built) == []
    assert (built["spec"]["minReplicaCount"], built["spec"]["maxReplicaCount"]) == (2, 10)
