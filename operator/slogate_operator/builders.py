"""Pure builders of the Kubernetes objects the operator creates: calibration Job,
thresholds ConfigMap, admin token Secret, Event. Plain dicts in, plain dicts out; no I/O.
Unit tests validate what they build with kubernetes-validate (strict).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slogate_operator import names
from slogate_operator.fingerprint import LlamaContainer, mounted_volumes, shell_join
from slogate_operator.timestamps import format_time

CALIBRATOR_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
"""The calibrator sends requests and reads a GGUF header; the llama.cpp container beside
it keeps the target's own resources, so the measurement is of the real thing."""
TMP_VOLUME = {"name": names.TMP_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}
TMP_MOUNT = {"name": names.TMP_VOLUME, "mountPath": "/tmp"}
RESTRICTED_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,  # the slogate image's user (Dockerfile)
    "runAsGroup": 65532,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
COPIED_POD_FIELDS = (
    "nodeSelector",
    "tolerations",
    "imagePullSecrets",
    "securityContext",
    "runtimeClassName",
    "priorityClassName",
    "serviceAccountName",
)
"""Pod fields a calibration Job copies from the target: same hardware, same pull rights."""
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


@dataclass(frozen=True, slots=True)
class PolicyRef:
    """The AdmissionPolicy an object belongs to."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self, *, controller: bool = True) -> dict[str, Any]:
        """Garbage collection: the object goes when the policy goes."""
        return {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": controller,
        }


CALIBRATION_COMPONENT = "calibration"
"""The component label of a calibration Job and its pod."""


def is_calibration_pod(pod: Mapping[str, Any]) -> bool:
    """A calibration Job's pod (it carries the policy's label like the pods it gates)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(names.LABEL_COMPONENT) == CALIBRATION_COMPONENT


def policy_labels(policy: str) -> dict[str, str]:
    """Labels of everything the operator creates for a policy."""
    return {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_POLICY: policy_label_value(policy)}


def policy_label_value(policy: str) -> str:
    """A policy name as a label value (at most 63 characters)."""
    return names.dns_label(policy, 63)


@dataclass(frozen=True, slots=True)
class CalibrationRequest:
    """Everything one calibration Job needs."""

    policy: PolicyRef
    deployment: str
    llama: LlamaContainer
    container_fingerprint: str
    image: str
    timeout_seconds: int
    budget_seconds: float
    ttl_seconds: int


def calibration_job(request: CalibrationRequest) -> dict[str, Any]:
    """The Job that measures the target's llama.cpp container (docs/calibration.md).

    One pod: the target's llama.cpp container, copied, as a native sidecar (an init
    container with restartPolicy Always, started first and stopped when the main
    container exits), and `slogate calibrate` as the main container, writing the
    compact profile to its termination message. Both mount the model volumes at the
    same paths (read-only for the calibrator: it reads the GGUF header).

    The server copy gets no probe: the kubelet probes the pod IP, and a llama-server on
    ``--host 127.0.0.1`` (so the gate cannot be bypassed) would never pass one. The
    calibrator waits for /health on loopback itself (``--wait-seconds``: what the Job's
    deadline leaves after the measurement budget).
    """
    llama = request.llama
    port = llama.port()
    name = names.calibration_job_name(request.policy.name, request.container_fingerprint)
    labels = policy_labels(request.policy.name) | {
        names.LABEL_COMPONENT: CALIBRATION_COMPONENT,
        names.LABEL_FINGERPRINT: request.container_fingerprint,
    }
    # Nor its lifecycle hooks: the drain hook an injection gave it calls a sidecar this pod has not.
    server = {key: copy.deepcopy(value) for key, value in llama.container.items() if key not in (*PROBES, "lifecycle")}
    server["restartPolicy"] = "Always"
    if not llama.has_metrics():
        # Calibration reads /metrics (is the server idle?); the variable works whatever
        # the command form, and metrics do not change speed (not in the fingerprint).
        server["env"] = [*server.get("env", []), {"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "1"}]
    args = [
        "calibrate",
        "--upstream",
        f"http://127.0.0.1:{port}",
        f"--server-args={shell_join(llama.server_args())}",  # "=": a value like "--metrics" is no flag
        "--termination-message-path",
        "/dev/termination-log",
        "--budget-seconds",
        f"{request.budget_seconds:g}",
        "--wait-seconds",
        f"{max(1.0, request.timeout_seconds - request.budget_seconds):g}",
        "--no-progress",
    ]
    model = llama.model_path()
    if model is not None:
        args += ["--model", model]
    calibrator = {
        "name": names.CALIBRATOR_CONTAINER,
        "image": request.image,
        "command": ["slogate"],
        "args": args,
        "volumeMounts": [
            *(m | {"readOnly": True} for m in llama.container.get("volumeMounts") or ()),
            dict(TMP_MOUNT),
        ],
        "terminationMessagePath": "/dev/termination-log",
        # On failure the log tail (the one-line error) becomes the message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": copy.deepcopy(CALIBRATOR_RESOURCES),
        "securityContext": copy.deepcopy(RESTRICTED_SECURITY),
    }
    init_containers = [*llama.feeding_init_containers(), server]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "initContainers": init_containers,
        "containers": [calibrator],
        # Every volume a copied container mounts (a feeding init container's HF-token
        # Secret too): the API server refuses a mount of an undeclared volume (422).
        "volumes": [*mounted_volumes(llama.pod_spec, init_containers), copy.deepcopy(TMP_VOLUME)],
    }
    for field in COPIED_POD_FIELDS:
        if field in llama.pod_spec:
            pod_spec[field] = copy.deepcopy(llama.pod_spec[field])
    node_affinity = (llama.pod_spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:
        # Same hardware: node affinity only. The app's pod (anti-)affinity names the app's
        # own pods; the Job pod is not one of them, and copied whole it can keep the Job
        # off every node that runs one (unschedulable on a small cluster).
        pod_spec["affinity"] = {"nodeAffinity": copy.deepcopy(node_affinity)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": request.policy.namespace,
            "labels": labels,
            "annotations": {names.ANNOTATION_TARGET: request.deployment},
            "ownerReferences": [request.policy.owner_reference()],
        },
        "spec": {
            "backoffLimit": 0,  # the operator retries with its own backoff and reports each failure
            "activeDeadlineSeconds": request.timeout_seconds,
            "ttlSecondsAfterFinished": request.ttl_seconds,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def thresholds_configmap(policy: PolicyRef, data: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap the sidecars mount: thresholds.json, plus the profile they came from."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.thresholds_configmap_name(policy.name),
            "namespace": policy.namespace,
            "labels": policy_labels(policy.name) | {names.LABEL_COMPONENT: "thresholds"},
            "annotations": dict(annotations),
            "ownerReferences": [policy.owner_reference()],
        },
        "data": dict(data),
    }


def admin_token_secret(namespace: str, name: str, token: str, owners: Sequence[PolicyRef]) -> dict[str, Any]:
    """The bearer token sidecars of a namespace accept pushes with.

    Owned by every policy of the namespace that uses it (none a controller), so
    Kubernetes deletes it with the last of them.
    """
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_COMPONENT: "admin-token"},
            "ownerReferences": [owner.owner_reference(controller=False) for owner in owners],
        },
        "data": {names.TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def secret_token(secret: Mapping[str, Any]) -> str | None:
    """The token a Secret holds, or None if it holds none."""
    raw = (secret.get("data") or {}).get(names.TOKEN_KEY)
    if not raw:
        return None
    try:
        return base64.b64decode(raw).decode().strip() or None
    except (ValueError, UnicodeDecodeError):
        return None


def event(policy: PolicyRef, *, kind: str, reason: str, message: str, now: datetime, instance: str) -> dict[str, Any]:
    """A core/v1 Event about a policy, named like client-go names them (object.hex-nanos)."""
    stamp = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{policy.name[:200]}.{int(now.timestamp() * 1e9):x}{names.short_hash(reason + message, 4)}",
            "namespace": policy.namespace,
        },
        "involvedObject": {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": policy.name,
            "namespace": policy.namespace,
            "uid": policy.uid,
        },
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": names.MANAGED_BY},
        "reportingComponent": f"{names.GROUP}/operator",
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
