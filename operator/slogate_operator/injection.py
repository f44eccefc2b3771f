"""Pure builders of the sidecar injection: the container, the pod template with it, and
the JSON patch that turns one Deployment into the other.

Idempotent by construction: the desired template is computed from the current one
(our container and volumes replaced, never appended twice), and no patch is produced
when nothing differs. The patch replaces ``/spec/template`` after a ``test`` of the
resourceVersion, so a concurrent change makes it fail (409/422) instead of losing
someone's edit; the caller re-reads and retries.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slogate_operator import names
from slogate_operator.builders import RESTRICTED_SECURITY, TMP_MOUNT, TMP_VOLUME, policy_label_value

SIDECAR_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
"""No CPU limit: throttling the gate would add latency to every request it passes."""
OUR_VOLUMES = frozenset({names.THRESHOLDS_VOLUME, names.TOKEN_VOLUME, names.TMP_VOLUME})


class TargetClaimedError(ValueError):
    """The Deployment is already gated by another policy."""


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    """How the injected sidecar runs."""

    policy: str
    image: str
    port: int
    admin_port: int
    upstream_port: int
    prompt_counting: str
    token_secret: str
    resources: Mapping[str, Any] | None = None


def sidecar_container(config: SidecarConfig) -> dict[str, Any]:
    """`slogate sidecar` in front of llama-server on loopback (docs/sidecar.md)."""
    thresholds = f"{names.THRESHOLDS_DIR}/{names.THRESHOLDS_KEY}"
    args = [
        "sidecar",
        "--upstream", f"http://127.0.0.1:{config.upstream_port}",
        "--host", "0.0.0.0",
        "--port", str(config.port),
        "--admin-port", str(config.admin_port),
        "--thresholds", thresholds,
        "--admin-token-file", f"{names.TOKEN_DIR}/{names.TOKEN_KEY}",
        "--prompt-counting", config.prompt_counting,
    ]  # fmt: skip
    return {
        "name": names.SIDECAR_CONTAINER,
        "image": config.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["slogate"],
        "args": args,
        "ports": [
            {"name": names.CLIENT_PORT_NAME, "containerPort": config.port, "protocol": "TCP"},
            {"name": names.ADMIN_PORT_NAME, "containerPort": config.admin_port, "protocol": "TCP"},
        ],
        # Ready only with thresholds loaded and llama-server healthy: traffic waits for both.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": names.CLIENT_PORT_NAME},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": names.CLIENT_PORT_NAME},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {"name": names.THRESHOLDS_VOLUME, "mountPath": names.THRESHOLDS_DIR, "readOnly": True},
            {"name": names.TOKEN_VOLUME, "mountPath": names.TOKEN_DIR, "readOnly": True},
            dict(TMP_MOUNT),
        ],
        "resources": copy.deepcopy(dict(config.resources) if config.resources else SIDECAR_RESOURCES),
        "securityContext": copy.deepcopy(RESTRICTED_SECURITY),
    }


def sidecar_volumes(config: SidecarConfig) -> list[dict[str, Any]]:
    """The thresholds ConfigMap (optional: a pod may start before the first calibration;
    its sidecar then waits, not ready, for a push), the admin token Secret, and /tmp."""
    return [
        {
            "name": names.THRESHOLDS_VOLUME,
            "configMap": {"name": names.thresholds_configmap_name(config.policy), "optional": True},
        },
        {
            "name": names.TOKEN_VOLUME,
            "secret": {
                "secretName": config.token_secret,
                "items": [{"key": names.TOKEN_KEY, "path": names.TOKEN_KEY}],
                "defaultMode": 0o444,  # the sidecar runs as non-root; only this pod mounts it
            },
        },
        copy.deepcopy(TMP_VOLUME),
    ]


def claimed_by(template: Mapping[str, Any]) -> str | None:
    """The policy label of an injected pod template, if any."""
    labels = (template.get("metadata") or {}).get("labels") or {}
    value = labels.get(names.LABEL_POLICY)
    return str(value) if value is not None else None


def injected_template(template: Mapping[str, Any], config: SidecarConfig) -> dict[str, Any]:
    """The pod template with our sidecar, volumes and policy label (replacing older ones)."""
    owner = claimed_by(template)
    if owner is not None and owner != policy_label_value(config.policy):
        raise TargetClaimedError(f"its pod template is already gated by policy {owner!r}")
    desired = removed_template(template)
    spec = desired["spec"]
    spec["containers"] = [*spec["containers"], sidecar_container(config)]
    spec["volumes"] = [*spec.get("volumes", []), *sidecar_volumes(config)]
    desired.setdefault("metadata", {}).setdefault("labels", {})[names.LABEL_POLICY] = policy_label_value(config.policy)
    return desired


def removed_template(template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template without anything the injection added."""
    desired = copy.deepcopy(dict(template))
    spec = desired.setdefault("spec", {})
    spec["containers"] = [c for c in spec.get("containers", []) if c.get("name") != names.SIDECAR_CONTAINER]
    volumes = [v for v in spec.get("volumes", []) if v.get("name") not in OUR_VOLUMES]
    if volumes:
        spec["volumes"] = volumes
    else:
        spec.pop("volumes", None)
    labels = (desired.get("metadata") or {}).get("labels")
    if labels is not None:
        labels.pop(names.LABEL_POLICY, None)
    return desired


def template_patch(deployment: Mapping[str, Any], desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON-patch ops turning the Deployment's template into ``desired``; [] when equal."""
    current = (deployment.get("spec") or {}).get("template") or {}
    if current == desired:
        return []
    version = (deployment.get("metadata") or {}).get("resourceVersion")
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "replace", "path": "/spec/template", "value": copy.deepcopy(dict(desired))},
    ]
