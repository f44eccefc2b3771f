"""The real operator (kopf) against a real API server: the main path, selection and removal, RBAC.
The tests play the Job and Deployment controllers; profiles are the builder's SmolLM2
shape (tests/integration/test_operator_sidecars.py runs the same flow on a profile
measured by the real `slogate calibrate`, with real sidecars receiving the pushes)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kopf.testing import KopfRunner
from operator_flows import (
    ARGS_T1,
    apply_and_calibrate,
    assert_status_fits_the_crd,
    current_job,
    policy,
    roll_out,
    slower,
    status_of,
    thresholds_in,
)

from api_cluster import CONFIGMAPS, DEPLOYMENTS, EVENTS, POLICIES, SECRETS, Cluster
from canned_profiles import smollm2_profile
from kopf_thread import settle
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile
from slogate_calibration.output import compact_json
from slogate_operator import names, rbac
from slogate_operator.spec import parse_spec
from workload_controllers import complete_job, containers_of_a_new_pod, fail_job, gate_of, job_names

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread

# ------------------------------------------------------------------------------ the main path


def test_apply_claims_the_target_and_starts_one_calibration_before_injecting(
    cluster: Cluster, operator: KopfRunner
) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
    deployment = cluster.get(DEPLOYMENTS, "smollm2")
    assert deployment["metadata"]["annotations"][names.ANNOTATION_CLAIM] == "smollm2"
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["llama"]  # the gate comes with the first thresholds
    assert cluster.get(CONFIGMAPS, "smollm2-thresholds") is not None
    assert cluster.get(SECRETS, "slogate-admin-token")["metadata"]["ownerReferences"][0]["name"] == "smollm2"
    found = eventually(
        lambda: (p := policy(cluster)) and condition(p, "Calibrated").get("reason") == "Calibrating" and p
    )
    assert found["status"]["calibrating"]["job"] == job
    assert status_of(cluster, "Ready") == "False"
    assert_status_fits_the_crd(found)
    assert {e["reason"] for e in cluster.list(EVENTS)} >= {"CalibrationStarted"}
    assert len(cluster.calls("POST", "jobs")) == 1
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: gate_of(cluster, "smollm2") is not None, what="the pods rolled onto the gate")
    eventually(lambda: {e["reason"] for e in cluster.list(EVENTS)} >= {"SidecarInjected"})
    # The template keeps the user's containers; a pod gets the gate when the API server admits it.
    assert [c["name"] for c in cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["containers"]] == [
        "llama"
    ]
    assert containers_of_a_new_pod(cluster, "smollm2") == ["llama", names.SIDECAR_CONTAINER]


def test_a_completed_calibration_puts_derived_thresholds_in_configmap_and_status(
    cluster: Cluster, operator: KopfRunner
) -> None:
    job = apply_and_calibrate(cluster)
    found = policy(cluster)
    expected = derive_thresholds(parse_spec(found["spec"]).policy, smollm2_profile(), derived_at=datetime.now(UTC))
    stored = thresholds_in(cluster)
    assert stored is not None
    assert stored.model_copy(update={"derived_at": expected.derived_at}) == expected
    assert found["status"]["thresholds"]["calibrationId"] == "cal-test"
    assert found["status"]["thresholds"]["tokenBudget"] == int(expected.classes[0].token_budget)
    # The Default-TTFT printer column's field, kept by the API server's pruning.
    assert found["status"]["thresholds"]["defaultClassTtftSeconds"] == 2.0
    assert found["status"]["calibration"]["job"] == job
    assert found["status"]["pushed"] == "0/0"  # no pod runs yet: the ConfigMap is what they will boot with
    assert "calibrating" not in found["status"]
    assert_status_fits_the_crd(found)
    cm = cluster.get(CONFIGMAPS, "smollm2-thresholds")
    assert CalibrationProfile.model_validate_json(cm["data"][names.PROFILE_KEY]) == smollm2_profile()
    assert {e["reason"] for e in cluster.list(EVENTS)} >= {"CalibrationSucceeded", "ThresholdsDerived"}


def test_a_new_quantization_or_thread_count_recalibrates_a_label_does_not(
    cluster: Cluster, operator: KopfRunner
) -> None:
    first = apply_and_calibrate(cluster)
    old = thresholds_in(cluster)
    # Only a label and the replica count: the fingerprint stays, nothing is calibrated.
    cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"labels": {"team": "ml"}}, "spec": {"replicas": 3}})
    cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"template": {"metadata": {"labels": {"rev": "2"}}}}})
    settle("smollm2")
    assert job_names(cluster) == [first]
    assert len(cluster.calls("POST", "jobs")) == 1
    assert thresholds_in(cluster) == old
    assert status_of(cluster, "Ready") == "True"
    # One thread instead of two: a new fingerprint, a new Job; the old thresholds stay in force meanwhile.
    deployment = cluster.get(DEPLOYMENTS, "smollm2")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    containers[0]["args"] = ARGS_T1
    cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"template": {"spec": {"containers": containers}}}})
    second = eventually(lambda: [j for j in job_names(cluster) if j != first], what="a second Job")[0]
    eventually(lambda: condition(cluster.get(POLICIES, "smollm2"), "Calibrated").get("reason") == "Calibrating")
    assert thresholds_in(cluster) == old
    assert policy(cluster)["status"]["thresholds"]["calibrationId"] == "cal-test"
    complete_job(cluster, second, compact_json(slower(smollm2_profile(), 2.0, "cal-one-thread")))
    new = eventually(lambda: (t := thresholds_in(cluster)) and t.calibration_id == "cal-one-thread" and t)
    # Half the prefill speed: about half the queued tokens fit in the same TTFT budget.
    assert new.classes[0].token_budget < 0.6 * old.classes[0].token_budget
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert policy(cluster)["status"]["calibration"]["id"] == "cal-one-thread"
    assert len(cluster.calls("POST", "jobs")) == 2


def test_without_on_rollout_only_the_annotation_recalibrates(cluster: Cluster, operator: KopfRunner) -> None:
    first = apply_and_calibrate(cluster, calibration={"onRollout": False})
    roll_out(cluster, ARGS_T1)
    stale = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Calibrated")).get("reason") == "Stale" and c
    )
    assert "onRollout is false" in stale["message"]
    settle("smollm2")
    assert job_names(cluster) == [first]
    assert thresholds_in(cluster).calibration_id == "cal-test"  # still in force, and said to be stale
    cluster.patch(POLICIES, "smollm2", {"metadata": {"annotations": {names.ANNOTATION_RECALIBRATE: "now"}}})
    second = current_job(cluster)
    assert second != first
    complete_job(cluster, second, compact_json(slower(smollm2_profile(), 2.0, "cal-asked-for")))
    eventually(lambda: status_of(cluster, "Calibrated") == "True")
    assert thresholds_in(cluster).calibration_id == "cal-asked-for"


def test_an_slo_the_server_cannot_meet_is_degraded(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    # 10 ms is below the measured fixed prefill cost (20 ms): no request could ever be admitted.
    cluster.create(POLICIES, admission_policy(slo={"ttftSeconds": 0.01}))
    (job,) = eventually(lambda: job_names(cluster))
    complete_job(cluster, job, compact_json(smollm2_profile()))
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "SLOUnattainable"
    assert "fixed prefill cost" in degraded["message"]
    assert thresholds_in(cluster) is None
    assert status_of(cluster, "Calibrated") == "True"  # the measurement is fine; the SLO is not
    # A reachable SLO derives from the stored profile, without measuring again.
    cluster.patch(POLICIES, "smollm2", {"spec": {"slo": {"ttftSeconds": 2.0}}})
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert len(cluster.calls("POST", "jobs")) == 1


def test_a_policy_created_again_adopts_its_configmap(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    old_uid = policy(cluster)["metadata"]["uid"]
    cluster.delete(POLICIES, "smollm2")
    eventually(lambda: cluster.get(POLICIES, "smollm2") is None)
    cluster.create(POLICIES, admission_policy())  # no garbage collector runs here: the ConfigMap is still there
    new_uid = eventually(lambda: policy(cluster)["metadata"]["uid"])
    assert new_uid != old_uid
    owners = eventually(
        lambda: (
            (o := cluster.get(CONFIGMAPS, "smollm2-thresholds")["metadata"]["ownerReferences"])[0]["uid"] == new_uid
            and o
        )
    )
    assert len(owners) == 1
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert len(cluster.calls("POST", "jobs")) == 1  # same container, same profile: not measured again
    # The gated pods' NetworkPolicy too (fence.py): adopted, not reported as another's.
    fence = cluster.get("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies", "smollm2-gate")
    assert [o["uid"] for o in fence["metadata"]["ownerReferences"]] == [new_uid]


def test_a_policy_change_rederives_without_measuring_again(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    before = thresholds_in(cluster)
    cluster.patch(POLICIES, "smollm2", {"spec": {"slo": {"ttftSeconds": 4.0}}})
    after = eventually(lambda: (t := thresholds_in(cluster)) and t != before and t)
    assert after.classes[0].ttft_budget_seconds == 4.0
    assert after.calibration_id == before.calibration_id
    assert len(cluster.calls("POST", "jobs")) == 1
    eventually(lambda: policy(cluster)["status"]["observedGeneration"] == 2)


# ------------------------------------------------------------------------------ selection and removal


def test_deleting_the_policy_takes_the_sidecar_out(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    original = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]  # as the API server stored it
    cluster.delete(DEPLOYMENTS, "smollm2")
    apply_and_calibrate(cluster)
    eventually(lambda: gate_of(cluster, "smollm2") is not None)
    cluster.delete(POLICIES, "smollm2")
    eventually(lambda: cluster.get(POLICIES, "smollm2") is None, what="the finalizer released")
    template = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]
    assert template == original


def test_a_selector_gates_every_matching_deployment_and_lets_go_of_others(
    cluster: Cluster, operator: KopfRunner
) -> None:
    for name in ("zone-a", "zone-b"):
        deployment = llama_deployment(name, labels={"model": "smollm2"})
        deployment["spec"]["template"]["spec"] = llama_deployment()["spec"]["template"]["spec"]
        cluster.create(DEPLOYMENTS, deployment)
    cluster.create(POLICIES, {**admission_policy("zones"), "spec": {"selector": {"matchLabels": {"model": "smollm2"}},
                                                                     "slo": {"ttftSeconds": 2}}})  # fmt: skip
    (job,) = eventually(lambda: job_names(cluster))  # same container: one calibration for both
    complete_job(cluster, job, compact_json(smollm2_profile()))
    for name in ("zone-a", "zone-b"):
        eventually(lambda n=name: gate_of(cluster, n) is not None)
    eventually(lambda: status_of(cluster, "Ready", "zones") == "True")
    assert policy(cluster, "zones")["status"]["targets"] == ["zone-a", "zone-b"]
    cluster.patch(DEPLOYMENTS, "zone-b", {"metadata": {"labels": {"model": "other"}}})
    eventually(lambda: gate_of(cluster, "zone-b") is None)
    assert gate_of(cluster, "zone-a") is not None
    # A selected Deployment with another container: one policy cannot calibrate two models.
    other = llama_deployment("zone-c", labels={"model": "smollm2"}, args=ARGS_T1)
    cluster.create(DEPLOYMENTS, other)
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "zones"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "TargetsDiffer"


def test_every_api_call_is_in_the_documented_rbac(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    roll_out(cluster, ARGS_T1)
    fail_job(cluster, current_job(cluster), "boom")
    eventually(lambda: len(cluster.calls("POST", "jobs")) == 3, what="retry after a delete")
    cluster.delete(POLICIES, "smollm2")
    eventually(lambda: cluster.get(POLICIES, "smollm2") is None)
    used = cluster.verbs(exclude_agent="Python-urllib")
    assert ("batch", "jobs", "delete") in used
    assert ("", "secrets", "create") in used
    missing = sorted(v for v in used if not rbac.allows(*v))
    assert missing == []


def test_a_selector_that_overlaps_another_policys_target_gates_the_rest_and_is_ready(
    cluster: Cluster, operator: KopfRunner
) -> None:
    """The review: such a policy stayed Invalid for ever (and so never Ready), though it could
    gate every other Deployment it selects."""
    for name in ("zone-a", "zone-b"):
        deployment = llama_deployment(name, labels={"model": "smollm2"})
        deployment["spec"]["template"]["spec"] = llama_deployment()["spec"]["template"]["spec"]
        cluster.create(DEPLOYMENTS, deployment)
    cluster.create(POLICIES, admission_policy("zone-a", sidecar={"inject": False}))  # zone-a's own policy
    eventually(lambda: job_names(cluster), what="zone-a's calibration Job")
    cluster.create(POLICIES, {**admission_policy("zones"), "spec": {"selector": {"matchLabels": {"model": "smollm2"}},
                                                                     "slo": {"ttftSeconds": 2}}})  # fmt: skip
    found = eventually(lambda: (p := policy(cluster, "zones")).get("status", {}).get("targets") == ["zone-b"] and p)
    assert any("zone-a is already gated by policy 'zone-a'" in note for note in found["status"]["notes"])
    for job in eventually(lambda: len(job_names(cluster)) == 2 and job_names(cluster), what="two Jobs"):
        complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready", "zones") == "True", what="the overlapping policy Ready")
    assert status_of(cluster, "Invalid", "zones") == "False"
    assert gate_of(cluster, "zone-b") is not None
    assert gate_of(cluster, "zone-a") is None  # zone-a's policy runs its own sidecar (inject: false)
