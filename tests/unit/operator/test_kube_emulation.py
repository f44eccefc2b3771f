"""The emulated API server (tests/kube_emulation.py) behaves like kube-apiserver where the
operator's correctness depends on it. Every test goes through HTTP with the Cluster's
client (or a watch stream on the cluster's loop); only the RBAC conflict case runs the
operator. Each assertion would fail against plain kmock."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from kopf.testing import KopfRunner

from emulated_cluster import DEPLOYMENTS, JOBS, NS, PODS, POLICIES, ApiError, Cluster
from kopf_thread import settle
from kube_defaults import check_go_defaults, schema_defaults
from kube_faults import Fault
from manifests import admission_policy, llama_deployment
from polling import eventually
from workload_controllers import write_deployment_status

OPERATOR = "slogate-operator/0.1"
LOOPBACK_ARGS = ["-m", "/model/m.gguf", "--host", "127.0.0.1", "--port", "8080"]


class Watch:
    """A watch stream read on the cluster's loop; ``events`` fills as they arrive."""

    def __init__(self, cluster: Cluster, path: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._future = asyncio.run_coroutine_threadsafe(self._read(cluster.url + path), cluster.loop.loop)

    async def _read(self, url: str) -> None:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            async for line in response.content:
                if line.strip():
                    self.events.append(json.loads(line))

    def seen(self) -> list[tuple[str, str]]:
        return [(e["type"], e["object"]["metadata"]["name"]) for e in list(self.events)]

    def close(self) -> None:
        self._future.cancel()


@pytest.fixture
def watches(cluster: Cluster) -> Iterator[list[Watch]]:
    opened: list[Watch] = []
    yield opened
    for watch in opened:
        watch.close()


def probed(name: str, args: list[str], probe: str = "readinessProbe", port: object = 8080) -> dict[str, Any]:
    deployment = llama_deployment(name, args=args)
    deployment["spec"]["template"]["spec"]["containers"][0][probe] = {"httpGet": {"path": "/health", "port": port}}
    return deployment


def refusal(error: ApiError) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


# ------------------------------------------------------------------------------ defaulting


def test_builtin_defaults_are_set_on_create_and_again_after_each_patch(cluster: Cluster) -> None:
    deployment = probed("smollm2", llama_deployment()["spec"]["template"]["spec"]["containers"][0]["args"])
    spec = deployment["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "cfg", "configMap": {"name": "cfg"}})
    spec["containers"][0]["image"] = "ghcr.io/ggml-org/llama.cpp"  # untagged: pulled always
    original_template = copy.deepcopy(deployment["spec"]["template"])
    created = cluster.create(DEPLOYMENTS, deployment)["spec"]
    assert created["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
    }
    assert (created["revisionHistoryLimit"], created["progressDeadlineSeconds"]) == (10, 600)
    pod = created["template"]["spec"]
    assert {k: pod[k] for k in ("restartPolicy", "dnsPolicy", "schedulerName", "securityContext")} == {
        "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
        "securityContext": {},
    }  # fmt: skip
    assert pod["terminationGracePeriodSeconds"] == 30
    llama, model = pod["containers"][0], pod["initContainers"][0]
    assert llama["imagePullPolicy"] == "Always"
    assert model["imagePullPolicy"] == "IfNotPresent"  # tagged :0.1.2
    for container in (llama, model):
        assert (container["terminationMessagePath"], container["terminationMessagePolicy"]) == (
            "/dev/termination-log",
            "File",
        )
    assert llama["ports"][0]["protocol"] == "TCP"
    assert llama["readinessProbe"] == {"httpGet": {"path": "/health", "port": 8080, "scheme": "HTTP"}, "timeoutSeconds": 1,
                                       "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}  # fmt: skip
    assert pod["volumes"] == [
        {"name": "model", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 420}},
    ]

    # A JSON patch putting the undefaulted template back: the server defaults it again.
    replaced = cluster.json_patch(
        DEPLOYMENTS, "smollm2", [{"op": "replace", "path": "/spec/template", "value": original_template}]
    )
    assert replaced["spec"]["template"] == created["template"]
    # A merge patch replacing the containers list: its new container is defaulted too.
    containers = [{"name": "llama", "image": "llama:b5000", "args": ["--host", "0.0.0.0"]}]
    merged = cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"template": {"spec": {"containers": containers}}}})
    (only,) = merged["spec"]["template"]["spec"]["containers"]
    assert (only["imagePullPolicy"], only["terminationMessagePath"], only["resources"]) == (
        "IfNotPresent",
        "/dev/termination-log",
        {},
    )


def test_job_and_pod_defaults(cluster: Cluster) -> None:
    template = llama_deployment()["spec"]["template"]
    template["spec"]["restartPolicy"] = "Never"
    job = cluster.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"},
                                "spec": {"template": template}})  # fmt: skip
    assert {k: job["spec"][k] for k in ("completions", "parallelism", "backoffLimit", "completionMode", "suspend")} == {
        "completions": 1, "parallelism": 1, "backoffLimit": 6, "completionMode": "NonIndexed", "suspend": False,
    }  # fmt: skip
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # what a Job's template sets stays
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert job["spec"]["template"]["metadata"]["labels"]["job-name"] == "once"
    assert job["metadata"]["labels"] == {"app": "smollm2"}  # a Job without labels takes its template's
    pod = cluster.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "once-"},
                                "spec": template["spec"], "status": {"phase": "Running"}})  # fmt: skip
    assert pod["metadata"]["name"].startswith("once-")
    assert pod["metadata"]["name"] != "once-"
    assert pod["spec"]["enableServiceLinks"] is True
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    assert pod["status"] == {"phase": "Pending", "qosClass": "Burstable"}  # a create sets no status


def test_the_openapi_schemas_declare_no_builtin_default_and_the_hand_list_names_real_fields() -> None:
    # If a newer kubernetes-validate ships defaults, the walker applies them already: then
    # drop the hand-listed entries they cover (this fails to say so).
    assert schema_defaults() == []
    assert check_go_defaults() == []


def test_a_custom_resource_gets_its_schema_defaults_and_loses_unknown_fields(cluster: Cluster) -> None:
    body = admission_policy(calibration={}, sidecar={"port": 9000}, unknownField=1)
    body["status"] = {"pushed": "1/1"}
    created = cluster.create(POLICIES, body)
    assert created["spec"]["calibration"] == {"onRollout": True, "timeoutSeconds": 300, "budgetSeconds": 90}
    assert created["spec"]["sidecar"] == {"port": 9000, "inject": True, "adminPort": 8082, "promptCounting": "tokenize"}
    assert created["spec"]["slo"] == {"ttftSeconds": 2.0, "quantile": 0.99}
    assert created["spec"]["targetRef"]["apiVersion"] == "apps/v1"
    assert "unknownField" not in created["spec"]
    assert "status" not in created  # the status subresource: a create sets none
    status = cluster.patch(POLICIES, "smollm2", {"status": {"pushed": "0/1", "invented": True}}, sub="status")["status"]
    assert status == {"pushed": "0/1"}  # pruned: a field the CRD does not declare is dropped


# ------------------------------------------------------------------------------ RBAC


def test_an_operator_call_outside_its_rbac_is_forbidden_one_inside_is_served(cluster: Cluster) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    path = DEPLOYMENTS.format(ns=NS)
    assert cluster.request("GET", path, agent=OPERATOR)["items"]  # list: granted
    with pytest.raises(ApiError) as refused:
        cluster.request("DELETE", f"{path}/smollm2", agent=OPERATOR)
    assert refused.value.status == 403
    body = refusal(refused.value)
    assert body["reason"] == "Forbidden"
    assert body["message"] == ('deployments.apps "smollm2" is forbidden: User "system:serviceaccount:slogate:slogate" '
                               'cannot delete resource "deployments" in API group "apps" in the namespace "llm"')  # fmt: skip
    with pytest.raises(ApiError) as status_write:
        cluster.request(
            "PATCH", f"{path}/smollm2/status", {"status": {}}, "application/merge-patch+json", agent="kopf/1.45"
        )
    assert 'cannot patch resource "deployments/status"' in refusal(status_write.value)["message"]
    assert [(r.verb, r.resource, r.agent) for r in cluster.forbidden] == [
        ("delete", "deployments", OPERATOR), ("patch", "deployments/status", "kopf/1.45"),
    ]  # fmt: skip
    assert cluster.get(DEPLOYMENTS, "smollm2") is not None  # the test's own client is not the operator
    cluster.delete(DEPLOYMENTS, "smollm2")


@pytest.mark.kopf_thread
def test_a_conflicting_deployment_patch_is_reread_within_the_operators_rbac(
    cluster: Cluster, operator: KopfRunner
) -> None:
    """targets.apply_template re-reads a Deployment (GET) after a 409: the Role must grant it."""
    conflict = Fault("PATCH", "deployments", 409)
    cluster.emulator.faults.append(conflict)
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


# ------------------------------------------------------------------------------ spec and status


def test_a_main_patch_ignores_status_and_a_status_patch_changes_only_status(cluster: Cluster) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    main = cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"replicas": 3}, "status": {"replicas": 3}})
    assert main["spec"]["replicas"] == 3
    assert main["status"] == {}
    assert main["metadata"]["generation"] == 2
    status = cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"replicas": 5}, "status": {"replicas": 3}}, sub="status")
    assert status["status"] == {"replicas": 3}
    assert status["spec"]["replicas"] == 3
    assert status["metadata"]["generation"] == 2
    assert int(status["metadata"]["resourceVersion"]) > int(main["metadata"]["resourceVersion"])


def test_a_status_write_is_a_watch_event_without_a_new_generation(cluster: Cluster, watches: list[Watch]) -> None:
    created = cluster.create(DEPLOYMENTS, llama_deployment(replicas=2))
    watch = Watch(cluster, DEPLOYMENTS.format(ns=NS) + "?watch=true")
    watches.append(watch)
    eventually(lambda: watch.seen() == [("ADDED", "smollm2")])
    written = write_deployment_status(cluster, "smollm2", ready_replicas=1)
    event = eventually(lambda: len(watch.events) == 2 and watch.events[1])
    assert event["type"] == "MODIFIED"
    assert event["object"]["status"]["readyReplicas"] == 1
    assert event["object"]["status"]["observedGeneration"] == 1
    assert event["object"]["status"]["unavailableReplicas"] == 1
    assert event["object"]["spec"] == created["spec"]
    assert written["metadata"]["generation"] == created["metadata"]["generation"]
    assert written["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]


def test_a_no_op_patch_keeps_the_resource_version_and_sends_no_event(cluster: Cluster, watches: list[Watch]) -> None:
    created = cluster.create(DEPLOYMENTS, llama_deployment())
    watch = Watch(cluster, DEPLOYMENTS.format(ns=NS) + "?watch=true")
    watches.append(watch)
    eventually(lambda: watch.seen() == [("ADDED", "smollm2")])
    # The template as sent at first (no defaults): the stored object does not change.
    same = cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"template": llama_deployment()["spec"]["template"]}})
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"labels": {"team": "ml"}}})  # a real change
    eventually(lambda: watch.seen() == [("ADDED", "smollm2"), ("MODIFIED", "smollm2")])
    assert watch.events[1]["object"]["metadata"]["labels"]["team"] == "ml"


def test_failed_preconditions_are_422_and_409(cluster: Cluster) -> None:
    created = cluster.create(DEPLOYMENTS, llama_deployment())
    version = created["metadata"]["resourceVersion"]
    cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"labels": {"team": "ml"}}})
    with pytest.raises(ApiError) as failed_test:
        cluster.json_patch(DEPLOYMENTS, "smollm2", [{"op": "test", "path": "/metadata/resourceVersion", "value": version},
                                                    {"op": "replace", "path": "/spec/replicas", "value": 2}])  # fmt: skip
    assert failed_test.value.status == 422
    with pytest.raises(ApiError) as stale:
        cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"resourceVersion": version}, "spec": {"replicas": 2}})
    assert stale.value.status == 409
    assert "the object has been modified" in str(stale.value)
    with pytest.raises(ApiError) as taken:
        cluster.create(DEPLOYMENTS, llama_deployment())
    assert (taken.value.status, refusal(taken.value)["reason"]) == (409, "AlreadyExists")


# ------------------------------------------------------------------------------ selectors


def names_of(items: list[dict[str, Any]]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


@pytest.fixture
def three(cluster: Cluster) -> Cluster:
    for name, labels in (("a", {"tier": "gpu", "team": "ml"}), ("b", {"tier": "cpu"}), ("c", {})):
        cluster.create(DEPLOYMENTS, llama_deployment(name, labels=labels))
    return cluster


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=gpu", ["a"]),
        ("tier==cpu", ["b"]),
        ("tier!=gpu", ["b", "c"]),  # an absent key matches !=
        ("tier in (gpu, cpu)", ["a", "b"]),
        ("tier notin (gpu)", ["b", "c"]),
        ("team", ["a"]),
        ("!team", ["b", "c"]),
        ("tier,!team", ["b"]),
        ("app=a,tier=gpu", ["a"]),
    ],
)
def test_a_label_selector_filters_a_list(three: Cluster, selector: str, expected: list[str]) -> None:
    assert names_of(three.list(DEPLOYMENTS, labels=selector)) == expected


def test_a_field_selector_filters_by_name_and_a_bad_selector_is_400(three: Cluster) -> None:
    found = three.request("GET", DEPLOYMENTS.format(ns=NS) + "?fieldSelector=metadata.name%3Db")
    assert names_of(found["items"]) == ["b"]
    assert found["kind"] == "DeploymentList"
    with pytest.raises(ApiError) as bad:
        three.list(DEPLOYMENTS, labels="tier in gpu")
    assert bad.value.status == 400
    assert names_of(three.list(DEPLOYMENTS, ns="other")) == []


def test_a_label_selector_filters_a_watch_stream(three: Cluster, watches: list[Watch]) -> None:
    watch = Watch(three, DEPLOYMENTS.format(ns=NS) + "?watch=true&labelSelector=tier%3Dgpu")
    watches.append(watch)
    eventually(lambda: watch.seen() == [("ADDED", "a")])
    three.patch(DEPLOYMENTS, "b", {"metadata": {"labels": {"team": "x"}}})  # not selected before or after
    three.patch(DEPLOYMENTS, "c", {"metadata": {"labels": {"tier": "gpu"}}})  # starts matching
    three.patch(DEPLOYMENTS, "a", {"metadata": {"labels": {"tier": "cpu"}}})  # stops matching
    three.create(DEPLOYMENTS, llama_deployment("d", labels={"tier": "gpu"}))
    three.delete(DEPLOYMENTS, "d")
    expected = [("ADDED", "a"), ("ADDED", "c"), ("DELETED", "a"), ("ADDED", "d"), ("DELETED", "d")]
    eventually(lambda: watch.seen() == expected, what=f"{expected}, seen {watch.seen()}")


# ------------------------------------------------------------------------------ pod spec validation


def test_a_mount_of_an_undeclared_volume_is_invalid(cluster: Cluster) -> None:
    deployment = llama_deployment()
    deployment["spec"]["template"]["spec"]["initContainers"][0]["volumeMounts"] = [
        {"name": "hf-token", "mountPath": "/t"}
    ]
    with pytest.raises(ApiError) as invalid:
        cluster.create(DEPLOYMENTS, deployment)
    assert invalid.value.status == 422
    body = refusal(invalid.value)
    assert body["reason"] == "Invalid"
    assert body["message"] == ('Deployment.apps "smollm2" is invalid: '
                               'spec.template.spec.initContainers[0].volumeMounts[0].name: Not found: "hf-token"')  # fmt: skip
    assert cluster.get(DEPLOYMENTS, "smollm2") is None
    # On a patch too, and the stored object stays as it was.
    cluster.create(DEPLOYMENTS, llama_deployment())
    with pytest.raises(ApiError) as patched:
        cluster.json_patch(
            DEPLOYMENTS, "smollm2", [{"op": "replace", "path": "/spec/template/spec/volumes", "value": []}]
        )
    assert patched.value.status == 422
    assert (
        'spec.template.spec.containers[0].volumeMounts[0].name: Not found: "model"' in refusal(patched.value)["message"]
    )
    assert cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["volumes"] == [
        {"name": "model", "emptyDir": {}}
    ]


def test_duplicate_container_names_and_a_job_restarting_always_are_invalid(cluster: Cluster) -> None:
    deployment = llama_deployment()
    deployment["spec"]["template"]["spec"]["initContainers"][0]["name"] = "llama"
    with pytest.raises(ApiError) as duplicate:
        cluster.create(DEPLOYMENTS, deployment)
    assert 'spec.template.spec.containers[0].name: Duplicate value: "llama"' in refusal(duplicate.value)["message"]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"template": llama_deployment()["spec"]["template"]},
    }
    with pytest.raises(ApiError) as always:
        cluster.create(JOBS, job)  # restartPolicy defaults to Always, which a Job may not have
    assert 'spec.template.spec.restartPolicy: Unsupported value: "Always"' in refusal(always.value)["message"]


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
    for made in (strict, lenient):
        made.create(DEPLOYMENTS, probed("loopback", LOOPBACK_ARGS))
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
