"""examples/routing/: every YAML parses, built-in kinds validate strictly, and each file says
what the sidecar and the operator actually do: the series the engine config names are the
ones the sidecar exports, the pool targets the gate's port, the retries are on a refusal and
on another pod.

Kinds with no schema here are checked field by field against their sources, read by hand:
InferencePool against kubernetes-sigs/gateway-api-inference-extension
config/crd/bases/inference.networking.k8s.io_inferencepools.yaml (commit 84436a96b9e6), the
EndpointPickerConfig against llm-d/llm-d-router (commit ebab687927f5), Envoy against its
RetryPolicy and RetryBudget protos, the ingress-nginx annotation against the controller's own
validation pattern (kubernetes/ingress-nginx, commit dbb11b92ddb7).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from project_files import ROOT
from slogate_bench.live.balancer import Balancing, balancer_config
from slogate_operator import names
from slogate_operator.builders import policy_label_value
from slogate_operator.spec import SidecarSpec
from slogate_sidecar.routing_signals import ADMIT_HEADROOM, KV_USAGE, QUEUE_WAIT, ROUTING_SIGNALS, RUNNING, WAITING
from slogate_sidecar.settings import SidecarSettings

EXAMPLES = ROOT / "examples" / "routing"
K8S = "1.33.0"
ENGINE = "llamacpp-slogate"
STALE_AFTER_MS = 200
"""llm-d-router's utilization detector: metrics older than this count as saturated."""


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def only(name: str, kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents(name) if d.get("kind") == kind]
    return found


def default_of(cls: type[Any], field: str) -> Any:
    return {f.name: f.default for f in dataclasses.fields(cls)}[field]


CLIENT_PORT = default_of(SidecarSettings, "port")
ADMIN_PORT = default_of(SidecarSettings, "admin_port")


def smollm2() -> dict[str, dict[str, Any]]:
    """examples/smollm2.yaml's objects by kind: the Deployment and Service the routing examples front."""
    objects = [d for d in yaml.safe_load_all((ROOT / "examples" / "smollm2.yaml").read_text()) if d]
    return {d["kind"]: d for d in objects}


def test_every_example_parses_and_the_set_is_complete() -> None:
    files = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert files == [
        "endpoint-picker-config.yaml",
        "envoy-gateway.yaml",
        "envoy-retry.yaml",
        "inferencepool.yaml",
        "ingress-nginx.yaml",
    ]
    for name in files:
        assert documents(name), name


def test_built_in_kinds_validate_strictly() -> None:
    ingress = only("ingress-nginx.yaml", "Ingress")
    try:
        kubernetes_validate.validate(ingress, K8S, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"Ingress: {error.message} at {list(error.path)}")
    # Strict validation can refuse: an unknown field is an error.
    broken = {**ingress, "spec": {**ingress["spec"], "retries": 3}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S, strict=True)


# ---------------------------------------------------------------- the pool


def test_the_pool_targets_the_gates_client_port_on_gated_pods_only() -> None:
    pool = only("inferencepool.yaml", "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert SidecarSpec().port == CLIENT_PORT  # the sidecar's default and the operator's agree
    assert pool["spec"]["targetPorts"] == [{"number": CLIENT_PORT}]
    labels = pool["spec"]["selector"]["matchLabels"]
    # The label the operator puts on the pods it injected the gate into ...
    assert labels[names.LABEL_POLICY] == policy_label_value("smollm2")
    # ... and the Deployment's own pod label.
    template = smollm2()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k != names.LABEL_POLICY}.items() <= template.items()


def test_the_pool_has_the_fields_of_the_crd() -> None:
    """The InferencePool v1 schema, as read: spec requires selector and targetPorts; at most 8
    unique port numbers 1..65535; selector is matchLabels only (1..64 labels); endpointPickerRef
    needs a name, a port when its kind is Service (the default), failureMode FailOpen|FailClose."""
    pool = only("inferencepool.yaml", "InferencePool")
    assert set(pool) == {"apiVersion", "kind", "metadata", "spec"}
    spec = pool["spec"]
    assert {"selector", "targetPorts"} <= set(spec) <= {"selector", "targetPorts", "endpointPickerRef", "appProtocol"}
    ports = [p["number"] for p in spec["targetPorts"]]
    assert 1 <= len(ports) <= 8
    assert len(set(ports)) == len(ports)
    assert all(isinstance(p, int) and 1 <= p <= 65535 for p in ports)
    assert all(set(p) == {"number"} for p in spec["targetPorts"])
    assert set(spec["selector"]) == {"matchLabels"}
    assert 1 <= len(spec["selector"]["matchLabels"]) <= 64
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
    assert ref["name"]
    assert ref.get("kind", "Service") != "Service" or set(ref["port"]) == {"number"}
    assert ref["failureMode"] in {"FailOpen", "FailClose"}


# ---------------------------------------------------------------- the picker


ENGINE_FIELDS = {
    "name",
    "queuedRequestsSpec",
    "runningRequestsSpec",
    "kvUsageSpec",
    "loraSpec",
    "cacheInfoSpec",
    "cacheBlockSizeLabelName",
    "cacheNumBlocksLabelName",
    "cacheBlockSizeSpec",
    "cacheNumBlocksSpec",
    "customMetrics",
}
"""engineConfigParams' JSON fields (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go)."""
PICKER_CONFIG_FIELDS = {
    "apiVersion",
    "kind",
    "featureGates",
    "plugins",
    "schedulingProfiles",
    "dataLayer",
    "flowControl",
    "requestHandler",
    "saturationDetector",
    "parser",
}
"""EndpointPickerConfig's JSON fields (apix/config/v1alpha1/endpointpickerconfig_types.go)."""
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
"""Prometheus's legacy metric-name rule, which the extractor applies to every spec."""


def picker() -> dict[str, Any]:
    (config,) = documents("endpoint-picker-config.yaml")
    return config


def plugin(config: dict[str, Any], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [p for p in config["plugins"] if p["type"] == kind and (name is None or p.get("name") == name)]
    return found


def test_the_engine_config_names_exactly_the_series_the_sidecar_exports() -> None:
    config = picker()
    (engine,) = plugin(config, "core-metrics-extractor")["parameters"]["engineConfigs"]
    assert engine["name"] == ENGINE
    assert set(engine) <= ENGINE_FIELDS
    assert engine["queuedRequestsSpec"] == WAITING
    assert engine["runningRequestsSpec"] == RUNNING
    assert engine["kvUsageSpec"] == KV_USAGE
    assert engine["loraSpec"] == ""
    custom = {c["attributeKey"]: c["metricSpec"] for c in engine["customMetrics"]}
    assert len(custom) == len(engine["customMetrics"])  # attribute keys are unique
    assert all(set(c) == {"attributeKey", "metricSpec"} for c in engine["customMetrics"])
    assert sorted(custom.values()) == sorted([QUEUE_WAIT, ADMIT_HEADROOM])
    assert all("/" not in key for key in custom)  # a "/" would need the scorer's producer set
    named = [engine[k] for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")] + list(custom.values())
    assert sorted(named) == sorted(ROUTING_SIGNALS)
    assert all(METRIC_NAME.match(n) for n in named)  # bare names: the sidecar's series carry no labels


def test_the_picker_scrapes_the_admin_port_fast_enough_and_wires_what_it_names() -> None:
    config = picker()
    assert set(config) <= PICKER_CONFIG_FIELDS
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    source = plugin(config, "metrics-data-source")["parameters"]
    assert source["port"] == ADMIN_PORT == SidecarSpec().admin_port
    assert source["path"] == "/metrics"
    interval = re.fullmatch(r"(\d+)ms", source["interval"])
    assert interval is not None
    assert int(interval.group(1)) < STALE_AFTER_MS
    # Every reference is to a declared plugin (a plugin's name defaults to its type).
    declared = {p.get("name", p["type"]) for p in config["plugins"]}
    (layer,) = config["dataLayer"]["sources"]
    assert layer["pluginRef"] == "metrics-data-source"  # by type: no default source injected beside it
    assert [e["pluginRef"] for e in layer["extractors"]] == ["core-metrics-extractor"]
    (profile,) = config["schedulingProfiles"]
    assert {p["pluginRef"] for p in profile["plugins"]} <= declared
    # The scorers read the custom attributes the extractor writes, the right way round.
    engine = plugin(config, "core-metrics-extractor")["parameters"]["engineConfigs"][0]
    attribute_of = {c["metricSpec"]: c["attributeKey"] for c in engine["customMetrics"]}
    headroom = plugin(config, "endpoint-attribute-scorer", "admit-headroom")["parameters"]
    assert headroom["attributeKey"] == attribute_of[ADMIT_HEADROOM]
    assert headroom["algorithm"]["type"] == "linear_higher_is_better"
    wait = plugin(config, "endpoint-attribute-scorer", "queue-wait")["parameters"]
    assert wait["attributeKey"] == attribute_of[QUEUE_WAIT]
    assert wait["algorithm"]["type"] == "linear_lower_is_better"
    assert set(wait["algorithm"]["normalization"]) == {"fixedRange"}  # +Inf (no thresholds) clamps
    # Fallback pods for a gateway that retries a refusal down the picker's list.
    assert plugin(config, "max-score-picker")["parameters"]["maxNumOfEndpoints"] >= 2


# ---------------------------------------------------------------- retries


def test_envoy_retries_a_refusal_on_another_pod_within_a_budget() -> None:
    (bootstrap,) = documents("envoy-retry.yaml")
    (listener,) = bootstrap["static_resources"]["listeners"]
    (manager,) = listener["filter_chains"][0]["filters"]
    (host,) = manager["typed_config"]["route_config"]["virtual_hosts"]
    (route,) = host["routes"]
    policy = route["route"]["retry_policy"]
    triggers = set(policy["retry_on"].split(","))
    assert "retriable-status-codes" in triggers
    assert not triggers & {"5xx", "reset", "gateway-error"}  # these can follow an admitted request
    assert 429 in policy["retriable_status_codes"]
    assert set(policy["retriable_status_codes"]) <= {429, 503}
    (predicate,) = policy["retry_host_predicate"]
    assert predicate["name"] == "envoy.retry_host_predicates.previous_hosts"
    assert predicate["typed_config"]["@type"].endswith(
        "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
    )
    assert policy["host_selection_retry_max_attempts"] > policy["num_retries"] >= 1
    assert route["route"]["timeout"] == "0s"
    (cluster,) = bootstrap["static_resources"]["clusters"]
    assert cluster["name"] == route["route"]["cluster"]
    (budget,) = [t["retry_budget"] for t in cluster["circuit_breakers"]["thresholds"]]
    assert 0 < budget["budget_percent"]["value"] <= 100
    ports = {
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for group in cluster["load_assignment"]["endpoints"]
        for e in group["lb_endpoints"]
    }
    assert ports == {CLIENT_PORT}


def test_envoy_gateway_retries_a_refusal() -> None:
    policy = only("envoy-gateway.yaml", "BackendTrafficPolicy")
    route = only("envoy-gateway.yaml", "HTTPRoute")
    assert policy["apiVersion"] == "gateway.envoyproxy.io/v1alpha1"
    assert policy["spec"]["targetRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route["metadata"]["name"]}
    ]
    retry = policy["spec"]["retry"]
    assert "retriable-status-codes" in retry["retryOn"]["triggers"]
    assert 429 in retry["retryOn"]["httpStatusCodes"]
    assert not set(retry["retryOn"]["triggers"]) & {"5xx", "reset", "gateway-error"}
    assert policy["spec"]["loadBalancer"]["type"] in {"ConsistentHash", "LeastRequest", "Random", "RoundRobin"}
    assert_the_service_of_smollm2(route["spec"]["rules"][0]["backendRefs"][0])


INGRESS_NGINX_NEXT_UPSTREAM = re.compile(
    r"^((error|timeout|invalid_header|http_500|http_502|http_503|http_504|http_403|http_404|http_429|non_idempotent|off)\s?)+$"
)
"""ingress-nginx's own check of the proxy-next-upstream annotation (validUpstreamAnnotation)."""


def test_ingress_nginx_retries_a_refusal_like_the_benchmarks_nginx() -> None:
    ingress = only("ingress-nginx.yaml", "Ingress")
    annotations = ingress["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    next_upstream = annotations[prefix + "proxy-next-upstream"]
    assert INGRESS_NGINX_NEXT_UPSTREAM.match(next_upstream)
    assert set(next_upstream.split()) == {"error", "http_429", "http_503", "non_idempotent"}
    assert int(annotations[prefix + "proxy-next-upstream-tries"]) >= 2
    assert annotations[prefix + "proxy-request-buffering"] == "on"  # a body nginx holds can be resent
    assert annotations[prefix + "proxy-buffering"] == "off"  # tokens as they come
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert_the_service_of_smollm2({"name": backend["name"], "port": backend["port"]["number"]})


def assert_the_service_of_smollm2(ref: dict[str, Any]) -> None:
    """The example Service, on the port that targets the port named http (the gate's, once injected)."""
    service = smollm2()["Service"]
    assert ref["name"] == service["metadata"]["name"]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]]
    assert port["targetPort"] == "http"


# ---------------------------------------------------------------- the docs


@pytest.mark.parametrize("doc", ["routing.md", "metrics.md"])
def test_the_docs_name_every_signal(doc: str) -> None:
    text = (ROOT / "docs" / doc).read_text()
    for name in ROUTING_SIGNALS:
        assert f"`{name}`" in text, (doc, name)


def test_the_routing_doc_names_every_example() -> None:
    text = (ROOT / "docs" / "routing.md").read_text()
    for example in EXAMPLES.glob("*.yaml"):
        assert f"examples/routing/{example.name}" in text, example.name


def test_the_balancer_directives_quoted_in_the_doc_are_the_benchmarks() -> None:
    """docs/routing.md quotes the fleet nginx's retry lines: they must be what it writes."""
    config = balancer_config(8000, Path("/tmp/x"), ["127.0.0.1:1"], Balancing(routing="least_conn", tries=3))
    text = (ROOT / "docs" / "routing.md").read_text()
    for directive in (
        "proxy_next_upstream error http_429 http_503 non_idempotent;",
        "proxy_next_upstream_tries 3;",
        "max_fails=0",
        "least_conn;",
    ):
        assert directive in config, directive
        assert directive in text, directive
