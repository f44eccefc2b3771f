"""What the operator calls on the Kubernetes API, and why: the one list the docs table
(docs/operator.md, "RBAC: what the operator calls") and the chart's Role mirror.
A test records every request the running operator (and kopf in it) makes against the
API mock and checks each one is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Permission:
    """One RBAC rule: group, resource, verbs, and the reason the operator needs them."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str
    scope: str = "namespace"
    """``namespace``: in each served namespace (a ClusterRole when serving all);
    ``cluster``: always cluster-wide."""
    named_by: str = ""
    """Granted on one object only (RBAC ``resourceNames``): the one the operator setting of
    this name names (the chart's matching value). Empty: any object of the resource."""


PERMISSIONS: tuple[Permission, ...] = (
    Permission("slogate.dev", "admissionpolicies", ("get", "list", "watch", "patch"),
               "watch policies; kopf's finalizer and its progress annotations"),
    Permission("slogate.dev", "admissionpolicies/status", ("patch",),
               "conditions, calibration and thresholds in force, pushed count"),
    Permission("apps", "deployments", ("get", "list", "watch", "patch"),
               "find targets, fingerprint their llama.cpp container, claim them, inject and remove the sidecar; "
               "re-read one after a conflicting write"),
    Permission("", "pods", ("list", "watch"),
               "pod IPs to push thresholds to; a calibration pod's termination message (the result)"),
    Permission("batch", "jobs", ("get", "list", "watch", "create", "delete"),
               "one calibration Job per fingerprint; delete a failed one before retrying, a superseded one"),
    Permission("", "configmaps", ("get", "create", "patch"),
               "the thresholds ConfigMap the sidecars mount (and the profile it came from)"),
    Permission("", "secrets", ("create",), "the admin token Secret, once per namespace (a create names no object)"),
    Permission("", "secrets", ("get", "patch"), "the admin token Secret: read the token to push, add each policy "
               "as an owner; no other Secret", named_by="admin_token_secret"),
    Permission("networking.k8s.io", "networkpolicies", ("get", "create", "patch", "delete"),
               "each policy's NetworkPolicy <policy>-gate on its gated pods (admin port to the operator and "
               "Prometheus only); deleted when network_policy is off"),
    Permission("keda.sh", "scaledobjects", ("list", "create", "patch", "delete"),
               "spec.autoscaling, engine keda: one ScaledObject per target, kept as the spec says, deleted when "
               "disabled or no longer targeted"),
    Permission("autoscaling", "horizontalpodautoscalers", ("get", "list", "create", "patch", "delete"),
               "spec.autoscaling, engine hpa: one HPA per target (as for ScaledObjects); both engines: read the "
               "HPA's desired and current replicas (KEDA's own for a ScaledObject)"),
    Permission("", "events", ("create",), "Warning and Normal events on policies"),
    Permission("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ("get", "patch"),
               "the injection webhook: each replica's CA in its bundle, one entry per gated target; the chart "
               "creates it, the operator never creates or deletes it", scope="cluster",
               named_by="webhook_configuration"),
    Permission("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"),
               "kopf discovers the resources it serves", scope="cluster"),
    Permission("kopf.dev", "clusterkopfpeerings", ("get", "list", "watch", "patch"),
               "peering of the replicas when serving all namespaces (one active, the other waits)", scope="cluster"),
    Permission("kopf.dev", "kopfpeerings", ("get", "list", "watch", "patch"),
               "peering of the replicas when serving listed namespaces"),
    Permission("", "namespaces", ("list", "watch"),
               "only with namespace patterns (globs) in SLOGATE_OPERATOR_NAMESPACES", scope="cluster"),
)  # fmt: skip


def allows(group: str, resource: str, verb: str) -> bool:
    """Whether the table grants ``verb`` on ``group/resource``."""
    return any(p.group == group and p.resource == resource and verb in p.verbs for p in PERMISSIONS)


def markdown_table() -> str:
    """The table for docs/operator.md."""
    rows = ["| API group | resource | verbs | scope | why |", "| --- | --- | --- | --- | --- |"]
    for p in PERMISSIONS:
        group = f"`{p.group}`" if p.group else '`""` (core)'
        resource = f"`{p.resource}`" + (f" (only the one `{p.named_by}` names)" if p.named_by else "")
        rows.append(f"| {group} | {resource} | {', '.join(p.verbs)} | {p.scope} | {p.why} |")
    return "\n".join(rows)
