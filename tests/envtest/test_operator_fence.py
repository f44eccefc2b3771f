"""The real operator keeps each gated policy's NetworkPolicy on the real API server (fence.py):
made before the first pod rolls onto the gate, selecting the pods the webhook injects, put back
when someone edits it, never a write in a steady pass, deleted when the setting is off, and a
NetworkPolicy of the same name that is not the operator's left alone and reported. (What it
admits is evaluated in tests/unit/chart/test_network_policy.py; that garbage collection takes
it with the policy needs kube-controller-manager: the e2e suite's real cluster.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kopf.testing import KopfRunner
from operator_flows import apply_and_calibrate, status_of

from api_cluster import DEPLOYMENTS, NS, OPERATOR_AGENT, PODS, POLICIES, Cluster
from kopf_thread import passes, running_operator, settle
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from slogate_operator import names
from workload_controllers import create_pod

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread

NETWORK_POLICIES = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
FENCE = names.network_policy_name("smollm2")
PEERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "slogate-system"}},
          "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}}}]  # fmt: skip


def writes(cluster: Cluster) -> list[str]:
    """The operator's writes of NetworkPolicies so far."""
    return [c.method for c in cluster.received() if c.resource is not None and c.agent.startswith(OPERATOR_AGENT)
            and c.resource.plural == "networkpolicies" and c.method != "GET"]  # fmt: skip


def test_the_fence_stands_before_the_pods_are_gated_and_selects_them(cluster: Cluster) -> None:
    with running_operator(cluster, ADMIN_PEERS=json.dumps(PEERS)):
        apply_and_calibrate(cluster)
        fence = cluster.get(NETWORK_POLICIES, FENCE)
        assert fence is not None  # the real API server took it: a valid NetworkPolicy
        policy = cluster.get(POLICIES, "smollm2")
        assert fence["metadata"]["ownerReferences"] == [
            {"apiVersion": "slogate.dev/v1alpha1", "kind": "AdmissionPolicy", "name": "smollm2",
             "uid": policy["metadata"]["uid"], "controller": True}
        ]  # fmt: skip
        # Made in the pass that first saw the policy, before the one that gated the target.
        order = [(c.resource.plural, c.method) for c in cluster.received() if c.resource is not None]
        assert order.index(("networkpolicies", "POST")) < order.index(("deployments", "PATCH"))
        pod = create_pod(cluster, "smollm2")  # as its ReplicaSet would: the webhook injects it
        cluster.delete(PODS, pod["metadata"]["name"])
        assert names.SIDECAR_CONTAINER in [c["name"] for c in pod["spec"]["containers"]]
        labels = pod["metadata"]["labels"]
        selector = fence["spec"]["podSelector"]["matchLabels"]
        assert all(labels.get(k) == v for k, v in selector.items())  # the injected pod is fenced
        client, admin = fence["spec"]["ingress"]
        assert client == {"ports": [{"port": 8081, "protocol": "TCP"}]}  # the gate's, from anyone
        assert admin == {"from": PEERS, "ports": [{"port": 8082, "protocol": "TCP"}]}
        settle("smollm2")
        before = passes("smollm2")
        cluster.patch(POLICIES, "smollm2", {"metadata": {"annotations": {"touch": "1"}}})
        eventually(lambda: passes("smollm2") > before, what="another pass")
        assert writes(cluster) == ["POST"]  # a steady pass reads it and writes nothing


def test_an_edited_fence_is_put_back(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    kept = cluster.get(NETWORK_POLICIES, FENCE)["spec"]
    opened = {"spec": {"ingress": [{}]}}  # every port from everyone: the admin port too
    cluster.patch(NETWORK_POLICIES, FENCE, opened)
    eventually(lambda: cluster.get(NETWORK_POLICIES, FENCE)["spec"] == kept, what="the fence as it was")


def test_off_deletes_the_operators_fence(cluster: Cluster) -> None:
    with running_operator(cluster):
        apply_and_calibrate(cluster)
        assert cluster.get(NETWORK_POLICIES, FENCE) is not None
    with running_operator(cluster, NETWORK_POLICY="false"):
        eventually(lambda: cluster.get(NETWORK_POLICIES, FENCE) is None, what="the fence deleted")
        # Ready again, not Degraded (this process's webhook has a URL of its own: the entry is
        # rewritten and read first, so Ready may be False for a pass or two meanwhile).
        eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready without the fence")
        settle("smollm2")
        assert cluster.get(NETWORK_POLICIES, FENCE) is None  # not made again


def test_a_network_policy_of_that_name_not_the_operators_is_left_alone_and_reported(
    cluster: Cluster, operator: KopfRunner
) -> None:
    theirs: dict[str, Any] = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": FENCE},
        "spec": {"podSelector": {"matchLabels": {"app": "other"}}, "policyTypes": ["Ingress"]},
    }  # fmt: skip
    cluster.create(NETWORK_POLICIES, theirs)
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "NetworkPolicyTaken"
    assert f"{NS}/{FENCE}" in degraded["message"]
    assert cluster.get(NETWORK_POLICIES, FENCE)["spec"] == {**theirs["spec"]}
    assert writes(cluster) == []
