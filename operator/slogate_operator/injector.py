"""Injection at pod admission, the pure half: what the webhook adds to a pod, the
MutatingWebhookConfiguration entry that sends a target's pods to it, and the one field of
the Deployment the operator writes to roll pods onto or off the gate.

The Deployment keeps the user's fields. Its pods get the sidecar, the port hand-over, the
drain hooks and the grace period when the API server admits them (``pod_patch``, the same
``injection.injected_template`` applied to the pod). The operator writes one annotation of
the pod template, ``slogate.dev/gate`` (``gated_template``), a field no user manifest sets:
``kubectl apply`` (three-way) and server-side apply of the user's unchanged manifest keep it,
so they change nothing and roll nothing. A new value rolls the pods (the gate goes on, its
settings changed, or it comes off), as ``kubectl rollout restart`` does with its own.

A Deployment injected the older way (the sidecar in its template, ``InjectionRecord``) is
migrated by the same write: the template gets back what that injection changed, and the
annotation; its pods roll once, onto the webhook.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from slogate_operator import names, targets
from slogate_operator.fingerprint import LlamaContainer
from slogate_operator.injection import covers, injected_template, removed_template
from slogate_operator.selectors import Requirement, labelled
from slogate_operator.settings import OperatorSettings
from slogate_operator.sidecar import SidecarConfig
from slogate_operator.spec import AdmissionPolicySpec

POD_CREATE = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
              "scope": "Namespaced"}  # fmt: skip
GATE_PATH = "/inject"
"""The webhook's path; an entry calls ``/inject/<namespace>/<policy>/<deployment>``."""
TIMEOUT_SECONDS = 10
"""How long the API server waits for the webhook (its maximum is 30): a webhook that has not
got the target's settings yet reads them from the API first (``webhook.py``)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API server calls the webhook: a Service (in a cluster), or a URL."""

    service: tuple[str, str] | None = None
    """(namespace, name) of the Service in front of the operator's pods (port 443)."""
    url: str | None = None
    """Base URL when the API server reaches the operator directly (outside a cluster, tests)."""

    @classmethod
    def of(cls, settings: OperatorSettings) -> Endpoint | None:
        """The endpoint the settings name; None when they name none (no injection possible)."""
        if settings.webhook_service:
            namespace, _, name = settings.webhook_service.partition("/")
            return cls(service=(namespace, name))
        if settings.webhook_url:
            return cls(url=settings.webhook_url.rstrip("/"))
        return None

    def hosts(self) -> list[str]:
        """The names the serving certificate must hold: what the API server dials."""
        if self.service is not None:
            namespace, name = self.service
            return [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
        host = urlsplit(self.url or "").hostname
        if not host:
            raise ValueError(f"webhook URL {self.url!r} names no host")
        return [host]

    def client_config(self, path: str) -> dict[str, Any]:
        """Where to call (the bundle goes in with ``configuration_patch``)."""
        if self.service is not None:
            namespace, name = self.service
            return {"service": {"namespace": namespace, "name": name, "path": path, "port": 443}}
        return {"url": f"{self.url}{path}"}


def sidecar_config(
    settings: OperatorSettings, policy: str, spec: AdmissionPolicySpec, llama: LlamaContainer, drain: str
) -> SidecarConfig:
    """How the sidecar of a target's pods runs: the policy's spec over the operator's defaults."""
    sidecar = spec.operator.sidecar
    return SidecarConfig(
        policy=policy,
        image=sidecar.image or settings.image,
        port=sidecar.port,
        admin_port=sidecar.admin_port,
        upstream_port=llama.port(),
        prompt_counting=sidecar.prompt_counting,
        token_secret=settings.admin_token_secret,
        resources=sidecar.resources.model_dump(exclude_defaults=True) if sidecar.resources else None,
        llama_container=llama.name,
        settings_flags=sidecar.settings_flags(),
        drain_token=drain,
    )


def gate_revision(config: SidecarConfig) -> str:
    """The value of the gate annotation: what a running pod's sidecar cannot take without a
    restart, the image excepted. A new image reaches the pods at their next rollout (the
    operator rolls no fleet at once for it; ``kubectl rollout restart`` takes it now)."""
    fields = dataclasses.asdict(dataclasses.replace(config, image=""))
    return names.short_hash(json.dumps(fields, sort_keys=True, default=str), 16)


def gate_of(template: Mapping[str, Any]) -> str | None:
    """The gate annotation of a pod template (or a pod: they inherit it)."""
    value = ((template.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_GATE)
    return str(value) if value is not None else None


def gated_template(template: Mapping[str, Any], revision: str | None) -> dict[str, Any]:
    """The pod template with the gate annotation at ``revision`` (None: without it), and
    without what a template injection of an older operator put in (the migration)."""
    desired = removed_template(template)
    meta = desired.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    if revision is None:
        annotations.pop(names.ANNOTATION_GATE, None)
    else:
        annotations[names.ANNOTATION_GATE] = revision
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return desired


def pod_patch(pod: Mapping[str, Any], config: SidecarConfig) -> list[dict[str, Any]]:
    """JSON-patch ops that inject the sidecar into a pod being created; [] if it has it.

    The pod is treated as its template (metadata and spec), so a pod gets exactly what the
    template injection gave: one implementation of the sidecar, the hand-over and the hooks.
    TargetClaimedError when the pod cannot take it (a container or volume of ours by name).
    """
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.LABEL_POLICY) is not None:
        return []  # injected already, or a calibration pod (neither is ours to change)
    template = {"metadata": copy.deepcopy(dict(meta)), "spec": copy.deepcopy(dict(pod.get("spec") or {}))}
    desired = injected_template(template, config)
    ops: list[dict[str, Any]] = []
    for key in ("labels", "annotations"):
        if desired["metadata"].get(key) != meta.get(key):
            ops.append({"op": "add", "path": f"/metadata/{key}", "value": desired["metadata"][key]})
    spec = pod.get("spec") or {}
    for key in ("containers", "volumes", "terminationGracePeriodSeconds"):
        if key in desired["spec"] and desired["spec"][key] != spec.get(key):
            ops.append({"op": "add", "path": f"/spec/{key}", "value": desired["spec"][key]})
    return ops


def entry_name(namespace: str, deployment: str) -> str:
    """The configuration's entry of one target: a DNS subdomain of three labels at least."""
    name = f"{deployment}.{namespace}.inject.{names.GROUP}"
    return name if len(name) <= 253 else f"{names.short_hash(namespace + '/' + deployment, 16)}.inject.{names.GROUP}"


def entry(
    namespace: str,
    policy: str,
    deployment: Mapping[str, Any],
    endpoint: Endpoint,
    failure_policy: str,
) -> dict[str, Any]:
    """The entry that sends the pods of one target Deployment, and no other, to the webhook.

    Scoped by the namespace's name and by the Deployment's own pod selector; pods that
    carry the policy label are left out (calibration pods, pods injected already).
    """
    name = str(deployment["metadata"]["name"])
    uninjected = Requirement(names.LABEL_POLICY, "DoesNotExist")
    return {
        "name": entry_name(namespace, name),
        "admissionReviewVersions": ["v1"],
        "clientConfig": endpoint.client_config(f"{GATE_PATH}/{namespace}/{policy}/{name}"),
        "rules": [POD_CREATE],
        "namespaceSelector": labelled("kubernetes.io/metadata.name", namespace).to_api(),
        "objectSelector": targets.pod_selector(deployment).requiring(uninjected).to_api(),
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "reinvocationPolicy": "Never",
    }


def ca_bundle_of(configuration: Mapping[str, Any]) -> bytes:
    """The CA bundle the configuration's entries carry (kept in its annotation when it has none)."""
    raw = ((configuration.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_CA_BUNDLE) or ""
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return b""


def configuration_patch(
    configuration: Mapping[str, Any], entries: Mapping[str, Mapping[str, Any] | None], ca_bundle: bytes | None = None
) -> list[dict[str, Any]]:
    """JSON-patch ops setting (a mapping) or removing (None) entries by name, and every
    entry's CA bundle to ``ca_bundle`` (None: the one it holds); [] when nothing changes.

    The ops test the resourceVersion: two writers (a replica's CA, a pass's entry) never
    lose each other's change; the loser re-reads.
    """
    bundle = ca_bundle if ca_bundle is not None else ca_bundle_of(configuration)
    encoded = base64.b64encode(bundle).decode()
    webhooks = [dict(w) for w in configuration.get("webhooks") or ()]
    final: list[dict[str, Any]] = []
    for webhook in webhooks:  # in place, in their order; the removed ones out
        name = str(webhook.get("name"))
        if name not in entries:
            final.append(copy.deepcopy(webhook))
        elif entries[name] is not None:
            final.append(copy.deepcopy(dict(entries[name] or {})))
    stored = {w.get("name") for w in webhooks}
    final += [copy.deepcopy(dict(e)) for name, e in entries.items() if e is not None and name not in stored]
    for webhook in final:
        webhook.setdefault("clientConfig", {})["caBundle"] = encoded
    ops: list[dict[str, Any]] = []
    if not _same_entries(webhooks, final):
        ops.append({"op": "add", "path": "/webhooks", "value": final})
    annotations = dict((configuration.get("metadata") or {}).get("annotations") or {})
    if annotations.get(names.ANNOTATION_CA_BUNDLE) != encoded:
        annotations[names.ANNOTATION_CA_BUNDLE] = encoded
        ops.append({"op": "add", "path": "/metadata/annotations", "value": annotations})
    if not ops:
        return []
    version = (configuration.get("metadata") or {}).get("resourceVersion")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]


def _same_entries(stored: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> bool:
    """Equal on what the operator writes (the server adds defaults to what it stores)."""
    if [w.get("name") for w in stored] != [w.get("name") for w in wanted]:
        return False
    return all(covers(have, want) for have, want in zip(stored, wanted, strict=True))
