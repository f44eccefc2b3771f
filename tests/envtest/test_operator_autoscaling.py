"""The real operator (kopf) against a real API server owns each target's autoscaler: a KEDA ScaledObject
valid against KEDA's own CRD, or an HPA valid for Kubernetes; updated when the spec changes,
deleted when autoscaling is off or the Deployment no longer targeted; the replicas its HPA
reports in the status; a clear condition, and a gate that keeps working, without KEDA or
without the RBAC for it; and never a write of a Deployment's replicas. The tests play KEDA's
operator and the HPA controller (tests/workload_controllers.py)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from kopf.testing import KopfRunner
from operator_flows import apply_and_calibrate, assert_status_fits_the_crd, events, policy, status_of

from api_cluster import DEPLOYMENTS, HPAS, OPERATOR_AGENT, POLICIES, SCALED_OBJECTS, Cluster
from canned_profiles import smollm2_profile
from keda_reference import keda_errors, keda_schema, required_keda_schema
from kopf_thread import running_operator, settle
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from slogate_calibration.output import compact_json
from slogate_operator.demand_query import demand_query
from workload_controllers import complete_job, gate_of, hpa_reports, job_names, keda_makes_hpa, ready_pod

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread

AUTOSCALING = {"enabled": True, "maxReplicas": 5}
K8S = "1.33.0"


def names_of(cluster: Cluster, collection: str) -> set[str]:
    return {o["metadata"]["name"] for o in cluster.list(collection)}


def autoscaling_status(cluster: Cluster, name: str = "smollm2") -> dict[str, Any]:
    return dict((policy(cluster, name).get("status") or {}).get("autoscaling") or {})


def scaling_condition(cluster: Cluster, name: str = "smollm2") -> dict[str, Any]:
    return condition(cluster.get(POLICIES, name), "AutoscalingReady")


def replica_writes(cluster: Cluster) -> list[str]:
    """Writes by the operator (its client or kopf) that touch a Deployment's replicas."""
    found = []
    for r in cluster.received():
        agent = r.headers.get("User-Agent", "")
        if r.resource is None or r.resource.plural != "deployments" or r.method not in ("PATCH", "PUT", "POST"):
            continue
        if not agent.startswith((OPERATOR_AGENT, "kopf/")):
            continue
        data = r.body
        ops = data if isinstance(data, list) else []
        if (
            r.subresource == "scale"
            or any("/replicas" in str(op.get("path")) for op in ops)
            or (isinstance(data, dict) and "replicas" in (data.get("spec") or {}))
        ):
            found.append(f"{r.method.value} {r.path}")
    return found


def assert_replicas_never_written(cluster: Cluster, *deployments: str, replicas: int = 1) -> None:
    assert replica_writes(cluster) == []
    calls = cluster.api_calls()
    assert not [key for key in calls if key[1].startswith("deployments/scale")], calls
    assert cluster.api_calls(agent="kopf/")[("patch", "deployments")] == 0
    assert calls[("patch", "deployments")] >= 1  # it did patch them: the claim and the sidecar
    for name in deployments:
        assert cluster.get(DEPLOYMENTS, name)["spec"]["replicas"] == replicas


# ------------------------------------------------------------------------------ KEDA


def test_a_scaled_object_valid_for_keda_follows_the_first_thresholds_and_reports_its_hpa(
    cluster: Cluster, operator: KopfRunner
) -> None:
    cluster.install_keda(required_keda_schema())
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy(autoscaling=AUTOSCALING))
    (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
    # No thresholds, no sidecar deciding, no work priced: a ScaledObject now would scale to minReplicas.
    eventually(lambda: scaling_condition(cluster).get("reason") == "WaitingForThresholds")
    assert names_of(cluster, SCALED_OBJECTS) == set()
    complete_job(cluster, job, compact_json(smollm2_profile()))
    (made,) = eventually(lambda: cluster.list(SCALED_OBJECTS), what="a ScaledObject")
    assert keda_errors(made) == []
    assert made["metadata"]["name"] == "smollm2-smollm2"
    (owner,) = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "AdmissionPolicy",
        policy(cluster)["metadata"]["uid"],
        True,
    )
    (trigger,) = made["spec"]["triggers"]
    assert trigger["metadata"]["query"] == demand_query("llm", "smollm2", 60)
    assert trigger["metadata"]["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
    eventually(lambda: scaling_condition(cluster).get("reason") == "HpaPending", what="HpaPending")
    # The event follows the status write that said HpaPending (outcome.publish).
    eventually(lambda: {e["reason"] for e in events(cluster, "AutoscalerCreated")} == {"AutoscalerCreated"})
    # KEDA's operator makes its HPA; the HPA controller reports two pods' worth at 0.7: three.
    keda_makes_hpa(cluster, "smollm2-smollm2")
    hpa_reports(cluster, "keda-hpa-smollm2-smollm2", current=1, desired=3)
    eventually(lambda: scaling_condition(cluster).get("status") == "True", what="AutoscalingReady")
    found = autoscaling_status(cluster)
    assert (found["engine"], found["minReplicas"], found["maxReplicas"]) == ("keda", 1, 5)
    assert (found["desiredReplicas"], found["currentReplicas"]) == (3, 1)  # the Desired and Current columns
    assert found["objects"] == [{"deployment": "smollm2", "kind": "ScaledObject", "name": "smollm2-smollm2",
                                 "hpa": "keda-hpa-smollm2-smollm2", "desiredReplicas": 3, "currentReplicas": 1}]  # fmt: skip
    assert_status_fits_the_crd(policy(cluster))
    assert status_of(cluster, "Ready") == "True"
    assert_replicas_never_written(cluster, "smollm2")
    assert cluster.forbidden == []


def scale_up_window(scaled_object: dict[str, Any]) -> int:
    return int(scaled_object["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]
               ["stabilizationWindowSeconds"])  # fmt: skip


def test_the_scale_up_window_is_derived_from_the_start_up_the_api_server_recorded(
    cluster: Cluster, operator: KopfRunner
) -> None:
    """Unset in the spec: the pods' median creation to Ready + the 60 s rate window + the 15 s
    poll; before any pod is Ready, the start-up counts as 0."""
    cluster.install_keda(required_keda_schema())
    apply_and_calibrate(cluster, autoscaling=AUTOSCALING)
    (made,) = eventually(lambda: cluster.list(SCALED_OBJECTS), what="a ScaledObject")
    assert scale_up_window(made) == 60 + 15
    assert "podStartupSeconds" not in autoscaling_status(cluster)
    for index, startup in enumerate((40, 42, 300)):  # one pod on a slow node does not set the median
        ready_pod(cluster, "smollm2", startup, index)
    eventually(lambda: scale_up_window(cluster.get(SCALED_OBJECTS, "smollm2-smollm2")) == 42 + 60 + 15,
               what="the window of the measured start-up")  # fmt: skip
    found = eventually(lambda: (a := autoscaling_status(cluster)).get("podStartupSeconds") and a)
    assert (found["podStartupSeconds"], found["scaleUpStabilizationSeconds"]) == (42.0, 117)
    assert_status_fits_the_crd(policy(cluster))
    updates = len(cluster.calls("PUT", "scaledobjects")) + len(cluster.calls("PATCH", "scaledobjects"))
    ready_pod(cluster, "smollm2", 45, 3)  # the median moves by 2.5 s, within 20 %: nothing is rewritten
    settle("smollm2", more=3)
    assert len(cluster.calls("PUT", "scaledobjects")) + len(cluster.calls("PATCH", "scaledobjects")) == updates
    assert autoscaling_status(cluster)["podStartupSeconds"] == 42.0
    cluster.patch(POLICIES, "smollm2", {"spec": {"autoscaling": {"scaleUpStabilizationSeconds": 0}}})
    eventually(lambda: scale_up_window(cluster.get(SCALED_OBJECTS, "smollm2-smollm2")) == 0, what="the spec's 0")


def test_a_spec_change_updates_the_scaled_object_once_and_disabling_deletes_it(
    cluster: Cluster, operator: KopfRunner
) -> None:
    cluster.install_keda(keda_schema())  # without the file: stored as sent, the flow is the same
    apply_and_calibrate(cluster, autoscaling=AUTOSCALING)
    eventually(lambda: names_of(cluster, SCALED_OBJECTS) == {"smollm2-smollm2"}, what="a ScaledObject")
    settle("smollm2")
    patches = len(cluster.calls("PATCH", "scaledobjects"))
    settle("smollm2")
    assert len(cluster.calls("PATCH", "scaledobjects")) == patches == 0  # nothing drifted: no write
    change = {
        "maxReplicas": 8,
        "targetUtilization": 0.5,
        "scaleDownStabilizationSeconds": 60,
        "metricWindowSeconds": 120,
    }
    cluster.patch(POLICIES, "smollm2", {"spec": {"autoscaling": change}})

    def updated() -> dict[str, Any] | None:
        found = cluster.get(SCALED_OBJECTS, "smollm2-smollm2")
        return found if found and found["spec"]["maxReplicaCount"] == 8 else None

    spec = eventually(updated, what="the new maxReplicaCount")["spec"]
    (trigger,) = spec["triggers"]
    assert trigger["metadata"]["threshold"] == "0.5"
    assert trigger["metadata"]["query"] == demand_query("llm", "smollm2", 120)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 60
    }
    eventually(lambda: events(cluster, "AutoscalerUpdated"), what="an AutoscalerUpdated event")
    eventually(lambda: autoscaling_status(cluster).get("maxReplicas") == 8)
    cluster.patch(POLICIES, "smollm2", {"spec": {"autoscaling": {"enabled": False}}})
    eventually(lambda: names_of(cluster, SCALED_OBJECTS) == set(), what="the ScaledObject deleted")
    eventually(lambda: autoscaling_status(cluster) == {} and scaling_condition(cluster) == {})
    eventually(
        lambda: events(cluster, "AutoscalerDeleted"), what="an AutoscalerDeleted event"
    )  # posted after the status
    settle("smollm2")
    assert len(cluster.calls("DELETE", "scaledobjects")) == 1  # once: the status no longer records it
    assert status_of(cluster, "Ready") == "True"
    assert_replicas_never_written(cluster, "smollm2")
    assert cluster.forbidden == []


def test_a_deployment_that_stops_matching_loses_its_autoscaler(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.install_keda(keda_schema())
    for name in ("a", "b"):
        cluster.create(DEPLOYMENTS, llama_deployment(name, labels={"tier": "llm"}))
    body = admission_policy("chat", selector={"matchLabels": {"tier": "llm"}}, autoscaling=AUTOSCALING)
    del body["spec"]["targetRef"]
    cluster.create(POLICIES, body)
    (job,) = eventually(lambda: job_names(cluster), what="one calibration Job for both")
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: names_of(cluster, SCALED_OBJECTS) == {"chat-a", "chat-b"}, what="two ScaledObjects")
    cluster.patch(DEPLOYMENTS, "b", {"metadata": {"labels": {"tier": "other"}}})
    eventually(lambda: names_of(cluster, SCALED_OBJECTS) == {"chat-a"}, what="b's ScaledObject deleted")
    eventually(lambda: [o["deployment"] for o in autoscaling_status(cluster, "chat").get("objects", [])] == ["a"])
    assert_replicas_never_written(cluster, "a", "b")
    assert cluster.forbidden == []


# ------------------------------------------------------------------------------ what may be missing


def test_without_keda_the_policy_says_what_to_install_and_the_gate_keeps_working(
    cluster: Cluster, operator: KopfRunner
) -> None:
    apply_and_calibrate(cluster, autoscaling=AUTOSCALING)  # Ready: calibrated, thresholds pushed
    found = eventually(lambda: (c := scaling_condition(cluster)).get("reason") == "KedaNotInstalled" and c)
    assert found["status"] == "False"
    assert "install KEDA" in found["message"]
    assert "engine: hpa" in found["message"]
    assert status_of(cluster, "Ready") == "True"
    assert status_of(cluster, "Degraded") == "False"
    assert gate_of(cluster, "smollm2") is not None  # gated
    assert cluster.forbidden == []
    # KEDA installed later: the next pass makes the ScaledObject.
    cluster.install_keda(keda_schema())
    eventually(lambda: names_of(cluster, SCALED_OBJECTS) == {"smollm2-smollm2"}, what="a ScaledObject")


def test_refused_by_rbac_the_policy_says_what_to_grant_and_the_gate_keeps_working(
    cluster: Cluster, operator: KopfRunner
) -> None:
    cluster.install_keda(keda_schema())
    cluster.grant_only(lambda rule: rule["apiGroups"] != ["keda.sh"])  # the ClusterRole without KEDA's rule
    apply_and_calibrate(cluster, autoscaling=AUTOSCALING)
    found = eventually(lambda: (c := scaling_condition(cluster)).get("reason") == "Forbidden" and c)
    assert "scaledobjects.keda.sh" in found["message"]
    assert "grant" in found["message"]
    assert status_of(cluster, "Ready") == "True"
    assert {r.resource for r in cluster.forbidden} == {"scaledobjects"}
    cluster.grant_only(None)
    eventually(lambda: names_of(cluster, SCALED_OBJECTS) == {"smollm2-smollm2"}, what="a ScaledObject once granted")


# ------------------------------------------------------------------------------ the HPA engine


def test_the_hpa_engine_owns_a_valid_hpa_reads_its_status_and_gives_way_to_keda(
    cluster: Cluster, operator: KopfRunner
) -> None:
    apply_and_calibrate(cluster, autoscaling={"enabled": True, "engine": "hpa", "minReplicas": 2, "maxReplicas": 4})
    (listed,) = eventually(lambda: cluster.list(HPAS), what="an HPA")
    made = cluster.get(HPAS, listed["metadata"]["name"])  # a list's items carry no apiVersion and kind
    try:
        kubernetes_validate.validate(made, K8S, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{error.message} at {list(error.path)}")
    assert made["metadata"]["name"] == "smollm2-smollm2"
    (metric,) = made["spec"]["metrics"]
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "700m"}
    # The API server defaulted the behavior's policies beside ours: that is no drift to patch.
    assert made["spec"]["behavior"]["scaleUp"]["selectPolicy"] == "Max"
    settle("smollm2")
    assert cluster.calls("PATCH", "horizontalpodautoscalers") == []
    hpa_reports(cluster, "smollm2-smollm2", current=2, desired=4)
    eventually(lambda: autoscaling_status(cluster).get("desiredReplicas") == 4, what="desired replicas")
    found = autoscaling_status(cluster)
    assert (found["engine"], found["currentReplicas"], found["objects"][0]["hpa"]) == ("hpa", 2, "smollm2-smollm2")
    assert scaling_condition(cluster)["status"] == "True"
    assert_status_fits_the_crd(policy(cluster))
    # The HPA controller says it does not scale (here a user's own HPA on the same pods, which
    # disables both since Kubernetes 1.26): the policy says so, in the controller's words.
    ambiguous = {"type": "ScalingActive", "status": "False", "reason": "AmbiguousSelector",
                 "message": "pods by selector app=smollm2 are controlled by multiple HPAs: [llm/smollm2-smollm2 llm/mine]"}  # fmt: skip
    hpa_reports(cluster, "smollm2-smollm2", current=2, desired=2, conditions=[ambiguous])
    found = eventually(lambda: (c := scaling_condition(cluster)).get("reason") == "HpaCannotScale" and c)
    assert found["status"] == "False"
    assert "AmbiguousSelector" in found["message"]
    assert "multiple HPAs" in found["message"]
    hpa_reports(cluster, "smollm2-smollm2", current=2, desired=4, conditions=[ambiguous | {"status": "True"}])
    eventually(lambda: scaling_condition(cluster).get("reason") == "Scaling", what="scaling again")
    # Switching engines: the HPA goes, a ScaledObject comes.
    cluster.install_keda(keda_schema())
    cluster.patch(POLICIES, "smollm2", {"spec": {"autoscaling": {"engine": "keda"}}})
    eventually(lambda: names_of(cluster, SCALED_OBJECTS) == {"smollm2-smollm2"}, what="a ScaledObject")
    eventually(lambda: names_of(cluster, HPAS) == set(), what="the HPA deleted")
    assert_replicas_never_written(cluster, "smollm2")
    assert cluster.forbidden == []


def test_a_name_taken_by_an_object_the_policy_does_not_control_is_left_alone(
    cluster: Cluster, operator: KopfRunner
) -> None:
    cluster.install_keda(keda_schema())
    foreign = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "smollm2-smollm2"},
               "spec": {"scaleTargetRef": {"name": "other"}, "triggers": [{"type": "cpu", "metadata": {"value": "50"}}]}}  # fmt: skip
    before = cluster.create(SCALED_OBJECTS, foreign)
    apply_and_calibrate(cluster, autoscaling=AUTOSCALING)
    found = eventually(lambda: (c := scaling_condition(cluster)).get("reason") == "NameTaken" and c)
    assert "smollm2-smollm2" in found["message"]
    settle("smollm2")
    assert cluster.get(SCALED_OBJECTS, "smollm2-smollm2") == before  # neither patched nor deleted
    assert cluster.calls("PATCH", "scaledobjects") == []
    assert cluster.calls("DELETE", "scaledobjects") == []


def test_disabling_deletes_an_hpa_a_failed_pass_never_recorded(cluster: Cluster) -> None:
    """The review: a pass that made the HPA and failed before its status write left no record;
    disabling autoscaling then deleted only what the status recorded, and the HPA stayed,
    scaling a Deployment no policy meant to scale."""
    with running_operator(cluster):
        apply_and_calibrate(cluster, autoscaling={"enabled": True, "engine": "hpa", "maxReplicas": 4})
        eventually(lambda: cluster.list(HPAS), what="an HPA")
        eventually(lambda: autoscaling_status(cluster).get("objects"), what="the HPA recorded")
    # As the failed pass left it: the HPA exists, the status does not record it.
    status = policy(cluster)["status"]
    cluster.json_patch(POLICIES, "smollm2", [{"op": "remove", "path": "/status/autoscaling"}], sub="status")
    assert "autoscaling" not in policy(cluster)["status"]
    assert status["observedGeneration"] == policy(cluster)["metadata"]["generation"]
    cluster.patch(POLICIES, "smollm2", {"spec": {"autoscaling": {"enabled": False}}})
    with running_operator(cluster):
        eventually(lambda: cluster.list(HPAS) == [], what="the unrecorded HPA deleted")
        deleted = eventually(lambda: events(cluster, "AutoscalerDeleted"), what="an AutoscalerDeleted event")
        assert [e["message"] for e in deleted] == ["HorizontalPodAutoscaler smollm2-smollm2 deleted"]
