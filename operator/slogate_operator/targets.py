"""Which Deployments a policy gates, their llama.cpp containers, and claiming, injecting and
releasing them.

A policy claims each target (an annotation on the Deployment's own metadata, which starts
no rollout) before anything else, so two policies, injected or self-managed, can never
gate, calibrate or push to the same Deployment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from slogate_operator import builders, names
from slogate_operator.client import DEPLOYMENTS, ConflictError, KubeClient
from slogate_operator.fingerprint import ContainerNotFoundError, LlamaContainer, container_fingerprint, llama_container
from slogate_operator.injection import TargetClaimedError, deployment_claim, deployment_patch
from slogate_operator.names import SIDECAR_CONTAINER
from slogate_operator.selectors import Selector
from slogate_operator.spec import AdmissionPolicySpec

CONFLICT_RETRIES = 5


@dataclass(frozen=True, slots=True)
class Target:
    """A selected Deployment and its llama.cpp container."""

    deployment: Mapping[str, Any]
    llama: LlamaContainer
    fingerprint: str

    @property
    def name(self) -> str:
        return str(self.deployment["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class TargetScan:
    """What the Deployments of the namespace say about a policy."""

    targets: tuple[Target, ...]
    problems: tuple[str, ...]
    """Selected Deployments the policy cannot gate (no such container, gated by another policy)."""
    strays: tuple[Mapping[str, Any], ...]
    """Deployments this policy injected that it no longer selects: the sidecar must go."""
    skipped: tuple[str, ...] = ()
    """Deployments the selector matches that another policy gates: left to it, and said in
    ``status.notes`` (a selector that overlaps another policy's target is no error: it
    gates the rest, and takes that one over if the other policy lets it go)."""

    @property
    def fingerprints(self) -> set[str]:
        return {t.fingerprint for t in self.targets}


def selected(spec: AdmissionPolicySpec, deployments: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Deployments the spec names (targetRef) or selects by their own labels (selector)."""
    ref, selector = spec.operator.target_ref, spec.operator.selector
    if ref is not None:
        return [d for d in deployments if d["metadata"]["name"] == ref.name]
    assert selector is not None
    by_labels = selector.as_selector()
    return [d for d in deployments if by_labels.selects(d)]


def scan(
    policy: str, spec: AdmissionPolicySpec, deployments: Sequence[Mapping[str, Any]], recalibrate: str | None
) -> TargetScan:
    """Targets with their fingerprints, problems, and strays. Pure."""
    mine = builders.policy_label_value(policy)
    chosen = sorted(selected(spec, deployments), key=lambda d: str(d["metadata"]["name"]))
    targets: list[Target] = []
    problems: list[str] = []
    skipped: list[str] = []
    for deployment in chosen:
        template = (deployment.get("spec") or {}).get("template") or {}
        name = deployment["metadata"]["name"]
        owner = deployment_claim(deployment)
        if owner is not None and owner != mine:
            gated = f"Deployment {name} is already gated by policy {owner!r}"
            # Named by targetRef: a conflict to resolve. Matched by a selector: left to its owner.
            (problems if spec.operator.target_ref is not None else skipped).append(gated)
            continue
        try:
            llama = llama_container(template.get("spec") or {}, spec.operator.container)
        except ContainerNotFoundError as error:
            problems.append(f"Deployment {name}: {error}")
            continue
        clash = port_clash(spec, llama, template.get("spec") or {})
        if clash:
            problems.append(f"Deployment {name}: {clash}")
            continue
        targets.append(Target(deployment, llama, container_fingerprint(llama, recalibrate)))
    chosen_names = {d["metadata"]["name"] for d in chosen}
    strays = tuple(d for d in deployments if d["metadata"]["name"] not in chosen_names and deployment_claim(d) == mine)
    return TargetScan(tuple(targets), tuple(problems), strays, tuple(skipped))


def concerns(policy: str, spec: AdmissionPolicySpec, deployment: Mapping[str, Any]) -> bool:
    """Whether a change to ``deployment`` can change what the policy does: named, selected, or claimed."""
    return bool(selected(spec, [deployment])) or deployment_claim(deployment) == builders.policy_label_value(policy)


def port_clash(spec: AdmissionPolicySpec, llama: LlamaContainer, pod_spec: Mapping[str, Any]) -> str | None:
    """Why the sidecar's ports cannot go into this pod (a port another container uses), or None."""
    sidecar = spec.operator.sidecar
    if not sidecar.inject:
        return None
    ours = {sidecar.port: "spec.sidecar.port", sidecar.admin_port: "spec.sidecar.adminPort"}
    if llama.port() in ours:
        return (
            f"llama-server listens on {llama.port()}, the sidecar's {ours[llama.port()]}: the gate would be "
            "its own upstream; move one of them"
        )
    natives = [c for c in pod_spec.get("initContainers") or () if c.get("restartPolicy") == "Always"]
    for container in [*(pod_spec.get("containers") or ()), *natives]:  # native sidecars run beside the gate
        if container.get("name") == SIDECAR_CONTAINER:
            continue
        for port in container.get("ports") or ():
            if port.get("containerPort") in ours:
                return (
                    f"container {container.get('name')} declares port {port['containerPort']}, the sidecar's "
                    f"{ours[port['containerPort']]}: set another one in the policy"
                )
    return None


async def apply_template(
    client: KubeClient,
    namespace: str,
    deployment: Mapping[str, Any],
    desired_from: Callable[[Mapping[str, Any]], dict[str, Any]],
    claim: str | Literal["keep"] | None = "keep",
) -> Mapping[str, Any] | None:
    """Patch the pod template to ``desired_from(current)`` and the claim; the new Deployment if it changed.

    ``claim``: the policy label value to claim it for, None to release it, "keep" to leave it.
    Conflicts (someone changed the Deployment meanwhile) re-read and retry, so the
    desired template is always computed from the latest one; a claim another policy made
    meanwhile stops it (TargetClaimedError): never claimed over, its gate never taken out.
    """
    current: Mapping[str, Any] | None = deployment
    for attempt in range(CONFLICT_RETRIES):
        if current is None:
            return None
        owner = deployment_claim_value(current)
        if attempt and claim is not None and claim != "keep" and owner not in (None, claim):
            raise TargetClaimedError(f"it was claimed by policy {owner!r} meanwhile")
        template = (current.get("spec") or {}).get("template") or {}
        wanted = deployment_claim_value(current) if claim == "keep" else claim
        ops = deployment_patch(current, desired_from(template), wanted)
        if not ops:
            return None
        name = str(current["metadata"]["name"])
        try:
            return await client.json_patch(DEPLOYMENTS, namespace, name, ops)
        except ConflictError:
            current = await client.get(DEPLOYMENTS, namespace, name)
            continue
    raise ConflictError(409, "Conflict", f"Deployment {namespace}/{deployment['metadata']['name']} kept changing")


def deployment_claim_value(deployment: Mapping[str, Any]) -> str | None:
    """The claim annotation as it stands (not an injected template's label)."""
    return ((deployment.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_CLAIM)


def pod_selector(deployment: Mapping[str, Any]) -> Selector:
    """The Deployment's pod selector (``spec.selector``)."""
    return Selector.parse((deployment.get("spec") or {}).get("selector"))


def ungated(deployments: Sequence[Mapping[str, Any]], gated_pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why traffic to these Deployments may pass no gate, one line per Deployment: pods it counts
    (``status.replicas``: every pod not terminating, of every ReplicaSet) beyond the gated ones
    (``gated_pods``: those carrying the policy's label), e.g. old pods kept by a rollout stuck in
    FailedCreate or CrashLoopBackOff; or replicas wanted and no gated pod running."""
    found = []
    for deployment in deployments:
        meta, spec, status = deployment["metadata"], deployment.get("spec") or {}, deployment.get("status") or {}
        if status.get("observedGeneration", 0) < meta.get("generation", 0):
            continue  # the controller has not counted this template yet: next pass
        selector = pod_selector(deployment)
        mine = [p for p in gated_pods if selector.selects(p) and not p["metadata"].get("deletionTimestamp")]
        running = [p for p in mine if (p.get("status") or {}).get("phase") == "Running"]
        extra = int(status.get("replicas") or 0) - len(mine)
        if extra > 0:
            found.append(
                f"Deployment {meta['name']}: {extra} of its {status.get('replicas')} pods run without the gate"
            )
        elif int(spec.get("replicas", 1)) > 0 and not running:
            found.append(f"Deployment {meta['name']}: no gated pod runs ({spec.get('replicas', 1)} wanted)")
    return found
