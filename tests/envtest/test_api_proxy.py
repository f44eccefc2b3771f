"""The tests' view of the real API server (tests/api_cluster.py, tests/api_proxy.py): the
operator's requests are the operator's ServiceAccount's (the real server's RBAC verdicts on
slogate_operator.rbac's table), injected faults are met, calls are counted per agent, and a
pod spec no kubelet could run fails the test that stored it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kopf.testing import KopfRunner

from api_cluster import DEPLOYMENTS, JOBS, NS, POLICIES, SECRETS, ApiError, Cluster
from kopf_thread import settle
from kube_faults import Fault
from manifests import admission_policy, llama_deployment
from polling import eventually

OPERATOR = "slogate-operator/0.1"
LOOPBACK_ARGS = ["-m", "/model/m.gguf", "--host", "127.0.0.1", "--port", "8080"]


def probed(name: str, args: list[str], probe: str = "readinessProbe", port: object = 8080) -> dict[str, Any]:
    deployment = llama_deployment(name, args=args)
    deployment["spec"]["template"]["spec"]["containers"][0][probe] = {"httpGet": {"path": "/health", "port": port}}
    return deployment


def refusal(error: ApiError) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


# ------------------------------------------------------------------------------ RBAC, the server's


def test_an_operator_call_outside_its_rbac_is_forbidden_one_inside_is_served(cluster: Cluster) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    path = DEPLOYMENTS.format(ns=NS)
    assert cluster.request("GET", path, agent=OPERATOR)["items"]  # list: granted
    with pytest.raises(ApiError) as refused:
        cluster.request("DELETE", f"{path}/smollm2", agent=OPERATOR)
    assert refused.value.status == 403
    body = refusal(refused.value)
    assert body["reason"] == "Forbidden"
    assert body["message"] == ('deployments.apps "smollm2" is forbidden: User "system:serviceaccount:slogate-system:slogate-operator" '
                               'cannot delete resource "deployments" in API group "apps" in the namespace "llm"')  # fmt: skip
    with pytest.raises(ApiError) as status_write:
        cluster.request(
            "PATCH", f"{path}/smollm2/status", {"status": {}}, "application/merge-patch+json", agent="kopf/1.45"
        )
    assert 'cannot patch resource "deployments/status"' in refusal(status_write.value)["message"]
    assert [(r.verb, r.resource, r.agent) for r in cluster.forbidden] == [
        ("delete", "deployments", OPERATOR), ("patch", "deployments/status", "kopf/1.45"),
    ]  # fmt: skip
    # Secrets: only the admin token, by name (a user's Secret in the same namespace is refused).
    cluster.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a-users-secret"}})
    with pytest.raises(ApiError) as users_secret:
        cluster.request("GET", f"{SECRETS.format(ns=NS)}/a-users-secret", agent=OPERATOR)
    assert users_secret.value.status == 403
    assert (cluster.forbidden[-1].verb, cluster.forbidden[-1].resource) == ("get", "secrets")
    assert cluster.get(DEPLOYMENTS, "smollm2") is not None  # the test's own client is not the operator
    cluster.delete(DEPLOYMENTS, "smollm2")


@pytest.mark.kopf_thread
def test_a_conflicting_deployment_patch_is_reread_within_the_operators_rbac(
    cluster: Cluster, operator: KopfRunner
) -> None:
    """targets.apply_template re-reads a Deployment (GET) after a 409: the Role must grant it."""
    conflict = Fault("PATCH", "deployments", 409)
    cluster.faults.append(conflict)
    created = cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    eventually(
        lambda: (
            conflict.times == 0
            and cluster.get(DEPLOYMENTS, "smollm2")["metadata"]["resourceVersion"]
            != created["metadata"]["resourceVersion"]
        ),
        what="the operator's Deployment write landing after the conflict",
    )
    settle("smollm2")
    assert cluster.api_calls()["get", "deployments"] >= 1  # the re-read happened
    assert cluster.forbidden == []


# ------------------------------------------------------------------------------ what the kubelet meets


def test_a_probe_on_llama_server_bound_to_loopback_is_a_kubelet_problem(cluster: Cluster) -> None:
    cluster.allow_kubelet_problems()
    cluster.create(DEPLOYMENTS, probed("loopback", LOOPBACK_ARGS))
    (problem,) = cluster.kubelet_problems
    assert (problem.kind, problem.name, problem.container, problem.probe) == (
        "Deployment",
        "llm/loopback",
        "llama",
        "readinessProbe",
    )
    assert "127.0.0.1" in problem.why
    with pytest.raises(AssertionError, match="readinessProbe"):
        cluster.assert_kubelet_could_run()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--host", "0.0.0.0", "--port", "8080"], []),
        (["--host=0.0.0.0"], []),  # port 8080 by default
        ([], [{"name": "LLAMA_ARG_HOST", "value": "0.0.0.0"}]),
    ],
    ids=["flags", "equals form", "environment"],
)
def test_a_probe_on_llama_server_bound_to_all_interfaces_is_fine(
    cluster: Cluster, args: list[str], env: list[dict[str, str]]
) -> None:
    deployment = probed("open", ["-m", "/model/m.gguf", *args], port="http")
    deployment["spec"]["template"]["spec"]["containers"][0]["env"] = env
    cluster.create(DEPLOYMENTS, deployment)
    assert cluster.kubelet_problems == []
    cluster.assert_kubelet_could_run()


def test_a_calibration_job_probing_its_loopback_llama_server_is_a_kubelet_problem(cluster: Cluster) -> None:
    """The shape of a calibration Job whose llama-server copy kept a startup probe: the
    server listens on 127.0.0.1 (so the gate cannot be bypassed), the kubelet probes the pod IP."""
    cluster.allow_kubelet_problems()
    llama = llama_deployment(args=LOOPBACK_ARGS)["spec"]["template"]["spec"]["containers"][0]
    server = llama | {"restartPolicy": "Always", "startupProbe": {"httpGet": {"path": "/health", "port": 8080}}}
    calibrator = {"name": "calibrator", "image": "slogate:test", "command": ["slogate"], "args": ["calibrate"],
                  "volumeMounts": [{"name": "model", "mountPath": "/model", "readOnly": True}]}  # fmt: skip
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "smollm2-cal"}, "spec": {"template": {
        "spec": {"restartPolicy": "Never", "initContainers": [server], "containers": [calibrator],
                 "volumes": [{"name": "model", "emptyDir": {}}]},
    }}}  # fmt: skip
    cluster.create(JOBS, job)
    assert [(p.kind, p.container, p.probe) for p in cluster.kubelet_problems] == [("Job", "llama", "startupProbe")]


def test_a_sidecar_probe_follows_the_sidecars_own_host(cluster: Cluster) -> None:
    cluster.allow_kubelet_problems()
    for name, host in (("open", ["--host", "0.0.0.0"]), ("closed", [])):
        deployment = llama_deployment(name, args=LOOPBACK_ARGS)
        deployment["spec"]["template"]["spec"]["containers"].append({
            "name": "slogate", "image": "slogate:test", "command": ["slogate"],
            "args": ["sidecar", *host, "--port", "8081", "--admin-port", "8082"],
            "ports": [{"name": "slogate-http", "containerPort": 8081}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "slogate-http"}},
            "livenessProbe": {"tcpSocket": {"port": 8082}},
        })  # fmt: skip
        cluster.create(DEPLOYMENTS, deployment)
    assert [(p.name, p.probe) for p in cluster.kubelet_problems] == [
        ("llm/closed", "livenessProbe"), ("llm/closed", "readinessProbe"),
    ]  # fmt: skip


def test_close_fails_on_kubelet_problems_unless_allowed() -> None:
    strict, lenient = Cluster(), Cluster()
    for made, name in ((strict, "loopback"), (lenient, "loopback-too")):
        made.create(DEPLOYMENTS, probed(name, LOOPBACK_ARGS))
    lenient.allow_kubelet_problems()
    lenient.close()
    with pytest.raises(AssertionError, match="llm/loopback"):
        strict.close()


# ------------------------------------------------------------------------------ counting calls


def test_api_calls_counts_one_agents_calls_between_two_marks(cluster: Cluster) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    path = DEPLOYMENTS.format(ns=NS)
    cluster.request("GET", path, agent=OPERATOR)
    start = cluster.call_mark()
    cluster.request("GET", path, agent=OPERATOR)
    cluster.request("GET", path, agent=OPERATOR)
    cluster.request("PATCH", f"{path}/smollm2", {"metadata": {"labels": {"x": "y"}}}, "application/merge-patch+json",
                    agent=OPERATOR)  # fmt: skip
    cluster.request("GET", path, agent="kopf/1.45")
    cluster.list(DEPLOYMENTS)
    end = cluster.call_mark()
    cluster.request("GET", path, agent=OPERATOR)
    assert cluster.api_calls(start, end) == {("list", "deployments"): 2, ("patch", "deployments"): 1}
    assert cluster.api_calls(start, end, agent="kopf/") == {("list", "deployments"): 1}
    assert cluster.api_calls()[("list", "deployments")] == 4
