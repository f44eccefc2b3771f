"""What a real cluster does that plain kmock (what these tests first ran on) did not, one test
per defect of the issue "The operator on a real cluster" (each fails on commit ffda16c): probes the kubelet sends to the pod
IP, defaults the API server writes, volumes it validates, Secrets and ConfigMaps that are the
user's, claims between policies, ports that clash. ``cluster`` is a real kube-apiserver
(tests/api_cluster.py): it defaults, validates and enforces the operator's RBAC; the proxy in
front fails the test on a probe no kubelet could pass (tests/kubelet_lint.py)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kopf.testing import KopfRunner
from operator_flows import apply_and_calibrate, events, policy, status_of, thresholds_in

from api_cluster import CONFIGMAPS, DEPLOYMENTS, JOBS, NS, POLICIES, SECRETS, Cluster
from canned_profiles import smollm2_profile
from kopf_thread import settle
from kube_faults import Fault
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from slogate_calibration.output import compact_json
from slogate_operator import metrics, names
from workload_controllers import complete_job, create_pod, fail_job, gate_of, job_names, pending_job_pod

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread


def named_port(template: dict[str, Any], port_name: str) -> tuple[str, int] | None:
    """Where a Service's ``targetPort: <name>`` lands in a pod: (container, port), first container first."""
    for container in template["spec"]["containers"]:
        for port in container.get("ports") or ():
            if port.get("name") == port_name:
                return container["name"], port["containerPort"]
    return None


def failed_passes(name: str) -> float:
    """Reconcile passes of a policy that ended Degraded by a raised step."""
    value = metrics.REGISTRY.get_sample_value(
        "slogate_operator_reconciles_total", {"namespace": NS, "policy": name, "result": "error"}
    )
    return value or 0.0


def degraded(cluster: Cluster, name: str = "smollm2") -> dict[str, Any]:
    return eventually(
        lambda: (c := condition(cluster.get(POLICIES, name), "Degraded")).get("status") == "True" and c,
        what="Degraded=True",
    )


# ------------------------------------------------------------------------------ 1. the calibration Job's probe


def test_a_loopback_llama_server_is_calibrated_by_a_job_the_kubelet_can_run(
    cluster: Cluster, operator: KopfRunner
) -> None:
    """The documented ``--host 127.0.0.1``: a probe on the pod IP would never pass (the Job timed out
    for ever); the cluster fixture fails the test on any probe no kubelet could pass."""
    args = ["-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "127.0.0.1", "--port", "8080", "--metrics"]
    cluster.create(DEPLOYMENTS, llama_deployment(args=args))
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
    pod = cluster.get(JOBS, job)["spec"]["template"]["spec"]
    calibrator = pod["containers"][0]["args"]
    assert float(calibrator[calibrator.index("--wait-seconds") + 1]) > 0  # it waits for /health on loopback
    cluster.assert_kubelet_could_run()
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready") == "True")


# ------------------------------------------------------------------------------ 2 and 3. serving in every state


def test_a_failed_first_calibration_leaves_the_workload_serving_as_before(
    cluster: Cluster, operator: KopfRunner
) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    before = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster))
    fail_job(cluster, job, "slogate calibrate: error: stage 'prefill': upstream unreachable")
    assert degraded(cluster)["reason"] == "CalibrationFailed"
    settle("smollm2")
    template = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]
    assert template == before  # no sidecar, no rollout: the pods keep serving, ungated
    assert named_port(template, "http") == ("llama", 8080)
    notes = policy(cluster)["status"]["notes"]
    assert any("serves ungated until the first calibration" in note for note in notes)
    deployment = cluster.get(DEPLOYMENTS, "smollm2")
    assert deployment["metadata"]["annotations"][names.ANNOTATION_CLAIM] == "smollm2"  # claimed all the same


def test_the_services_port_name_reaches_the_gate_while_injected_and_llama_server_after_removal(
    cluster: Cluster, operator: KopfRunner
) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster))
    assert named_port(create_pod(cluster, "smollm2"), "http") == ("llama", 8080)
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(
        lambda: gate_of(cluster, "smollm2") is not None, what="the pods rolled onto the gate, once thresholds exist"
    )
    gated = create_pod(cluster, "smollm2", 1)
    assert named_port(gated, "http") == (names.SIDECAR_CONTAINER, 8081)  # the Service goes through the gate
    # The Deployment keeps the user's fields: the hand-over is the pod's.
    assert named_port(cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"], "http") == ("llama", 8080)
    cluster.delete(POLICIES, "smollm2")
    eventually(lambda: cluster.get(POLICIES, "smollm2") is None, what="the finalizer released")
    after = cluster.get(DEPLOYMENTS, "smollm2")
    assert gate_of(cluster, "smollm2") is None
    ungated = create_pod(cluster, "smollm2", 2)
    assert named_port(ungated, "http") == ("llama", 8080)  # and straight to llama-server again
    assert [c["name"] for c in ungated["spec"]["containers"]] == ["llama"]
    assert names.ANNOTATION_CLAIM not in (after["metadata"].get("annotations") or {})
    cluster.assert_kubelet_could_run()


# ------------------------------------------------------------------------------ 4. failures reach the status


def test_a_secret_without_its_token_is_degraded_with_a_warning(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    cluster.patch(SECRETS, "slogate-admin-token", {"data": {names.TOKEN_KEY: None, "other": "eA=="}})
    found = degraded(cluster)
    assert found["reason"] == "AdminTokenInvalid"
    assert "slogate-admin-token" in found["message"]
    assert status_of(cluster, "Ready") == "False"
    eventually(lambda: events(cluster, "AdminTokenInvalid"), what="a Warning event")
    assert policy(cluster)["status"]["thresholds"]["calibrationId"] == "cal-test"  # what is in force is still said


def test_a_job_the_api_server_refuses_is_degraded_with_its_message(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.faults.append(Fault("POST", "jobs", 422))
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    found = degraded(cluster)
    assert found["reason"] == "CalibrationJobRejected"
    assert "422" in found["message"]
    # The status is written before the event is posted: seeing one does not mean the other is there.
    rejected = eventually(lambda: events(cluster, "CalibrationJobRejected"), what="a CalibrationJobRejected event")
    assert [e["type"] for e in rejected] == ["Warning"]
    (job,) = eventually(lambda: job_names(cluster), what="the retry after the backoff")
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready") == "True")


# ------------------------------------------------------------------------------ 5. idempotent against defaults


def test_resyncs_against_a_defaulting_api_server_patch_nothing(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    eventually(lambda: gate_of(cluster, "smollm2") is not None)
    stored = create_pod(cluster, "smollm2")["spec"]["containers"][1]
    assert stored["name"] == names.SIDECAR_CONTAINER
    assert stored["terminationMessagePath"] == "/dev/termination-log"  # defaulted after the webhook's patch
    settle("smollm2", more=2)
    patches = len(cluster.calls("PATCH", "deployments"))
    settle("smollm2", more=5)
    assert len(cluster.calls("PATCH", "deployments")) == patches
    assert len(events(cluster, "SidecarInjected")) == 1


# ------------------------------------------------------------------------------ 6. Jobs a real API server accepts


def test_a_feeding_init_container_with_its_own_secret_gets_a_valid_job(cluster: Cluster, operator: KopfRunner) -> None:
    deployment = llama_deployment()
    spec = deployment["spec"]["template"]["spec"]
    spec["initContainers"][0]["volumeMounts"].append({"name": "hf-token", "mountPath": "/secrets", "readOnly": True})
    spec["volumes"].append({"name": "hf-token", "secret": {"secretName": "hf"}})
    cluster.create(DEPLOYMENTS, deployment)
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster), what="a Job the API server accepted")
    assert "hf-token" in {v["name"] for v in cluster.get(JOBS, job)["spec"]["template"]["spec"]["volumes"]}


def test_a_pending_calibration_pod_says_why_it_waits(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster))
    pending_job_pod(cluster, job, reason="Unschedulable", message="0/3 nodes are available: 3 Insufficient cpu.")
    waiting = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Calibrated")).get("reason") == "Unschedulable" and c
    )
    assert "Insufficient cpu" in waiting["message"]


# ------------------------------------------------------------------------------ 7. ownership


def test_inject_false_never_touches_the_users_own_sidecar(cluster: Cluster, operator: KopfRunner) -> None:
    deployment = llama_deployment()
    spec = deployment["spec"]["template"]["spec"]
    spec["containers"].append({"name": names.SIDECAR_CONTAINER, "image": "mine/slogate:1", "args": ["sidecar"]})
    spec["volumes"].append({"name": names.TMP_VOLUME, "emptyDir": {}})
    cluster.create(DEPLOYMENTS, deployment)
    cluster.create(POLICIES, admission_policy(sidecar={"inject": False}))
    (job,) = eventually(lambda: job_names(cluster))
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: thresholds_in(cluster) is not None)
    settle("smollm2")
    template = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]
    assert [c["name"] for c in template["containers"]] == ["llama", names.SIDECAR_CONTAINER]
    assert template["containers"][1]["image"] == "mine/slogate:1"
    assert names.TMP_VOLUME in {v["name"] for v in template["volumes"]}


def test_two_self_managed_policies_cannot_share_a_deployment(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    target = {"kind": "Deployment", "name": "smollm2"}
    cluster.create(POLICIES, admission_policy("first", targetRef=target, sidecar={"inject": False}))
    eventually(lambda: job_names(cluster), what="the first policy's Job")
    cluster.create(POLICIES, admission_policy("second", targetRef=target, sidecar={"inject": False}))
    invalid = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "second"), "Invalid")).get("status") == "True" and c
    )
    assert "already gated by policy 'first'" in invalid["message"]
    settle("second")
    assert len(job_names(cluster)) == 1  # the second never measures the first one's pods


def test_a_secret_and_configmap_the_user_made_stay_theirs(cluster: Cluster, operator: KopfRunner) -> None:
    token = base64.b64encode(b"users-own-token").decode()
    cluster.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "slogate-admin-token"},
                             "data": {names.TOKEN_KEY: token}})  # fmt: skip
    cluster.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "smollm2-thresholds"},
                                "data": {"app.conf": "mine"}})  # fmt: skip
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    assert degraded(cluster)["reason"] == "ConfigMapNotOurs"
    eventually(lambda: events(cluster, "ConfigMapNotOurs"), what="a Warning event")
    failed = failed_passes("smollm2")
    eventually(lambda: failed_passes("smollm2") >= failed + 2, what="two more passes, each refusing to touch it")
    configmap = cluster.get(CONFIGMAPS, "smollm2-thresholds")
    assert configmap["data"] == {"app.conf": "mine"}
    assert not configmap["metadata"].get("ownerReferences")
    assert not cluster.get(SECRETS, "slogate-admin-token")["metadata"].get("ownerReferences")


# ------------------------------------------------------------------------------ 8. RBAC


def test_a_conflicting_write_is_re_read_within_the_operators_rbac(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster))
    cluster.faults.append(Fault("PATCH", "deployments", 409))
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: gate_of(cluster, "smollm2") is not None, what="the gate, after a re-read")
    assert cluster.forbidden == []


# ------------------------------------------------------------------------------ 9. ports and notes


def test_a_llama_server_on_the_sidecars_port_is_refused(cluster: Cluster, operator: KopfRunner) -> None:
    args = ["-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port=8081", "--metrics"]
    deployment = llama_deployment(args=args)
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8081}]
    cluster.create(DEPLOYMENTS, deployment)
    cluster.create(POLICIES, admission_policy())
    invalid = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Invalid")).get("status") == "True" and c
    )
    assert "listens on 8081, the sidecar's spec.sidecar.port" in invalid["message"]
    settle("smollm2")
    assert job_names(cluster) == []
    assert gate_of(cluster, "smollm2") is None


def test_settings_the_operator_cannot_read_are_noted_in_the_status(cluster: Cluster, operator: KopfRunner) -> None:
    deployment = llama_deployment(args=["-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0"])
    deployment["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "LLAMA_ARG_THREADS", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "threads"}}}
    ]
    cluster.create(DEPLOYMENTS, deployment)
    cluster.create(POLICIES, admission_policy())
    notes = eventually(lambda: policy(cluster).get("status", {}).get("notes"), what="status.notes")
    text = " ".join(notes)
    assert "LLAMA_ARG_THREADS" in text
    assert "--metrics" in text


# ------------------------------------------------------------------------------ spec.sidecar settings, end to end


def test_the_policys_sidecar_settings_reach_the_injected_sidecars_command_line(
    cluster: Cluster, operator: KopfRunner
) -> None:
    """spec.sidecar's tunables go through a whole reconcile into the injected container's args
    (the builder alone was tested; the pass once built the config without them)."""
    sidecar = {"classHeader": "X-Tenant-Tier", "clientReadTimeoutSeconds": 12.5}
    apply_and_calibrate(cluster, sidecar=sidecar)

    def injected_args() -> list[str] | None:
        if gate_of(cluster, "smollm2") is None:
            return None
        found = [
            c for c in create_pod(cluster, "smollm2")["spec"]["containers"] if c["name"] == names.SIDECAR_CONTAINER
        ]
        return list(found[0].get("args") or ()) if found else None

    args = eventually(injected_args, what="the injected sidecar")
    assert args[args.index("--class-header") + 1] == "X-Tenant-Tier"
    assert float(args[args.index("--client-read-timeout") + 1]) == 12.5
    assert "--upstream-read-timeout" not in args  # unset: the sidecar's own default
