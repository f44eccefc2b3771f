"""The emulated API server on the autoscalers' kinds, as kube-apiserver would answer: every
verb on keda.sh is 404 until KEDA's CRD is installed; an HPA is defaulted as Go's
SetDefaults_HorizontalPodAutoscaler does; RBAC refuses a verb on them the Role lacks."""

from __future__ import annotations

import pytest
from keda_reference import keda_schema

from emulated_cluster import HPAS, NS, SCALED_OBJECTS, ApiError, Cluster
from slogate_operator import rbac
from workload_controllers import hpa_reports

OPERATOR = "slogate-operator/0.1"


def hpa(name: str = "web", **spec: object) -> dict[str, object]:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                     "maxReplicas": 4, **spec}}  # fmt: skip


def scaled_object(name: str = "web") -> dict[str, object]:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"name": name}, "invented": 1,
                     "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}}  # fmt: skip


def test_keda_is_not_served_until_its_crd_is_installed(cluster: Cluster) -> None:
    path = SCALED_OBJECTS.format(ns=NS)
    for method, body in (("GET", None), ("POST", scaled_object()), ("DELETE", None)):
        with pytest.raises(ApiError) as missing:
            cluster.request(method, path if method != "DELETE" else f"{path}/web", body)
        assert missing.value.status == 404, method
    cluster.install_keda(keda_schema())
    created = cluster.create(SCALED_OBJECTS, scaled_object())
    assert created["metadata"]["uid"]
    if keda_schema() is not None:
        assert "invented" not in created["spec"]  # pruned, as its structural schema does
    assert [o["metadata"]["name"] for o in cluster.list(SCALED_OBJECTS)] == ["web"]


def test_an_hpa_is_defaulted_like_kube_apiserver_and_keeps_status_apart(cluster: Cluster) -> None:
    behavior = {"scaleUp": {"stabilizationWindowSeconds": 30}, "scaleDown": {"stabilizationWindowSeconds": 60}}
    created = cluster.create(HPAS, hpa(behavior=behavior, status={"desiredReplicas": 9}))
    spec = created["spec"]
    assert spec["minReplicas"] == 1
    assert spec["metrics"] == [{"type": "Resource",
                                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]  # fmt: skip
    up, down = spec["behavior"]["scaleUp"], spec["behavior"]["scaleDown"]
    assert (up["stabilizationWindowSeconds"], up["selectPolicy"], len(up["policies"])) == (30, "Max", 2)
    assert (down["stabilizationWindowSeconds"], down["policies"]) == (
        60,
        [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    )
    assert "status" not in created  # a create sets no status
    no_behavior = cluster.create(HPAS, hpa("api"))["spec"]
    assert "behavior" not in no_behavior  # only a behavior given is filled in
    reported = hpa_reports(cluster, "web", current=2, desired=3)
    assert reported["status"]["desiredReplicas"] == 3
    assert reported["metadata"]["generation"] == created["metadata"]["generation"]


def test_the_operator_may_do_on_autoscalers_only_what_its_role_grants(cluster: Cluster) -> None:
    cluster.create(HPAS, hpa())
    path = HPAS.format(ns=NS)
    assert cluster.request("GET", f"{path}/web", agent=OPERATOR)["metadata"]["name"] == "web"
    assert rbac.allows("autoscaling", "horizontalpodautoscalers", "delete")
    assert not rbac.allows("autoscaling", "horizontalpodautoscalers", "watch")
    with pytest.raises(ApiError) as refused:
        cluster.request("GET", f"{path}?watch=true", agent=OPERATOR)
    assert refused.value.status == 403
    with pytest.raises(ApiError) as status_write:
        cluster.request("PATCH", f"{path}/web/status", {"status": {}}, "application/merge-patch+json", agent=OPERATOR)
    assert status_write.value.status == 403
    assert [(r.verb, r.resource) for r in cluster.forbidden] == [
        ("watch", "horizontalpodautoscalers"), ("patch", "horizontalpodautoscalers/status"),
    ]  # fmt: skip
