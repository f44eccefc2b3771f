"""The NetworkPolicy the operator keeps on each policy's gated pods (fence.py), with the
admin peers the chart gives it: on by default; valid for Kubernetes; it selects the pods the
webhook really injects; their admin port admits this release's operator and Prometheus only;
the gate's client port (whatever its name) and the other ports the pods declare stay open to
everyone; llama-server's own port admits nobody.

Who may connect is decided by evaluating the policy as the API defines it (peers, selectors,
ports) against the pod the operator's own injection builds, not by comparing it with a copy.
The operator keeping it on a real API server: tests/envtest/test_operator_fence.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import helm_python
import kubernetes_validate
import pytest
from chart_tools import CHART, CI_VALUES, NAMESPACE, load_values, one, render

from manifests import admission_policy, llama_deployment
from slogate_operator import builders, fence, names, targets
from slogate_operator.injection import SidecarConfig, injected_template, removed_template
from slogate_operator.settings import ENV_PREFIX, OperatorSettings
from slogate_operator.spec import parse_spec

CI_FILE = CHART / "ci" / "network-policy-values.yaml"
KUBERNETES_VERSIONS = ("1.29.0", "1.32.0", "1.35.0")
SIDECAR = SidecarConfig(
    policy="smollm2", image="slogate:0.1.0", port=8081, admin_port=8082,
    upstream_port=8080, prompt_counting="tokenize", token_secret="slogate-admin-token", llama_container="llama",
)  # fmt: skip
POLICY = builders.PolicyRef(name="smollm2", namespace="llm", uid="0f1e2d3c-0000-4000-8000-000000000001")


@dataclass(frozen=True)
class Peer:
    """A pod that opens a connection: its namespace and its labels."""

    namespace: str
    labels: Mapping[str, str]

    @property
    def namespace_labels(self) -> dict[str, str]:
        # Set by the API server on every namespace since Kubernetes 1.21 (immutable).
        return {"kubernetes.io/metadata.name": self.namespace}


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: every matchLabels pair and every expression hold;
    an empty selector selects everything."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        holds = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not holds:
            return False
    return True


def peer_matches(rule_peer: Mapping[str, Any], peer: Peer, policy_namespace: str) -> bool:
    """networking.k8s.io/v1 NetworkPolicyPeer: podSelector alone means the policy's own
    namespace; namespaceSelector alone means every pod there; both must then hold."""
    if "ipBlock" in rule_peer:
        return True  # an IP range can hold any pod: count it as letting everyone in
    if "namespaceSelector" in rule_peer:
        in_namespace = selects(rule_peer["namespaceSelector"], peer.namespace_labels)
    else:
        in_namespace = peer.namespace == policy_namespace
    return in_namespace and selects(rule_peer.get("podSelector") or {}, peer.labels)


def port_matches(rule_port: Mapping[str, Any], container_port: Mapping[str, Any]) -> bool:
    """NetworkPolicyPort: a name matches the container port of that name (a port without
    one matches no name); a number, or a range up to endPort, matches by number."""
    if rule_port.get("protocol", "TCP") != container_port.get("protocol", "TCP"):
        return False
    if "port" not in rule_port:
        return True  # every port of that protocol
    wanted = rule_port["port"]
    if isinstance(wanted, str):
        return bool(wanted == container_port.get("name"))
    return bool(wanted <= container_port["containerPort"] <= rule_port.get("endPort", wanted))


def admits(policy: Mapping[str, Any], peer: Peer, container_port: Mapping[str, Any]) -> bool:
    """Whether this (ingress) policy lets ``peer`` reach ``container_port`` of a pod it selects."""
    namespace = policy["metadata"]["namespace"]
    for rule in policy["spec"].get("ingress") or ():
        peers = rule.get("from") or []
        ports = rule.get("ports") or []
        from_ok = not peers or any(peer_matches(p, peer, namespace) for p in peers)
        port_ok = not ports or any(port_matches(p, container_port) for p in ports)
        if from_ok and port_ok:
            return True
    return False


def operator_settings(values: dict[str, Any]) -> OperatorSettings:
    """The settings the operator the chart renders starts with (its SLOGATE_OPERATOR_* env)."""
    deployment = one(render(values), "Deployment", "-operator").obj
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith(ENV_PREFIX) and "value" in e}
    return OperatorSettings.from_env(env)


def fence_of(values: dict[str, Any], deployment: dict[str, Any] | None = None, **sidecar: int) -> dict[str, Any]:
    """The NetworkPolicy the operator rendered by ``values`` keeps for a policy of that Deployment."""
    spec = parse_spec(admission_policy(**({"sidecar": sidecar} if sidecar else {}))["spec"])
    scan = targets.scan(POLICY.name, spec, [deployment or llama_deployment()], None)
    assert scan.targets, scan.problems
    return fence.fence(POLICY, spec, scan.targets, operator_settings(values).peers())


@dataclass(frozen=True)
class GatedPod:
    """A llama.cpp pod shaped like examples/smollm2.yaml once the operator injected the gate."""

    template: dict[str, Any]
    config: SidecarConfig

    def _port(self, container: str, number: int) -> dict[str, Any]:
        (found,) = [c for c in self.template["spec"]["containers"] if c["name"] == container]
        (port,) = [p for p in found.get("ports") or () if p["containerPort"] == number]
        return dict(port)

    @property
    def gate(self) -> dict[str, Any]:
        """The sidecar's client port: where the Service's named targetPort leads while gated."""
        return self._port(names.SIDECAR_CONTAINER, self.config.port)

    @property
    def admin(self) -> dict[str, Any]:
        return self._port(names.SIDECAR_CONTAINER, self.config.admin_port)

    @property
    def llama(self) -> dict[str, Any]:
        """llama-server's own port: reaching it from outside the pod bypasses the gate."""
        return self._port("llama", self.config.upstream_port)


def gated_pod(llama_port_name: str | None = "http", config: SidecarConfig = SIDECAR) -> GatedPod:
    """The operator's injection of a Deployment whose llama.cpp port is named ``llama_port_name``
    (None: no name)."""
    template = copy.deepcopy(llama_deployment()["spec"]["template"])
    (port,) = template["spec"]["containers"][0]["ports"]
    assert port["containerPort"] == config.upstream_port
    if llama_port_name is None:
        del port["name"]
    else:
        port["name"] = llama_port_name
    return GatedPod(injected_template(template, config), config)


def operator_peer(values: dict[str, Any]) -> Peer:
    """A real operator pod: the rendered Deployment's pod labels, in the release namespace."""
    deployment = one(render(values), "Deployment", "-operator").obj
    return Peer(NAMESPACE, deployment["spec"]["template"]["metadata"]["labels"])


PROMETHEUS = Peer("monitoring", {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"})
ANYWHERE = Peer("anywhere", {})
STRANGERS = {
    "a pod beside the gated one": Peer("llm", {"app": "chat-frontend"}),
    "another pod of the release namespace": Peer(NAMESPACE, {"app.kubernetes.io/name": "something-else"}),
    "operator labels outside the release namespace": Peer(
        "llm",
        {"app.kubernetes.io/name": "slogate", "app.kubernetes.io/instance": "slogate",
         "app.kubernetes.io/component": "operator"},
    ),
    "prometheus labels outside the monitoring namespace": Peer("llm", {"app.kubernetes.io/name": "prometheus"}),
    "another pod of the monitoring namespace": Peer("monitoring", {"app.kubernetes.io/name": "grafana"}),
}  # fmt: skip


def everyone(values: dict[str, Any]) -> list[Peer]:
    """Strangers, Prometheus, the operator itself and a pod of any other namespace."""
    return [*STRANGERS.values(), PROMETHEUS, operator_peer(values), ANYWHERE]


# ------------------------------------------------------------------------------ on and off


@pytest.mark.parametrize("values_file", [None, *CI_VALUES], ids=lambda p: p.name if p else "default")
def test_on_by_default_and_the_chart_renders_none_itself(values_file: Any) -> None:
    values = load_values(values_file) if values_file else {}
    settings = operator_settings(values)
    assert settings.network_policy is values.get("networkPolicy", {}).get("enabled", True)
    assert [o for o in render(values) if o.kind == "NetworkPolicy"] == []  # the operator's, per policy
    assert CI_FILE in CI_VALUES  # the ci/ file with its own Prometheus peers is among those rendered


def test_off_on_request() -> None:
    assert operator_settings({}).network_policy is True
    assert operator_settings({"networkPolicy": {"enabled": False}}).network_policy is False


VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "ci file": load_values(CI_FILE),
    "without prometheus": {"networkPolicy": {"prometheus": {"enabled": False}}},
    "every pod of the monitoring namespace": {"networkPolicy": {"prometheus": {"podSelector": {"matchLabels": None}}}},
}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_network_policy_validates_strictly(variant: str, version: str) -> None:
    policy = fence_of(VARIANTS[variant])
    try:
        kubernetes_validate.validate(policy, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"NetworkPolicy invalid for {version}: {error.message}")


def test_values_schema_refuses_an_open_prometheus_peer_and_typos() -> None:
    bad: list[dict[str, Any]] = [
        # An empty namespaceSelector is every namespace: anyone labelled "prometheus" gets in.
        {"networkPolicy": {"prometheus": {"namespaceSelector": {"matchLabels": None}}}},
        {"networkPolicy": {"prometheus": {"namespaceSelector": {"matchLabels": None, "matchExpressions": []}}}},
        {"networkPolicy": {"enabeld": True}},
        {"networkPolicy": {"clientPorts": ["http"]}},  # the operator knows the gate's port: no such value
        {"networkPolicy": {"prometheus": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}}},
    ]
    for values in bad:
        with pytest.raises(helm_python.HelmError, match="schema"):
            render(values)


# ------------------------------------------------------------------------------ who gets in


def test_selects_exactly_the_pods_the_operator_injects() -> None:
    policy = fence_of({})
    selector = policy["spec"]["podSelector"]
    template = llama_deployment()["spec"]["template"]
    injected = injected_template(template, SIDECAR)
    assert selects(selector, injected["metadata"]["labels"])
    # Not yet gated (before the first calibration) or no longer (after removal): untouched,
    # llama-server's port keeps serving by its own name.
    assert not selects(selector, template["metadata"]["labels"])
    assert not selects(selector, removed_template(injected)["metadata"]["labels"])
    # The key is the operator's own constant (and the PodMonitor's), so they cannot drift.
    assert list(selector["matchLabels"]) == [names.LABEL_POLICY]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress is left alone
    assert policy["metadata"]["ownerReferences"] == [POLICY.owner_reference()]  # goes with the policy


@pytest.mark.parametrize("variant", ["default", "ci file"])
def test_admin_port_admits_the_operator_and_prometheus_only(variant: str) -> None:
    values = VARIANTS[variant]
    admin = gated_pod().admin
    assert admin["name"] == names.ADMIN_PORT_NAME
    policy = fence_of(values)
    assert admits(policy, operator_peer(values), admin)
    assert admits(policy, PROMETHEUS, admin)
    for who, stranger in STRANGERS.items():
        assert not admits(policy, stranger, admin), who
    assert not admits(policy, ANYWHERE, admin)


def test_admin_rule_names_only_operator_and_prometheus_peers() -> None:
    policy = fence_of(load_values(CI_FILE))
    admin = gated_pod().admin
    covering = [r for r in policy["spec"]["ingress"] if any(port_matches(p, admin) for p in r.get("ports") or [{}])]
    (rule,) = covering
    operator, prometheus = rule["from"]
    assert operator == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "slogate", "app.kubernetes.io/instance": "slogate",
                                        "app.kubernetes.io/component": "operator"}},
    }  # fmt: skip
    configured = load_values(CI_FILE)["networkPolicy"]["prometheus"]
    assert prometheus == {
        "namespaceSelector": {"matchExpressions": configured["namespaceSelector"]["matchExpressions"]},
        "podSelector": configured["podSelector"],
    }


def test_without_prometheus_only_the_operator_reaches_the_admin_port() -> None:
    values = VARIANTS["without prometheus"]
    admin = gated_pod().admin
    policy = fence_of(values)
    assert admits(policy, operator_peer(values), admin)
    assert not admits(policy, PROMETHEUS, admin)


def test_every_pod_of_the_monitoring_namespace_when_the_pod_selector_is_empty() -> None:
    policy = fence_of(VARIANTS["every pod of the monitoring namespace"])
    admin = gated_pod().admin
    assert admits(policy, STRANGERS["another pod of the monitoring namespace"], admin)
    assert not admits(policy, STRANGERS["prometheus labels outside the monitoring namespace"], admin)


def test_without_peers_nobody_reaches_the_admin_port() -> None:
    """No peers (an operator run without the chart): no admin rule at all; a rule without
    `from` would have admitted everyone."""
    spec = parse_spec(admission_policy()["spec"])
    scan = targets.scan(POLICY.name, spec, [llama_deployment()], None)
    policy = fence.fence(POLICY, spec, scan.targets, OperatorSettings().peers())
    pod = gated_pod()
    assert [admits(policy, peer, pod.admin) for peer in everyone({})] == [False] * len(everyone({}))
    assert admits(policy, ANYWHERE, pod.gate)


@pytest.mark.parametrize("variant", ["default", "ci file", "without prometheus"])
@pytest.mark.parametrize(
    ("llama_port_name", "gate_name"),
    [("http", "http"), ("api", "api"), (None, names.CLIENT_PORT_NAME)],
    ids=["llama port named http", "llama port named api", "llama port without a name: slogate"],
)
def test_clients_reach_the_gate_and_nobody_reaches_llama_server(
    variant: str, llama_port_name: str | None, gate_name: str
) -> None:
    """Everyone reaches the gate's client port whatever name it took over; llama-server's own
    port (8080, nameless while gated) admits nobody, not even the operator."""
    values = VARIANTS[variant]
    pod = gated_pod(llama_port_name)
    assert pod.gate["name"] == gate_name
    assert "name" not in pod.llama  # the name went to the gate (or there was none)
    policy = fence_of(values)
    for peer in everyone(values):
        assert admits(policy, peer, pod.gate), peer
        assert not admits(policy, peer, pod.llama), peer
    # A policy with its own spec.sidecar.port and adminPort: the fence follows the numbers.
    moved = gated_pod(llama_port_name, replace(SIDECAR, port=9000, admin_port=9001))
    policy = fence_of(values, port=9000, adminPort=9001)
    assert admits(policy, ANYWHERE, moved.gate)
    assert not admits(policy, ANYWHERE, moved.llama)
    assert not admits(policy, STRANGERS["a pod beside the gated one"], moved.admin)
    assert admits(policy, operator_peer(values), moved.admin)


def test_the_pods_other_ports_stay_open_as_without_slogate() -> None:
    """A container of the user's beside llama-server (an exporter on 9100): its port is
    admitted from everyone, as before the gate; llama-server's served port is not."""
    deployment = llama_deployment()
    exporter = {"name": "exporter", "image": "exporter:1", "ports": [{"name": "metrics", "containerPort": 9100}]}
    deployment["spec"]["template"]["spec"]["containers"].append(exporter)
    policy = fence_of({}, deployment)
    pod = gated_pod()
    assert admits(policy, ANYWHERE, {"name": "metrics", "containerPort": 9100, "protocol": "TCP"})
    assert not admits(policy, ANYWHERE, pod.llama)
    assert not admits(policy, ANYWHERE, pod.admin)


def test_the_evaluation_catches_a_policy_that_lets_strangers_in() -> None:
    """The checks above can fail: loosen the policy and a stranger gets through."""
    policy = fence_of({})
    pod = gated_pod()
    no_namespace = copy.deepcopy(policy)
    del no_namespace["spec"]["ingress"][1]["from"][0]["namespaceSelector"]
    leaky = Peer(policy["metadata"]["namespace"], operator_peer({}).labels)
    assert admits(no_namespace, leaky, pod.admin)
    assert not admits(policy, leaky, pod.admin)
    open_admin = copy.deepcopy(policy)
    del open_admin["spec"]["ingress"][1]["from"]
    assert admits(open_admin, STRANGERS["a pod beside the gated one"], pod.admin)
    all_ports = copy.deepcopy(policy)
    del all_ports["spec"]["ingress"][0]["ports"]
    assert admits(all_ports, STRANGERS["a pod beside the gated one"], pod.admin)
    assert admits(all_ports, STRANGERS["a pod beside the gated one"], pod.llama)
    # llama-server's port by number (what a Service with targetPort: 8080 would need) is a bypass.
    by_number = copy.deepcopy(policy)
    by_number["spec"]["ingress"][0]["ports"].append({"port": 8080, "protocol": "TCP"})
    assert admits(by_number, STRANGERS["a pod beside the gated one"], pod.llama)
    assert not admits(policy, STRANGERS["a pod beside the gated one"], pod.llama)


def test_extra_admin_peers_are_admitted_and_an_open_one_refused() -> None:
    """An endpoint picker that reads the gates' state (docs/routing.md) joins the admin port's
    peers; a peer with an empty selector (every namespace, every pod) is refused."""
    picker = Peer("llm-d", {"app": "epp"})
    values = {"networkPolicy": {"extraAdminPeers": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "llm-d"}}, "podSelector": {"matchLabels": {"app": "epp"}}}]}}  # fmt: skip
    admin = gated_pod().admin
    assert not admits(fence_of({}), picker, admin)
    assert admits(fence_of(values), picker, admin)
    assert admits(fence_of(values), operator_peer(values), admin)
    assert not admits(fence_of(values), STRANGERS["a pod beside the gated one"], admin)
    for open_peer in ({}, {"namespaceSelector": {}}, {"podSelector": {}}, {"ipBlock": {"cidr": "0.0.0.0/0"}}):
        with pytest.raises(helm_python.HelmError, match="schema"):
            render({"networkPolicy": {"extraAdminPeers": [open_peer]}})
