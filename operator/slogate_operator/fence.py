"""The NetworkPolicy a policy's gated pods stand behind (``<policy>-gate``), kept by each pass.

Without it the gate is advice: llama-server keeps listening on the pod IP (its port keeps its
number, only the name goes to the sidecar), so a client that names the number, or a Service
written with ``targetPort: 8080``, walks past the gate; and the admin port (threshold pushes,
/metrics, the drain hook) answers every pod of the cluster. The fence isolates the gated pods
(those the webhook labelled with the policy) for ingress and admits:

- the gate's client port, and every other port the target's containers declare, from anyone,
  as without slogate;
- the admin port from ``admin_peers`` only (the chart's: its operator's pods and Prometheus);
- nothing else: llama-server's own port is closed to the network (the sidecar reaches it over
  the pod's loopback, which no NetworkPolicy filters).

The kubelet's probes and the drain hook come from the node, which CNIs admit to their own
node's pods whatever the policies say (Calico, Cilium, kindnet and kube-router do).
Calibration pods carry the policy's label too: they need no ingress (the calibrator talks to
its llama-server over loopback).

The NetworkPolicy is owned by the policy (garbage-collected with it); one left by an earlier
policy of the same name is adopted, as the thresholds ConfigMap is. A NetworkPolicy of that
name that the operator did not make is left alone and the policy says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slogate_operator import builders, names, stores
from slogate_operator.client import NETWORK_POLICIES, ConflictError
from slogate_operator.context import Runtime
from slogate_operator.selectors import labelled
from slogate_operator.spec import AdmissionPolicySpec
from slogate_operator.targets import Target


def open_ports(spec: AdmissionPolicySpec, targets: Sequence[Target]) -> list[dict[str, Any]]:
    """The ports everyone may reach: the gate's client port, then what the targets' other
    containers (and llama-server's other ports) declare. llama-server's served port is not
    among them: that is what the gate stands in front of."""
    sidecar = spec.operator.sidecar
    seen = {(sidecar.port, "TCP"), (sidecar.admin_port, "TCP")}
    ports = [{"port": sidecar.port, "protocol": "TCP"}]
    for target in targets:
        template = (target.deployment.get("spec") or {}).get("template") or {}
        for container in (template.get("spec") or {}).get("containers") or ():
            if container.get("name") == names.SIDECAR_CONTAINER:
                continue  # left by template injection, before the webhook
            for port in container.get("ports") or ():
                number, protocol = port.get("containerPort"), port.get("protocol") or "TCP"
                served = container.get("name") == target.llama.name and number == target.llama.port()
                if served or not isinstance(number, int) or (number, protocol) in seen:
                    continue
                seen.add((number, protocol))
                ports.append({"port": number, "protocol": protocol})
    return ports


def fence(
    policy: builders.PolicyRef, spec: AdmissionPolicySpec, targets: Sequence[Target], peers: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The NetworkPolicy of ``policy``'s gated pods."""
    ingress: list[dict[str, Any]] = [{"ports": open_ports(spec, targets)}]
    if peers:  # a rule without `from` would admit everyone: no peers, no rule, the port closed
        admin = {"port": spec.operator.sidecar.admin_port, "protocol": "TCP"}
        ingress.append({"from": [dict(p) for p in peers], "ports": [admin]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": names.network_policy_name(policy.name),
            "namespace": policy.namespace,
            "labels": {**builders.policy_labels(policy.name), names.LABEL_COMPONENT: "gate"},
            "ownerReferences": [policy.owner_reference()],
        },
        "spec": {
            "podSelector": labelled(names.LABEL_POLICY, builders.policy_label_value(policy.name)).to_api(),
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


async def keep(
    rt: Runtime, policy: builders.PolicyRef, spec: AdmissionPolicySpec, targets: Sequence[Target]
) -> tuple[str, str] | None:
    """Create, update or delete the fence as the settings and the spec want it; a Degraded
    (reason, message) when a NetworkPolicy of its name is not the operator's. One left by an
    earlier policy of the same name (garbage collection has not run yet) is adopted."""
    name = names.network_policy_name(policy.name)
    found = await rt.client.get(NETWORK_POLICIES, policy.namespace, name)
    wanted = rt.settings.network_policy and spec.operator.sidecar.inject
    if found is not None and not stores.owned_by(found, policy) and not stores.left_by_namesake(found, policy):
        if not wanted:
            return None
        return (
            "NetworkPolicyTaken",
            f"NetworkPolicy {policy.namespace}/{name} exists and is not this policy's: it is left as it is, "
            "and the gated pods are fenced only as far as it says (rename it, or delete it for the operator's)",
        )
    if not wanted:
        if found is not None:
            await rt.client.delete(NETWORK_POLICIES, policy.namespace, name)
        return None
    desired = fence(policy, spec, targets, rt.settings.peers())
    if found is None:
        await rt.client.create(NETWORK_POLICIES, policy.namespace, desired)
        return None
    labels = (found.get("metadata") or {}).get("labels") or {}
    labelled = all(labels.get(k) == v for k, v in desired["metadata"]["labels"].items())
    if found.get("spec") == desired["spec"] and labelled and stores.owned_by(found, policy):
        return None
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": found["metadata"].get("resourceVersion")},
        {"op": "replace", "path": "/spec", "value": desired["spec"]},
        {"op": "add", "path": "/metadata/labels", "value": {**labels, **desired["metadata"]["labels"]}},
        {"op": "add", "path": "/metadata/ownerReferences", "value": desired["metadata"]["ownerReferences"]},
    ]
    try:
        await rt.client.json_patch(NETWORK_POLICIES, policy.namespace, name, ops)
    except ConflictError:
        rt.poke(policy.namespace, policy.name)  # someone wrote it meanwhile: the next pass reads theirs
    return None
