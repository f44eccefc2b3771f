"""What the injection adds so that a pod stops without losing a stream (operator/stopping.py):
the drain hook on the llama.cpp container, the sidecar's preStop sleep, the grace period and
the sidecar's drain deadline derived from it; valid for kubernetes-validate, for the real API
server and for the kubelet's reach (tests/kubelet_lint.py); removal gives back the pod's own
values; a user's longer grace period, own preStop hook and later edits are respected. Also
what the real API server refuses of lifecycle hooks and grace periods."""

from __future__ import annotations

import base64
import copy
import dataclasses
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kopf.testing import KopfRunner

from api_cluster import DEPLOYMENTS, NS, POLICIES, SECRETS, ApiError, Cluster
from canned_profiles import smollm2_profile
from injected_sidecar import sidecar_settings
from kubelet_lint import kubelet_problems
from manifests import admission_policy, llama_deployment
from polling import eventually
from slogate_admission import drain_token
from slogate_calibration.output import compact_json
from slogate_operator import builders, names, stopping
from slogate_operator.fingerprint import container_fingerprint, llama_container
from slogate_operator.injection import injected_template, removed_template, template_patch
from slogate_operator.sidecar import SidecarConfig
from slogate_sidecar.settings import SidecarSettings
from workload_controllers import complete_job, create_pod, gate_of, job_names

K8S = "1.33.0"
CONFIG = SidecarConfig(policy="smollm2", image="slogate:0.1.0", port=8081, admin_port=8082, upstream_port=8080,
                       prompt_counting="tokenize", token_secret="slogate-admin-token")  # fmt: skip
DRAIN_HOOK = {"httpGet": {"path": "/slogate/v1/drain", "port": 8082}}
USERS_HOOK = {"exec": {"command": ["sh", "-c", "sleep 3"]}}


def deployment(grace: int | None = None, lifecycle: dict[str, Any] | None = None) -> dict[str, Any]:
    made = llama_deployment()
    made["metadata"] |= {"namespace": "llm", "resourceVersion": "7"}
    spec = made["spec"]["template"]["spec"]
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if lifecycle is not None:
        spec["containers"][0]["lifecycle"] = copy.deepcopy(lifecycle)
    return made


def injected(dep: dict[str, Any], config: SidecarConfig = CONFIG) -> dict[str, Any]:
    after = copy.deepcopy(dep)
    after["spec"]["template"] = injected_template(dep["spec"]["template"], config)
    return after


def removed(dep: dict[str, Any]) -> dict[str, Any]:
    after = copy.deepcopy(dep)
    after["spec"]["template"] = removed_template(dep["spec"]["template"])
    return after


def pod_of(dep: dict[str, Any] | None) -> dict[str, Any]:
    assert dep is not None
    spec: dict[str, Any] = dep["spec"]["template"]["spec"]
    return spec


def drain_deadline(container: dict[str, Any]) -> str:
    args = container["args"]
    return str(args[args.index("--drain-deadline") + 1])


# ------------------------------------------------------------------------------ what is injected


def test_the_injected_pod_drains_before_llama_server_stops(cluster: Cluster, tmp_path: Path) -> None:
    dep = injected(deployment())
    kubernetes_validate.validate(dep, K8S, strict=True)
    spec = pod_of(dep)
    llama, sidecar = spec["containers"]
    assert llama["lifecycle"] == {"preStop": DRAIN_HOOK}  # by number: a name would be llama's own ports'
    assert sidecar["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    assert spec["terminationGracePeriodSeconds"] == 30
    assert drain_deadline(sidecar) == "25"
    assert sidecar_settings(sidecar, tmp_path).drain_deadline_s == 25.0
    # Both checks a real cluster makes: the API server's validation, the kubelet's reach.
    dep["metadata"].pop("resourceVersion", None)
    cluster.ensure_namespace(NS)
    cluster.request("POST", DEPLOYMENTS.format(ns=NS) + "?dryRun=All", dep)  # accepted: no ApiError
    assert kubelet_problems("Deployment", "llm/smollm2", spec) == []


def test_the_operators_default_deadline_is_the_sidecars_own() -> None:
    """Stated twice (the sidecar runs alone too): held equal here."""
    default = SidecarSettings(upstream="http://127.0.0.1:8080").drain_deadline_s
    assert stopping.drain_deadline(stopping.GRACE_SECONDS) == default
    assert stopping.SIDECAR_STOP_DELAY_SECONDS <= stopping.DRAIN_MARGIN_SECONDS


@pytest.mark.parametrize(
    ("grace", "kept", "deadline"),
    [(None, 30, "25"), (0, 30, "25"), (10, 30, "25"), (30, 30, "25"), (120, 120, "115")],
    ids=["unset", "zero", "shorter", "the default", "longer"],
)
def test_a_longer_grace_period_is_kept_and_lengthens_the_drain(grace: int | None, kept: int, deadline: str) -> None:
    dep = injected(deployment(grace=grace))
    kubernetes_validate.validate(dep, K8S, strict=True)
    assert pod_of(dep)["terminationGracePeriodSeconds"] == kept
    assert drain_deadline(pod_of(dep)["containers"][1]) == deadline
    assert removed(dep)["spec"]["template"] == deployment(grace=grace)["spec"]["template"]  # the pod's own again


def test_a_preStop_of_the_users_own_is_kept_and_gets_no_drain_hook() -> None:  # noqa: N802 - the field's name
    dep = injected(deployment(lifecycle={"preStop": USERS_HOOK}))
    assert pod_of(dep)["containers"][0]["lifecycle"] == {"preStop": USERS_HOOK}
    assert removed(dep)["spec"]["template"] == deployment(lifecycle={"preStop": USERS_HOOK})["spec"]["template"]


def test_a_postStart_of_the_users_own_stays_beside_the_drain_hook() -> None:  # noqa: N802 - the field's name
    own = {"postStart": USERS_HOOK}
    dep = injected(deployment(lifecycle=own))
    assert pod_of(dep)["containers"][0]["lifecycle"] == {"postStart": USERS_HOOK, "preStop": DRAIN_HOOK}
    assert removed(dep)["spec"]["template"] == deployment(lifecycle=own)["spec"]["template"]


def test_the_users_edits_while_injected_survive_reinjection_and_removal() -> None:
    dep = injected(deployment())
    pod_of(dep)["terminationGracePeriodSeconds"] = 90  # the user lengthens it while gated
    again = injected(dep)
    assert pod_of(again)["terminationGracePeriodSeconds"] == 90
    assert drain_deadline(pod_of(again)["containers"][1]) == "85"
    assert template_patch(dep, again["spec"]["template"]) != []  # the sidecar's deadline follows
    assert pod_of(removed(again))["terminationGracePeriodSeconds"] == 90  # theirs, not ours to take back
    pod_of(again)["containers"][0]["lifecycle"] = {"preStop": USERS_HOOK}  # and replaces our hook
    assert pod_of(removed(again))["containers"][0]["lifecycle"] == {"preStop": USERS_HOOK}


def test_the_template_stored_with_the_servers_defaults_needs_no_patch() -> None:
    dep = injected(deployment())
    stored = copy.deepcopy(dep)
    pod_of(stored)["containers"][0]["lifecycle"]["preStop"]["httpGet"]["scheme"] = "HTTP"
    assert template_patch(stored, injected_template(stored["spec"]["template"], CONFIG)) == []
    moved = injected_template(stored["spec"]["template"], dataclasses.replace(CONFIG, admin_port=9002))
    assert pod_of({"spec": {"template": moved}})["containers"][0]["lifecycle"]["preStop"]["httpGet"]["port"] == 9002
    assert template_patch(stored, moved) != []


def test_the_calibration_job_copies_llama_server_without_its_hooks() -> None:
    """The drain hook names a sidecar the Job's pod does not have: the kubelet would fail it at every stop."""
    dep = injected(deployment())
    llama = llama_container(pod_of(dep), "llama")
    request = builders.CalibrationRequest(
        policy=builders.PolicyRef("smollm2", "llm", "0f0e0d0c-0000-4000-8000-000000000001"), deployment="smollm2",
        llama=llama, container_fingerprint=container_fingerprint(llama), image="slogate:0.1.0",
        timeout_seconds=300, budget_seconds=90, ttl_seconds=3600,
    )  # fmt: skip
    job = builders.calibration_job(request)
    spec = job["spec"]["template"]["spec"]
    assert all("lifecycle" not in c for c in spec["initContainers"])
    assert kubelet_problems("Job", "llm/cal", spec) == []
    assert container_fingerprint(llama) == container_fingerprint(llama_container(pod_of(deployment()), "llama"))


# ------------------------------------------------------------------------------ the API server's and the kubelet's rules


@pytest.mark.parametrize(
    ("lifecycle", "grace", "field", "says"),
    [
        ({"preStop": {}}, None, "lifecycle.preStop", "must specify a handler type"),
        ({"preStop": {**DRAIN_HOOK, **USERS_HOOK}}, None, "lifecycle.preStop.httpGet", "more than 1 handler type"),
        ({"preStop": {"httpGet": {"path": "/x", "port": 0}}}, None, "preStop.httpGet.port", "between 1 and 65535"),
        ({"preStop": {"httpGet": {"path": "/x", "port": 70000}}}, None, "preStop.httpGet.port", "between 1 and 65535"),
        ({"preStop": {"httpGet": {"path": "/x", "port": "Admin_Port"}}}, None, "httpGet.port", "only alpha-numeric"),
        ({"preStop": {"httpGet": {"path": "/x", "port": 1, "scheme": "FTP"}}}, None, "scheme", "Unsupported"),
        ({"preStop": {"sleep": {"seconds": 40}}}, 30, "lifecycle.preStop.sleep", "less than terminationGracePeriod"),
        ({"postStart": {"exec": {}}}, None, "lifecycle.postStart.exec.command", "Required value"),
    ],
    ids=[
        "no handler",
        "two handlers",
        "port 0",
        "port 70000",
        "bad port name",
        "scheme",
        "sleep too long",
        "exec without command",
    ],
)
def test_the_api_server_refuses_invalid_hooks_and_grace_periods(
    cluster: Cluster, lifecycle: dict[str, Any] | None, grace: int | None, field: str, says: str
) -> None:
    dep = deployment(grace=grace, lifecycle=lifecycle)
    del dep["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as refused:
        cluster.create(DEPLOYMENTS, dep)
    assert refused.value.status == 422
    assert field in refused.value.body
    assert says in refused.value.body


@pytest.mark.parametrize(
    ("hook", "why"),
    [
        (
            {"httpGet": {"path": "/slogate/v1/drain", "port": "slogate-admin"}},
            "no port named 'slogate-admin' in the container's ports",
        ),
        ({"httpGet": {"path": "/slogate/v1/drain", "port": 9999}}, "nothing in the pod listens on port 9999"),
    ],
    ids=["the sidecar's port by name", "a port nobody listens on"],
)
def test_a_drain_hook_the_kubelet_could_not_reach_is_a_kubelet_problem(
    cluster: Cluster, hook: dict[str, Any], why: str
) -> None:
    cluster.allow_kubelet_problems()
    dep = injected(deployment())
    pod_of(dep)["containers"][0]["lifecycle"]["preStop"] = hook
    del dep["metadata"]["resourceVersion"]
    cluster.create(DEPLOYMENTS, dep)
    (problem,) = cluster.kubelet_problems
    assert (problem.container, problem.probe, problem.why) == ("llama", "lifecycle.preStop", why)


# ------------------------------------------------------------------------------ the operator does it


@pytest.mark.kopf_thread
def test_the_operator_injects_the_hooks_keeps_a_longer_grace_and_gives_it_back(
    cluster: Cluster, operator: KopfRunner
) -> None:
    dep = llama_deployment()
    pod_of(dep)["terminationGracePeriodSeconds"] = 45
    pod_of(dep)["containers"][0]["lifecycle"] = {"postStart": USERS_HOOK}
    cluster.create(DEPLOYMENTS, dep)
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: gate_of(cluster, "smollm2") is not None, what="the gate, once thresholds exist")
    spec = create_pod(cluster, "smollm2")["spec"]  # the hooks are the pod's, given at admission
    assert spec["terminationGracePeriodSeconds"] == 45
    assert spec["containers"][0]["lifecycle"]["postStart"] == USERS_HOOK
    # The hook carries the drain token of the admin token the sidecar mounts (it checks it).
    secret = cluster.get(SECRETS, "slogate-admin-token")["data"][names.TOKEN_KEY]
    token = drain_token.drain_token(base64.b64decode(secret))
    assert spec["containers"][0]["lifecycle"]["preStop"]["httpGet"] | {"scheme": "HTTP"} == {
        "path": "/slogate/v1/drain", "port": 8082, "scheme": "HTTP",
        "httpHeaders": [{"name": drain_token.HEADER, "value": token}],
    }  # fmt: skip
    assert drain_deadline(spec["containers"][1]) == "40"
    cluster.delete(POLICIES, "smollm2")
    eventually(lambda: cluster.get(POLICIES, "smollm2") is None, what="the finalizer released")
    template = pod_of(cluster.get(DEPLOYMENTS, "smollm2"))  # never had the hook: the pods had it
    assert template["containers"][0]["lifecycle"] == {"postStart": USERS_HOOK}
    after = create_pod(cluster, "smollm2", 1)["spec"]
    assert after["terminationGracePeriodSeconds"] == 45
    assert after["containers"][0]["lifecycle"] == {"postStart": USERS_HOOK}
    cluster.assert_kubelet_could_run()
