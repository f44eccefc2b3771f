"""The injected sidecar itself: how it runs (``SidecarConfig``), its container in front of
llama-server, and the volumes it mounts. ``injection`` puts them into a pod template and
takes them out again; ``injector`` derives the config of a target from its policy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slogate_operator import names, stopping
from slogate_operator.builders import RESTRICTED_SECURITY, TMP_MOUNT, TMP_VOLUME

SIDECAR_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
"""No CPU limit: throttling the gate would add latency to every request it passes."""
OUR_VOLUMES = (names.THRESHOLDS_VOLUME, names.TOKEN_VOLUME, names.TMP_VOLUME)


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
    llama_container: str | None = None
    """The llama.cpp container whose port name the sidecar takes over (None: the first)."""
    settings_flags: tuple[str, ...] = ()
    """`slogate sidecar` flags of the settings the policy tunes (SidecarSpec.settings_flags);
    the sidecar's own defaults for the rest."""
    drain_token: str | None = None
    """The drain hook's token (slogate_admission.drain_token of the admin token the sidecar
    mounts); None: a hook without it, which a sidecar with an admin token refuses."""


def sidecar_container(
    config: SidecarConfig, port_name: str = names.CLIENT_PORT_NAME, grace: int = stopping.GRACE_SECONDS
) -> dict[str, Any]:
    """`slogate sidecar` in front of llama-server on loopback (docs/sidecar.md), in a pod of this grace period."""
    thresholds = f"{names.THRESHOLDS_DIR}/{names.THRESHOLDS_KEY}"
    args = [
        "sidecar",
        "--upstream",
        f"http://127.0.0.1:{config.upstream_port}",
        "--host",
        "0.0.0.0",
        "--port",
        str(config.port),
        "--admin-port",
        str(config.admin_port),
        "--thresholds",
        thresholds,
        "--admin-token-file",
        f"{names.TOKEN_DIR}/{names.TOKEN_KEY}",
        "--prompt-counting",
        config.prompt_counting,
        "--drain-deadline",
        str(stopping.drain_deadline(grace)),
        *config.settings_flags,
    ]
    return {
        "name": names.SIDECAR_CONTAINER,
        "image": config.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["slogate"],
        "args": args,
        "ports": [
            {"name": port_name, "containerPort": config.port, "protocol": "TCP"},
            {"name": names.ADMIN_PORT_NAME, "containerPort": config.admin_port, "protocol": "TCP"},
        ],
        # Ready only with thresholds loaded and llama-server healthy: traffic waits for both.
        # Probes name the number: the client port's name is whichever the Service targets.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": config.port},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": config.port},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "lifecycle": stopping.sidecar_lifecycle(),
        "volumeMounts": [
            {"name": names.THRESHOLDS_VOLUME, "mountPath": names.THRESHOLDS_DIR, "readOnly": True},
            {"name": names.TOKEN_VOLUME, "mountPath": names.TOKEN_DIR, "readOnly": True},
            dict(TMP_MOUNT),
        ],
        "resources": copy.deepcopy(dict(config.resources) if config.resources else SIDECAR_RESOURCES),
        "securityContext": copy.deepcopy(RESTRICTED_SECURITY),
    }


def sidecar_volumes(config: SidecarConfig) -> list[dict[str, Any]]:
    """The thresholds ConfigMap, the admin token Secret, and /tmp.

    The ConfigMap is optional only so that a pod of a policy whose ConfigMap was lost
    still starts (not ready until a push): the operator injects once thresholds exist.
    """
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
