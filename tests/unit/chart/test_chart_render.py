"""The chart renders for its defaults and every ci/ values file, into what it promises."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
import yaml
from chart_tools import CHART, CI_VALUES, NAMESPACE, Rendered, load_values, notes, one, render

from slogate_operator import settings
from slogate_operator.rbac import PERMISSIONS

CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())

RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.fixture(params=[None, *CI_VALUES], ids=lambda p: p.name if p else "default")
def rendered(request: pytest.FixtureRequest) -> tuple[dict[str, Any], list[Rendered]]:
    values = load_values(request.param) if request.param else {}
    return values, render(values)


def test_every_container_runs_restricted(rendered: tuple[dict[str, Any], list[Rendered]]) -> None:
    _, objects = rendered
    workloads = [o for o in objects if o.kind in {"Deployment", "StatefulSet", "DaemonSet", "Job"}]
    assert workloads
    for workload in workloads:
        pod = workload.obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in containers(workload.obj):
            context = container["securityContext"]
            assert {k: context.get(k) for k in RESTRICTED} == RESTRICTED, container["name"]
            assert context["runAsUser"] != 0
            # A read-only root needs somewhere to write: /tmp is an emptyDir.
            assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_objects_are_named_for_the_release_and_land_in_its_namespace(
    rendered: tuple[dict[str, Any], list[Rendered]],
) -> None:
    values, objects = rendered
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering", "MutatingWebhookConfiguration"}
    watched = values.get("operator", {}).get("watch", {}).get("namespaces", [])
    for o in objects:
        namespace = o.obj["metadata"].get("namespace")
        if o.kind in cluster_scoped:
            assert namespace is None, o.kind
        elif o.kind in {"Role", "RoleBinding", "KopfPeering"}:
            assert namespace in watched, (o.kind, namespace)
        elif o.kind == "ConfigMap" and o.name.endswith("-dashboard"):
            assert namespace in {NAMESPACE, values.get("monitoring", {}).get("dashboard", {}).get("namespace")}
        else:
            assert namespace == NAMESPACE, (o.kind, o.name)
        assert o.obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "slogate"
    keys = [(o.kind, o.obj["metadata"].get("namespace"), o.name) for o in objects]
    assert len(keys) == len(set(keys)), "two objects share kind, namespace and name"


def test_operator_runs_two_peered_replicas_with_its_settings_in_the_environment() -> None:
    objects = render()
    deployment = one(objects, "Deployment", "-operator").obj
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The local name `docker build -t slogate:0.1.0 .` gives (docs/install.md): no registry
    # publishes slogate's image, so no default pretends one does. The operator's own default
    # (a sidecar image when run outside the chart) is the same.
    assert container["image"] == f"slogate:{CHART_META['appVersion']}" == settings.DEFAULT_IMAGE
    assert container["args"][0] == "operator"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SLOGATE_OPERATOR_PEERING"] == "slogate"
    assert env["SLOGATE_OPERATOR_NAMESPACES"] == ""  # cluster-wide
    assert env["SLOGATE_OPERATOR_IMAGE"] == settings.DEFAULT_IMAGE
    assert env["SLOGATE_OPERATOR_ADMIN_TOKEN_SECRET"] == "slogate-admin-token"
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount").name
    # The peering object the replicas share exists, cluster-scoped for a cluster-wide operator.
    assert one(objects, "ClusterKopfPeering").name == env["SLOGATE_OPERATOR_PEERING"]
    # Drains keep one replica; the scheduler is asked to spread them.
    assert one(objects, "PodDisruptionBudget").obj["spec"]["minAvailable"] == 1
    assert "podAntiAffinity" in pod["affinity"]
    # The probe and the metrics port match the operator's settings.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "health": int(env["SLOGATE_OPERATOR_LIVENESS_PORT"]),
        "metrics": int(env["SLOGATE_OPERATOR_METRICS_PORT"]),
        "webhook": int(env["SLOGATE_OPERATOR_WEBHOOK_PORT"]),
    }
    # The injection webhook: the Service the API server calls, and the configuration the
    # operator writes its entries into (none from the chart).
    namespace, service = env["SLOGATE_OPERATOR_WEBHOOK_SERVICE"].split("/")
    webhook = one(objects, "Service", "-operator-webhook").obj
    assert (webhook["metadata"]["namespace"], webhook["metadata"]["name"]) == (namespace, service)
    assert webhook["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    configuration = one(objects, "MutatingWebhookConfiguration").obj
    assert configuration["metadata"]["name"] == env["SLOGATE_OPERATOR_WEBHOOK_CONFIGURATION"]
    assert "webhooks" not in configuration  # the operator's own entries survive a helm upgrade
    assert container["livenessProbe"]["httpGet"]["port"] == "health"


def test_namespaced_operator_gets_roles_and_peerings_only_where_it_watches() -> None:
    objects = render(load_values(CHART / "ci" / "namespaced-values.yaml"))
    deployment = one(objects, "Deployment", "-operator").obj
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SLOGATE_OPERATOR_NAMESPACES"] == "llm,llm-batch"
    assert sorted(o.obj["metadata"]["namespace"] for o in objects if o.kind == "Role") == ["llm", "llm-batch"]
    assert sorted(o.obj["metadata"]["namespace"] for o in objects if o.kind == "KopfPeering") == ["llm", "llm-batch"]
    assert not [o for o in objects if o.kind == "ClusterKopfPeering"]
    # The ClusterRole keeps only CRD discovery and the webhook's own configuration, by name:
    # no cluster-wide reach into workloads.
    cluster_role = one(objects, "ClusterRole").obj
    assert [r["resources"] for r in cluster_role["rules"]] == [["customresourcedefinitions"],
                                                              ["mutatingwebhookconfigurations"]]  # fmt: skip
    assert cluster_role["rules"][1]["resourceNames"] == [env["SLOGATE_OPERATOR_WEBHOOK_CONFIGURATION"]]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(
        "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """(group, resource, verb, resourceNames: empty for any object) of each rule."""
    return {(g, r, v, tuple(rule.get("resourceNames") or ())) for rule in rules for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip


def operator_calls(*, scope: str, cluster_wide: bool) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """slogate_operator.rbac.PERMISSIONS (the operator's own list, checked against every
    call it makes) for one kind of role. Peering: ClusterKopfPeering when serving every
    namespace, KopfPeering per namespace otherwise; `namespaces` is only for namespace
    globs, which the chart's schema refuses."""
    skip = {"namespaces", "kopfpeerings" if cluster_wide else "clusterkopfpeerings"}
    defaults = settings.OperatorSettings()  # the chart's values name the same objects by default
    return {
        (p.group, p.resource, verb, (getattr(defaults, p.named_by),) if p.named_by else ())
        for p in PERMISSIONS
        if p.resource not in skip and (p.scope == scope or (cluster_wide and scope == "cluster"))
        for verb in p.verbs
    }


def test_rbac_grants_what_the_operator_calls_and_nothing_else() -> None:
    """Cluster-wide: one ClusterRole with exactly the operator's table."""
    granted = grants(one(render(), "ClusterRole").obj["rules"])
    assert "*" not in {g for g, _, _, _ in granted}
    assert "*" not in {v for _, _, v, _ in granted}
    assert granted == operator_calls(scope="cluster", cluster_wide=True)


def test_the_only_secret_the_operator_reads_is_its_token_named_by_the_values() -> None:
    secrets = {g for g in grants(one(render(), "ClusterRole").obj["rules"]) if g[1] == "secrets"}
    assert secrets == {("", "secrets", "create", ()), ("", "secrets", "get", ("slogate-admin-token",)),
                       ("", "secrets", "patch", ("slogate-admin-token",))}  # fmt: skip
    renamed = render({"operator": {"adminTokenSecretName": "gate-token"}})
    assert ("", "secrets", "get", ("gate-token",)) in grants(one(renamed, "ClusterRole").obj["rules"])


def test_namespaced_rbac_splits_the_table_into_roles_and_discovery() -> None:
    objects = render(load_values(CHART / "ci" / "namespaced-values.yaml"))
    assert grants(one(objects, "ClusterRole").obj["rules"]) == operator_calls(scope="cluster", cluster_wide=False)
    for role in (o for o in objects if o.kind == "Role"):
        assert grants(role.obj["rules"]) == operator_calls(scope="namespace", cluster_wide=False), role.obj["metadata"]
    bindings = [o.obj for o in objects if o.kind in {"RoleBinding", "ClusterRoleBinding"}]
    assert len(bindings) == 3
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "slogate", "namespace": NAMESPACE}]


def test_monitoring_objects_follow_their_switches() -> None:
    kinds = {o.kind for o in render()}
    assert {"PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap", "Service"} <= kinds
    for key, kind in (("podMonitor", "PodMonitor"), ("serviceMonitor", "ServiceMonitor"),
                      ("prometheusRule", "PrometheusRule"), ("dashboard", "ConfigMap")):  # fmt: skip
        left = {o.kind for o in render({"monitoring": {key: {"enabled": False}}})}
        assert kind not in left, key
        assert (kinds - {kind, "Service"}) <= left  # the others stay (the Service belongs to the ServiceMonitor)


def test_pod_monitor_scrapes_the_sidecar_admin_port_and_labels_the_workload() -> None:
    spec = one(render(), "PodMonitor").obj["spec"]
    assert spec["selector"] == {"matchExpressions": [{"key": "slogate.dev/policy", "operator": "Exists"}]}
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "slogate-admin"
    assert endpoint["path"] == "/metrics"
    targets = [r["targetLabel"] for r in endpoint["relabelings"]]
    assert targets.count("workload") == 2  # from the ReplicaSet, else the controller
    assert targets.count("policy") == 1  # from the pod's slogate.dev/policy label
    service_monitor = one(render(), "ServiceMonitor").obj["spec"]
    service = one(render(), "Service", "-operator-metrics").obj["spec"]
    assert service_monitor["endpoints"][0]["port"] == service["ports"][0]["name"] == "metrics"
    # The operator's per-policy series keep their own namespace label.
    assert service_monitor["endpoints"][0]["honorLabels"] is True
    assert service_monitor["selector"]["matchLabels"].items() <= service["selector"].items()


def test_values_schema_refuses_what_would_break_the_install() -> None:
    bad: list[dict[str, Any]] = [
        {"operator": {"replicas": 0}},
        {"alerts": {"sheddingWarning": {"ratio": 1.5}}},
        {"alerts": {"sheddingCritical": {"for": "five minutes"}}},
        {"alerts": {"groupBy": []}},
        {"monitoring": {"podMonitor": {"enabeld": True}}},  # a typo is an error, not a no-op
        {"image": {"pullPolicy": "Sometimes"}},
    ]
    chart = helm_python.Chart.load(str(CHART))
    try:
        for values in bad:
            with pytest.raises(helm_python.HelmError, match="schema"):
                chart.render(values, name="slogate", namespace=NAMESPACE)
    finally:
        chart.close()


def test_watching_listed_namespaces_needs_a_list() -> None:
    with pytest.raises(helm_python.HelmError, match=r"operator\.watch\.namespaces must list"):
        render({"operator": {"watch": {"allNamespaces": False, "namespaces": []}}})


def test_notes_say_what_to_do_next() -> None:
    text = notes()
    assert "kubectl -n llm apply -f examples/smollm2.yaml" in text
    assert "kubectl get admissionpolicies" in text
    assert "8081" in text
    # The Service targets llama-server's port by name; the sidecar takes the name over.
    assert "targetPort: http" in text
    assert "PrometheusRule slogate-alerts: shedding above each policy's spec.alerting ratios" in text
    tuned = notes(load_values(CHART / "ci" / "tuned-alerts-values.yaml"))
    assert "shedding above 0.02 (warning) and 0.1 (critical)" in tuned
    quiet = notes(load_values(CHART / "ci" / "no-monitoring-values.yaml"))
    assert "nothing pages on shedding" in quiet
