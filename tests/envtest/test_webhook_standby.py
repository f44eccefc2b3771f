"""The webhook of a replica that runs no passes (the standby: the chart runs two, and the
webhook's Service sends the API server to both) reads a target's settings once and reuses them
while the pods carry the same gate revision. The e2e suite's 200-pod rollout on kwok nodes
found the standby answering about half the pods with three GETs each (policy, Deployment,
token Secret): 519 to 600 of the rollout's 878 to 949 API calls."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
import kopf
import pytest
from kopf.testing import KopfRunner
from operator_flows import apply_and_calibrate

from api_cluster import DEPLOYMENTS, NS, OPERATOR_AGENT, POLICIES, Cluster
from polling import eventually
from ports import free_ports
from slogate_operator import injector, names
from slogate_operator.client import KubeClient
from slogate_operator.context import Runtime
from slogate_operator.settings import OperatorSettings
from slogate_operator.webhook import Webhook

pytestmark = pytest.mark.kopf_thread  # the active replica is the real operator in a thread


def reads_of_the_deployment(cluster: Cluster) -> int:
    """The operator's GETs of the Deployment by name (passes list Deployments; the webhook gets one)."""
    return sum(1 for c in cluster.received() if c.agent.startswith(OPERATOR_AGENT) and c.method == "GET"
               and c.resource is not None and c.resource.plural == "deployments" and c.name == "smollm2")  # fmt: skip


def template_gated_unlike(cluster: Cluster, revision: str | None) -> dict[str, Any] | None:
    """The Deployment's pod template once it carries a gate revision other than ``revision``."""
    template: dict[str, Any] = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]
    found = injector.gate_of(template)
    return template if found is not None and found != revision else None


def review_of(template: dict[str, Any], index: int) -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"smollm2-{index}", "namespace": NS,
           "labels": dict(template["metadata"]["labels"]), "annotations": dict(template["metadata"]["annotations"])},
           "spec": template["spec"]}  # fmt: skip
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": f"uid-{index}", "operation": "CREATE", "namespace": NS, "object": pod}}  # fmt: skip


async def standby_admits(cluster: Cluster, batches: list[Callable[[], list[dict[str, Any]]]]) -> list[list[str]]:
    """A second replica's webhook (no passes: its Runtime knows no gate) admits a pod of each
    template of each batch in turn (a batch is read when the last is done); the containers
    each pod gets."""
    (port,) = free_ports()
    settings = OperatorSettings(standalone=True, webhook_url=f"https://127.0.0.1:{port}", webhook_port=port,
                                webhook_address="127.0.0.1")  # fmt: skip
    async with KubeClient(lambda: kopf.ConnectionInfo(server=cluster.url)) as client, aiohttp.ClientSession() as http:
        endpoint = injector.Endpoint.of(settings)
        assert endpoint is not None
        hook = Webhook(Runtime(settings=settings, client=client, http=http), endpoint)
        await hook.start()
        try:
            trust = ssl.create_default_context(cadata=hook.certificate.ca_pem.decode())
            url = f"https://127.0.0.1:{port}{injector.GATE_PATH}/{NS}/smollm2/smollm2"
            admitted = []
            for batch in batches:
                for index, template in enumerate(await asyncio.to_thread(batch)):
                    async with http.post(url, json=review_of(template, index), ssl=trust) as answer:
                        response = (await answer.json())["response"]
                    assert response["allowed"], response
                    ops = json.loads(base64.b64decode(response["patch"]))
                    containers = next(op["value"] for op in ops if op["path"] == "/spec/containers")
                    admitted.append([c["name"] for c in containers])
            return admitted
        finally:
            await hook.stop()


def test_the_standby_reads_a_targets_settings_once_per_gate_revision(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    gated = eventually(lambda: template_gated_unlike(cluster, None), what="the template gated")
    reads: list[int] = []

    def first() -> list[dict[str, Any]]:
        reads.append(reads_of_the_deployment(cluster))
        return [gated] * 10

    def after_a_policy_change() -> list[dict[str, Any]]:
        """A change that reaches the sidecar: a new gate revision on the template; a pod of it
        is admitted with the new settings, read again."""
        reads.append(reads_of_the_deployment(cluster))
        cluster.patch(POLICIES, "smollm2", {"spec": {"sidecar": {"promptCounting": "estimate"}}})
        changed = eventually(lambda: template_gated_unlike(cluster, injector.gate_of(gated)), what="a new revision")
        reads.append(reads_of_the_deployment(cluster))
        return [changed] * 3

    def done() -> list[dict[str, Any]]:
        reads.append(reads_of_the_deployment(cluster))
        return []

    admitted = asyncio.run(standby_admits(cluster, [first, after_a_policy_change, done]))
    assert len(admitted) == 13
    assert all(names.SIDECAR_CONTAINER in containers for containers in admitted)
    ten, changing, three = reads[1] - reads[0], reads[2] - reads[1], reads[3] - reads[2]
    assert (ten, changing, three) == (1, 0, 1)  # ten pods, one read; the new revision's three, one
