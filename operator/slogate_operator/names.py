"""Names, labels and annotations: every string the operator and the objects it builds share."""

from __future__ import annotations

import hashlib
import re

GROUP = "slogate.dev"
VERSION = "v1alpha1"
PLURAL = "admissionpolicies"
KIND = "AdmissionPolicy"
API_VERSION = f"{GROUP}/{VERSION}"

MANAGED_BY = "slogate-operator"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_POLICY = f"{GROUP}/policy"
"""On injected pods (so they say which policy gates them) and on calibration Jobs."""
ANNOTATION_CLAIM = f"{GROUP}/policy"
"""On a target Deployment's own metadata: the one policy that gates it (injected or
self-managed). Metadata, not the pod template: claiming starts no rollout."""
ANNOTATION_INJECTION = f"{GROUP}/injection"
"""On an injected pod template: what the injection added and changed (JSON), so removal
takes out exactly that and nothing of the user's that happens to share a name."""
ANNOTATION_GATE = f"{GROUP}/gate"
"""On a gated Deployment's pod template: the revision of what the webhook injects into its
pods (injector.gate_revision). The only field of the template the operator writes, one no
user manifest sets; a new value rolls the pods onto the gate, its absence off it."""
ANNOTATION_CA_BUNDLE = f"{GROUP}/ca-bundle"
"""On the MutatingWebhookConfiguration: the CAs its entries trust (base64 PEM), kept while
it has no entry to carry them."""
LABEL_FINGERPRINT = f"{GROUP}/container-fingerprint"
ANNOTATION_RECALIBRATE = f"{GROUP}/recalibrate"
"""On a policy: any new value forces a new calibration (it is folded into the fingerprint)."""
ANNOTATION_CONTAINER_FINGERPRINT = f"{GROUP}/container-fingerprint"
ANNOTATION_FINGERPRINT_VERSION = f"{GROUP}/fingerprint-version"
ANNOTATION_CONTAINER_DIGEST = f"{GROUP}/container-digest"
ANNOTATION_POLICY_DIGEST = f"{GROUP}/policy-digest"
ANNOTATION_CALIBRATION_JOB = f"{GROUP}/calibration-job"
ANNOTATION_TARGET = f"{GROUP}/target-deployment"

SIDECAR_CONTAINER = "slogate-sidecar"
LLAMA_CONTAINER = "llama-server"
"""The llama.cpp container's name inside a calibration Job's pod."""
CALIBRATOR_CONTAINER = "calibrate"
THRESHOLDS_VOLUME = "slogate-thresholds"
TOKEN_VOLUME = "slogate-admin-token"
TMP_VOLUME = "slogate-tmp"
"""The only writable path of slogate's containers (their root filesystem is read-only)."""
THRESHOLDS_DIR = "/etc/slogate/thresholds"
TOKEN_DIR = "/etc/slogate/admin"
THRESHOLDS_KEY = "thresholds.json"
PROFILE_KEY = "profile.json"
TOKEN_KEY = "token"
CLIENT_PORT_NAME = "slogate"
"""The sidecar's client port name when the llama.cpp container's port has none to hand over."""
ADMIN_PORT_NAME = "slogate-admin"

_DNS_LABEL_MAX = 63
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def short_hash(text: str, length: int = 8) -> str:
    """A stable hex digest prefix."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def dns_label(text: str, max_length: int) -> str:
    """``text`` as a DNS-1123 label of at most ``max_length`` characters, still unique.

    Policy names are DNS subdomains (dots allowed, up to 253 characters); Job names
    become pod labels and must be labels (63). A name that needs shortening keeps a
    hash of the whole, so two long names never collide.
    """
    clean = _NOT_DNS.sub("-", text.lower()).strip("-") or "x"
    if len(clean) <= max_length and clean == text:
        return clean
    keep = max_length - 9
    return f"{clean[:keep].rstrip('-')}-{short_hash(text)}"


def calibration_job_name(policy: str, container_fingerprint: str) -> str:
    """Deterministic per (policy, fingerprint): a restarted operator finds, never duplicates."""
    return f"{dns_label(policy, 38)}-cal-{container_fingerprint[:12]}"


def thresholds_configmap_name(policy: str) -> str:
    """The ConfigMap the sidecars mount: ``<policy>-thresholds`` (shortened past 253 characters)."""
    name = f"{policy}-thresholds"
    return name if len(name) <= 253 else f"{policy[:233].rstrip('.-')}-{short_hash(policy)}-thresholds"


def network_policy_name(policy: str) -> str:
    """The NetworkPolicy of the policy's gated pods (fence.py): ``<policy>-gate``."""
    name = f"{policy}-gate"
    return name if len(name) <= 253 else f"{policy[:239].rstrip('.-')}-{short_hash(policy)}-gate"


KEDA_HPA_PREFIX = "keda-hpa-"
"""KEDA names the HPA it makes for a ScaledObject ``keda-hpa-<ScaledObject name>``."""


def autoscaler_name(policy: str, deployment: str) -> str:
    """The ScaledObject or HPA of one target: ``<policy>-<deployment>``, deterministic.

    A DNS label (63 characters): KEDA writes the ScaledObject's name into a label value of its
    HPA (``scaledobject.keda.sh/name``). A name that needs shortening or cleaning (dots)
    keeps a hash of the pair, so two long pairs never collide; two short pairs that join
    alike (policy ``a`` with Deployment ``b-c``, policy ``a-b`` with ``c``) do, and the
    second policy reports the name as taken rather than take it over (the owner is checked).
    """
    joined = f"{policy}-{deployment}"
    if len(joined) <= _DNS_LABEL_MAX and _DNS_LABEL.fullmatch(joined):
        return joined
    clean = _NOT_DNS.sub("-", joined.lower()).strip("-")
    return f"{clean[: _DNS_LABEL_MAX - 9].rstrip('-')}-{short_hash(policy + '/' + deployment)}"
