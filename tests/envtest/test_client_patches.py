"""The operator's JSON patches on the real API server: a ``test`` op on a resourceVersion that
moved is a conflict (re-read and retry), a patch whose result is invalid is not (the server's
message reaches the caller). Both are 422 Invalid; only the invalid one names its fields.

The second review found the invalid one reported as "Deployment kept changing", the server's
message lost, after three retries that could only fail the same way."""

from __future__ import annotations

import kopf
import pytest

from api_cluster import DEPLOYMENTS, NS, Cluster
from manifests import llama_deployment
from slogate_operator import names, targets
from slogate_operator.client import DEPLOYMENTS as DEPLOYMENT_RESOURCE
from slogate_operator.client import ApiError, ConflictError, KubeClient
from slogate_operator.injection import TargetClaimedError
from slogate_operator.injector import gated_template


def client(cluster: Cluster) -> KubeClient:
    return KubeClient(lambda: kopf.ConnectionInfo(server=cluster.url), retries=1, backoff_s=0.0)


async def test_a_failed_test_op_is_a_conflict_and_an_invalid_result_is_the_servers_refusal(cluster: Cluster) -> None:
    created = cluster.create(DEPLOYMENTS, llama_deployment())
    version = created["metadata"]["resourceVersion"]
    cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"labels": {"moved": "on"}}})  # someone else wrote
    async with client(cluster) as kube:
        with pytest.raises(ConflictError):
            await kube.json_patch(DEPLOYMENT_RESOURCE, NS, "smollm2", [
                {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                {"op": "replace", "path": "/spec/replicas", "value": 2},
            ])  # fmt: skip
        current = cluster.get(DEPLOYMENTS, "smollm2")["metadata"]["resourceVersion"]
        with pytest.raises(ApiError) as refused:
            await kube.json_patch(DEPLOYMENT_RESOURCE, NS, "smollm2", [
                {"op": "test", "path": "/metadata/resourceVersion", "value": current},
                {"op": "replace", "path": "/spec/replicas", "value": -2},
            ])  # fmt: skip
    assert not isinstance(refused.value, ConflictError)
    assert refused.value.status == 422
    assert "spec.replicas" in str(refused.value)
    assert refused.value.causes == ("spec.replicas: Invalid value: -2: must be greater than or equal to 0",)


async def test_a_claim_another_policy_made_meanwhile_is_not_overwritten_after_the_re_read(cluster: Cluster) -> None:
    """The review: after a write conflict the re-read path recomputed the patch with this
    policy's claim, over the claim another policy had made meanwhile (and took its gate out)."""
    stale = cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"annotations": {names.ANNOTATION_CLAIM: "other"}}})
    async with client(cluster) as kube:
        with pytest.raises(TargetClaimedError, match="policy 'other'"):
            await targets.apply_template(kube, NS, stale, lambda t: gated_template(t, "r1"), claim="mine")
    stored = cluster.get(DEPLOYMENTS, "smollm2")
    assert stored["metadata"]["annotations"][names.ANNOTATION_CLAIM] == "other"
    assert names.ANNOTATION_GATE not in (stored["spec"]["template"]["metadata"].get("annotations") or {})
