"""Injection at pod admission, on the real API server with the real kubectl: the Deployment
keeps the user's fields, so re-applying the user's unchanged manifest (kubectl's client-side
apply, a server-side apply as Argo CD and Flux do) changes nothing and rolls nothing; a
Deployment injected the older way migrates in one rollout; and while no webhook answers, the
API server refuses a gated target's pods, and only those (failurePolicy Fail)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml
from control_plane import Binaries
from kopf.testing import KopfRunner
from operator_flows import apply_and_calibrate, events, status_of

from api_cluster import DEPLOYMENTS, NS, PODS, POLICIES, ApiError, Cluster
from api_server import WEBHOOK_CONFIGURATIONS, empty_webhook_configuration
from canned_profiles import smollm2_profile
from kopf_thread import running_operator, settle
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from slogate_calibration.output import compact_json
from slogate_operator import names
from slogate_operator.injection import injected_template
from slogate_operator.sidecar import SidecarConfig
from workload_controllers import complete_job, containers_of_a_new_pod, create_pod, gate_of, job_names

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread


def kubectl(cluster: Cluster, *args: str, manifest: dict[str, Any] | None = None) -> str:
    """The real kubectl, as the cluster's admin, straight to the API server (the test deletes
    what it applies: the cleanup knows what went through its proxy only)."""
    plane = cluster.process.plane
    command = [Binaries.from_cache().k8s("kubectl"), "--kubeconfig", str(plane.admin_kubeconfig), "-n", NS, *args]
    done = subprocess.run(
        command, input=yaml.safe_dump(manifest) if manifest else None, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reapplying_the_users_manifest_rolls_nothing_and_every_new_pod_is_gated(
    cluster: Cluster, operator: KopfRunner
) -> None:
    """The review's finding: with the sidecar in the template, `kubectl apply` of the quick start
    gave the port name back to llama-server (two ports named http: the Service reached it
    ungated), the operator took it again, a rollout per sync."""
    manifest = llama_deployment()
    kubectl(cluster, "apply", "-f", "-", manifest=manifest)
    try:
        reapply(cluster, manifest)
    finally:
        cluster.delete(DEPLOYMENTS, "smollm2")


def reapply(cluster: Cluster, manifest: dict[str, Any]) -> None:
    apply_and_calibrate(cluster, create_deployment=False)
    gate = gate_of(cluster, "smollm2")
    assert gate is not None
    template = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]
    patches = len(cluster.calls("PATCH", "deployments"))
    for _ in range(3):  # a GitOps re-sync loop: client-side, then server-side apply as another manager
        kubectl(cluster, "apply", "-f", "-", manifest=manifest)
        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "--field-manager=argocd", "-f", "-",
                manifest=manifest)  # fmt: skip
    settle("smollm2", more=3)
    deployment = cluster.get(DEPLOYMENTS, "smollm2")
    # No rollout: the pod template is as it was (a new ReplicaSet needs a new template; the
    # generation may move: the server-side apply drops kubectl's last-applied annotation).
    assert deployment["spec"]["template"] == template
    assert gate_of(cluster, "smollm2") == gate
    assert len(cluster.calls("PATCH", "deployments")) == patches  # the operator wrote nothing back
    llama = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in llama] == ["llama"]
    assert llama[0]["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]  # the user's
    assert containers_of_a_new_pod(cluster, "smollm2") == ["llama", names.SIDECAR_CONTAINER]
    assert len(events(cluster, "SidecarInjected")) == 1


def test_a_deployment_injected_by_an_older_operator_migrates_in_one_rollout(cluster: Cluster) -> None:
    with running_operator(cluster):
        apply_and_calibrate(cluster)
        gate = gate_of(cluster, "smollm2")
    # As an operator of the template injection left it: the sidecar in the template, no gate annotation.
    deployment = cluster.get(DEPLOYMENTS, "smollm2")
    user = llama_deployment()["spec"]["template"]
    old = SidecarConfig(policy="smollm2", image="slogate:old", port=8081, admin_port=9091, upstream_port=8080,
                        prompt_counting="tokenize", token_secret="slogate-admin-token", llama_container="llama")  # fmt: skip
    template = injected_template(user, old)
    cluster.json_patch(DEPLOYMENTS, "smollm2", [{"op": "replace", "path": "/spec/template", "value": template}])
    generation = cluster.get(DEPLOYMENTS, "smollm2")["metadata"]["generation"]
    assert deployment["metadata"]["generation"] < generation
    with running_operator(cluster):
        migrated = eventually_gated(cluster)
        settle("smollm2", more=3)
        assert cluster.get(DEPLOYMENTS, "smollm2")["metadata"]["generation"] == generation + 1  # one rollout
        assert migrated["metadata"]["annotations"] == {names.ANNOTATION_GATE: gate}
        assert (
            migrated["spec"]["containers"]
            == cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["containers"]
        )
        assert [c["name"] for c in migrated["spec"]["containers"]] == ["llama"]
        assert migrated["spec"]["containers"][0]["ports"][0]["name"] == "http"  # given back
        assert len(events(cluster, "SidecarMigrated")) == 1
        assert containers_of_a_new_pod(cluster, "smollm2") == ["llama", names.SIDECAR_CONTAINER]


def eventually_gated(cluster: Cluster) -> dict[str, Any]:
    def template() -> dict[str, Any] | None:
        found = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]
        return found if gate_of(cluster, "smollm2") and len(found["spec"]["containers"]) == 1 else None

    return eventually(template, what="the template the user's again, with the gate annotation")


def test_while_no_webhook_answers_only_the_gated_targets_pods_are_refused(cluster: Cluster) -> None:
    with running_operator(cluster):
        apply_and_calibrate(cluster)
        assert gate_of(cluster, "smollm2") is not None
        other = llama_deployment("other")
        cluster.create(DEPLOYMENTS, other)
    with pytest.raises(ApiError) as refused:
        create_pod(cluster, "smollm2")
    assert "failed calling webhook" in refused.value.body
    assert f"smollm2.{NS}.inject.slogate.dev" in refused.value.body
    assert [c["name"] for c in create_pod(cluster, "other")["spec"]["containers"]] == ["llama"]  # not concerned
    assert not [p for p in cluster.list(PODS) if p["metadata"]["name"].startswith("smollm2-0-")]  # none stored


def test_without_the_charts_webhook_configuration_the_policy_says_so(cluster: Cluster) -> None:
    """An operator run without the chart's MutatingWebhookConfiguration cannot gate any pod:
    the policy is Degraded with what to do, and its pods stay as they are (no rollout)."""
    path = f"{WEBHOOK_CONFIGURATIONS}/{empty_webhook_configuration()['metadata']['name']}"
    cluster.admin("DELETE", path)
    try:
        with running_operator(cluster):
            cluster.create(DEPLOYMENTS, llama_deployment())
            cluster.create(POLICIES, admission_policy())
            (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
            complete_job(cluster, job, compact_json(smollm2_profile()))
            found = eventually(lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get(
                "reason") == "WebhookConfigurationMissing" and c)  # fmt: skip
            assert "the chart creates it" in found["message"]
            assert gate_of(cluster, "smollm2") is None  # never rolled onto a gate no pod could get
            assert status_of(cluster, "Ready") == "False"
    finally:
        cluster.admin.apply(WEBHOOK_CONFIGURATIONS, empty_webhook_configuration())
