"""The optional NetworkPolicy: off unless asked for; when on, valid for Kubernetes, it selects
the pods the operator really injects, their admin port admits the operator and Prometheus
only, the gate's client port stays open to everyone under whichever name the sidecar took
over from llama-server's port (networkPolicy.clientPorts), and llama-server's own port,
nameless while the gate is in, admits nobody.

Who may connect is decided by evaluating the rendered policy as the API defines it (peers,
selectors, named ports) against the pod the operator's own injection builds, not by
comparing it with a copy of the template.
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

from manifests import llama_deployment
from slogate_operator import names
from slogate_operator.injection import SidecarConfig, injected_template, removed_template

CI_FILE = CHART / "ci" / "network-policy-values.yaml"
NAMESPACED = {
    "networkPolicy": {"enabled": True},
    "operator": {"watch": {"allNamespaces": False, "namespaces": ["llm", "llm-batch"]}},
}
KUBERNETES_VERSIONS = ("1.29.0", "1.32.0", "1.35.0")
SIDECAR = SidecarConfig(
    policy="smollm2", image="slogate:0.1.0", port=8081, admin_port=8082,
    upstream_port=8080, prompt_counting="tokenize", token_secret="slogate-admin-token", llama_container="llama",
)  # fmt: skip
DEFAULT_CLIENT_PORTS = ["http", "slogate"]


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


def network_policies(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [o.obj for o in render(values) if o.kind == "NetworkPolicy"]


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
def test_rendered_only_when_enabled(values_file: Any) -> None:
    values = load_values(values_file) if values_file else {}
    enabled = values.get("networkPolicy", {}).get("enabled", False)
    policies = network_policies(values)
    if enabled:
        assert [p["metadata"]["namespace"] for p in policies] == values["networkPolicy"]["namespaces"]
    else:
        assert policies == []
    assert CI_FILE in CI_VALUES  # the ci/ file that turns it on is among those rendered


def test_namespaced_operator_gets_one_policy_per_watched_namespace() -> None:
    policies = network_policies(NAMESPACED)
    assert [p["metadata"]["namespace"] for p in policies] == ["llm", "llm-batch"]
    assert {p["metadata"]["name"] for p in policies} == {"slogate-sidecar-admin"}
    # An explicit list wins over the watched namespaces.
    chosen = network_policies(NAMESPACED | {"networkPolicy": {"enabled": True, "namespaces": ["llm"]}})
    assert [p["metadata"]["namespace"] for p in chosen] == ["llm"]


def test_cluster_wide_operator_needs_the_namespaces_listed() -> None:
    """One policy in the release namespace would protect nothing: the chart refuses."""
    with pytest.raises(helm_python.HelmError, match=r"networkPolicy\.namespaces must list"):
        render({"networkPolicy": {"enabled": True}})


VARIANTS = {
    "ci file": load_values(CI_FILE),
    "namespaced": NAMESPACED,
    "without prometheus": NAMESPACED | {"networkPolicy": {"enabled": True, "prometheus": {"enabled": False}}},
    "every pod of the monitoring namespace": NAMESPACED
    | {"networkPolicy": {"enabled": True, "prometheus": {"podSelector": {"matchLabels": None}}}},
    # A name YAML would read as a number unquoted: it must stay a name.
    "own client port names": NAMESPACED | {"networkPolicy": {"enabled": True, "clientPorts": ["api", "1e3"]}},
}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_network_policy_validates_strictly(variant: str, version: str) -> None:
    policies = network_policies(VARIANTS[variant])
    assert policies
    for policy in policies:
        try:
            kubernetes_validate.validate(policy, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"NetworkPolicy in {policy['metadata']['namespace']} invalid for {version}: {error.message}")


def test_values_schema_refuses_an_open_prometheus_peer_and_typos() -> None:
    bad: list[dict[str, Any]] = [
        # An empty namespaceSelector is every namespace: anyone labelled "prometheus" gets in.
        {"networkPolicy": {"prometheus": {"namespaceSelector": {"matchLabels": None}}}},
        {"networkPolicy": {"prometheus": {"namespaceSelector": {"matchLabels": None, "matchExpressions": []}}}},
        {"networkPolicy": {"enabeld": True}},
        {"networkPolicy": {"namespaces": ["Not_A_Namespace"]}},
        {"networkPolicy": {"prometheus": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}}},
    ]
    for values in bad:
        with pytest.raises(helm_python.HelmError, match="schema"):
            render(values)


@pytest.mark.parametrize(
    "client_ports",
    [
        [],  # a rule without ports would open every port, the admin port included
        ["slogate-admin"],  # the admin port for everyone
        ["http", "http"],
        ["HTTP"],
        ["my_port"],
        ["my--port"],
        ["-http"],
        ["http-"],
        ["8080"],  # no letter: a number, not a name
        ["a-sixteen-chars-"],
        ["abcdefghijklmnop"],  # 16 characters
        [""],
        [8081],
        "http",
    ],
    ids=repr,
)
def test_client_ports_must_be_port_names(client_ports: Any) -> None:
    """Each entry is an IANA_SVC_NAME (what a container port's name must be), never the admin port."""
    with pytest.raises(helm_python.HelmError, match=r"(?s)schema.*at '/networkPolicy/clientPorts"):
        render(NAMESPACED | {"networkPolicy": {"enabled": True, "clientPorts": client_ports}})


def test_client_ports_render_one_entry_each_and_default_to_http_and_slogate() -> None:
    for values, wanted in [
        (NAMESPACED, DEFAULT_CLIENT_PORTS),
        (load_values(CI_FILE), DEFAULT_CLIENT_PORTS),
        (VARIANTS["own client port names"], ["api", "1e3"]),
        (NAMESPACED | {"networkPolicy": {"enabled": True, "clientPorts": ["abcdefghijklmno", "a1-b2"]}},
         ["abcdefghijklmno", "a1-b2"]),
    ]:  # fmt: skip
        for policy in network_policies(values):
            client, _admin = policy["spec"]["ingress"]
            assert "from" not in client  # from everyone
            assert client["ports"] == [{"port": name, "protocol": "TCP"} for name in wanted]
    assert load_values(CHART / "values.yaml")["networkPolicy"]["clientPorts"] == DEFAULT_CLIENT_PORTS


# ------------------------------------------------------------------------------ who gets in


def test_selects_exactly_the_pods_the_operator_injects() -> None:
    (policy, *_) = network_policies(NAMESPACED)
    selector = policy["spec"]["podSelector"]
    template = llama_deployment()["spec"]["template"]
    injected = injected_template(template, SIDECAR)
    assert selects(selector, injected["metadata"]["labels"])
    # Not yet gated (before the first calibration) or no longer (after removal): untouched,
    # llama-server's port keeps serving by its own name.
    assert not selects(selector, template["metadata"]["labels"])
    assert not selects(selector, removed_template(injected)["metadata"]["labels"])
    # The key is the operator's own constant (and the PodMonitor's), so they cannot drift.
    assert [e["key"] for e in selector["matchExpressions"]] == [names.LABEL_POLICY]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress is left alone


@pytest.mark.parametrize("variant", ["ci file", "namespaced"])
def test_admin_port_admits_the_operator_and_prometheus_only(variant: str) -> None:
    values = VARIANTS[variant]
    admin = gated_pod().admin
    assert admin["name"] == names.ADMIN_PORT_NAME
    operator = operator_peer(values)
    for policy in network_policies(values):
        assert admits(policy, operator, admin)
        assert admits(policy, PROMETHEUS, admin)
        for who, stranger in STRANGERS.items():
            assert not admits(policy, stranger, admin), who
        assert not admits(policy, ANYWHERE, admin)


def test_admin_rule_names_only_operator_and_prometheus_peers() -> None:
    (policy, *_) = network_policies(load_values(CI_FILE))
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
    for policy in network_policies(values):
        assert admits(policy, operator_peer(values), admin)
        assert not admits(policy, PROMETHEUS, admin)


def test_every_pod_of_the_monitoring_namespace_when_the_pod_selector_is_empty() -> None:
    values = VARIANTS["every pod of the monitoring namespace"]
    admin = gated_pod().admin
    for policy in network_policies(values):
        assert admits(policy, STRANGERS["another pod of the monitoring namespace"], admin)
        assert not admits(policy, STRANGERS["prometheus labels outside the monitoring namespace"], admin)


@pytest.mark.parametrize("variant", ["ci file", "namespaced", "without prometheus"])
@pytest.mark.parametrize(
    ("llama_port_name", "gate_name"),
    [("http", "http"), (None, names.CLIENT_PORT_NAME)],
    ids=["llama port named http: handed over", "llama port without a name: slogate"],
)
def test_clients_reach_the_gate_and_nobody_reaches_llama_server(
    variant: str, llama_port_name: str | None, gate_name: str
) -> None:
    """Everyone reaches the gate's client port under the name it carries; llama-server's
    own port (8080, nameless while gated) admits nobody, not even the operator."""
    values = VARIANTS[variant]
    pod = gated_pod(llama_port_name)
    assert pod.gate["name"] == gate_name
    assert "name" not in pod.llama  # the name went to the gate (or there was none)
    for policy in network_policies(values):
        for peer in everyone(values):
            assert admits(policy, peer, pod.gate), peer
            assert not admits(policy, peer, pod.llama), peer
        # A policy with its own spec.sidecar.port and adminPort: the port names hold.
        moved = gated_pod(llama_port_name, replace(SIDECAR, port=9000, admin_port=9001))
        assert moved.gate["containerPort"] == 9000
        assert admits(policy, ANYWHERE, moved.gate)
        assert not admits(policy, ANYWHERE, moved.llama)
        assert not admits(policy, STRANGERS["a pod beside the gated one"], moved.admin)
        assert admits(policy, operator_peer(values), moved.admin)


def test_a_llama_port_named_otherwise_needs_its_name_in_client_ports() -> None:
    """The gate's port carries llama-server's port name: a name not listed is closed, so
    clientPorts must list it; the listed names are the only ones opened."""
    pod = gated_pod("api")
    assert pod.gate["name"] == "api"
    for policy in network_policies(NAMESPACED):
        assert not admits(policy, ANYWHERE, pod.gate)
    values = VARIANTS["own client port names"]
    for policy in network_policies(values):
        assert admits(policy, ANYWHERE, pod.gate)
        assert not admits(policy, ANYWHERE, pod.llama)
        assert not admits(policy, ANYWHERE, gated_pod("http").gate)  # not listed any more
        assert not admits(policy, ANYWHERE, pod.admin)
        assert admits(policy, operator_peer(values), pod.admin)


def test_the_evaluation_catches_a_policy_that_lets_strangers_in() -> None:
    """The checks above can fail: loosen the rendered policy and a stranger gets through."""
    (policy, *_) = network_policies(NAMESPACED)
    pod = gated_pod()
    no_namespace = copy.deepcopy(policy)
    del no_namespace["spec"]["ingress"][1]["from"][0]["namespaceSelector"]
    leaky = Peer(policy["metadata"]["namespace"], operator_peer(NAMESPACED).labels)
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
