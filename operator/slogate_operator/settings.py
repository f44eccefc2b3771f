"""Operator settings: one frozen dataclass, one docstring per field, read from the environment.

Every field has an environment variable (``SLOGATE_OPERATOR_<FIELD>``, upper case), which
is how the Helm chart sets them in the Deployment (docs/operator.md says which values set
which, and why three are left out); `slogate operator` flags override the scope, peering,
image and port ones. docs/operator.md lists them all.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "SLOGATE_OPERATOR_"
DEFAULT_IMAGE = "slogate:0.1.0"
PEER_KEYS = frozenset({"namespaceSelector", "podSelector", "ipBlock"})
"""What a NetworkPolicy peer may name (``admin_peers``)."""


class SettingsError(ValueError):
    """An environment variable holds something its setting cannot take."""


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """How the operator runs. Times are seconds."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to serve; empty: every namespace (cluster-wide, needs a ClusterRole)."""
    peering: str = "slogate"
    """kopf peering object: replicas sharing it elect one active operator (HA)."""
    standalone: bool = False
    """No peering at all: for a single replica, local runs and tests."""
    priority: int = 0
    """Peering priority; 0: a random one per process. Replicas must differ: kopf pauses
    every operator of a peering when two share a priority."""
    peering_lifetime_seconds: int = 60
    """How long a replica's peering record counts as alive: the standby takes over this
    long after the active one stopped renewing it."""
    image: str = DEFAULT_IMAGE
    """The slogate image: injected sidecars and calibration Jobs run `slogate` from it,
    unless a policy names its own ``spec.sidecar.image``."""
    admin_token_secret: str = "slogate-admin-token"
    """Secret (one per namespace, created by the operator) holding the bearer token
    that sidecars require for threshold pushes; key ``token``."""
    startup_jitter_seconds: float = 5.0
    """A policy's first pass waits a random share of this, so a restarted operator does not
    reconcile (and list, and push to) every policy at the same moment."""
    resync_seconds: float = 30.0
    """A policy is reconciled at least this often, besides every change the operator
    watches (policy, Deployments, calibration Jobs and pods)."""
    coalesce_seconds: float = 1.0
    """A policy's pass waits this long after the first change that woke it, so the changes
    that follow (a rollout's hundreds of pod events) are handled by one pass, not one each."""
    error_backoff_seconds: float = 5.0
    """First wait after a reconcile pass that failed (API down); doubles up to resync."""
    calibration_retry_seconds: float = 60.0
    """Wait after a failed calibration before the next attempt; doubles per attempt."""
    calibration_retry_max_seconds: float = 1800.0
    """The longest wait between calibration attempts."""
    calibration_grace_seconds: float = 60.0
    """A Job unfinished this long past ``spec.calibration.timeoutSeconds`` is deemed
    timed out even if Kubernetes has not failed it (activeDeadlineSeconds does normally)."""
    job_ttl_seconds: int = 3600
    """ttlSecondsAfterFinished of calibration Jobs: long enough to read a failed Job's logs."""
    max_calibrations: int = 2
    """Calibration Jobs running at once, over every policy this operator serves; the others
    wait their turn (Calibrated False, ``Queued``), so an upgrade that changes every
    fingerprint, or many policies applied together, do not load every node at once."""
    push_attempts: int = 3
    """Attempts per sidecar in one push round; later rounds retry the ones still behind."""
    push_backoff_seconds: float = 0.5
    """Wait before the second push attempt to a sidecar; doubles per attempt."""
    push_timeout_seconds: float = 2.0
    """One request to a sidecar's admin API may take this long (pushes run beside the
    reconcile pass, never in it; a sidecar still behind is tried again next round)."""
    api_retries: int = 4
    """Attempts of one Kubernetes API call that met a 429, a 5xx or a broken connection."""
    api_backoff_seconds: float = 0.2
    """Wait before the second API attempt; doubles per attempt."""
    kube_api: str = ""
    """API server URL to use instead of the in-cluster service account or kubeconfig
    (e.g. ``http://127.0.0.1:8001`` behind ``kubectl proxy``). No credentials are sent."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """The Prometheus that KEDA's trigger queries for a policy's demand (``spec.autoscaling``,
    engine keda) unless the policy names its own ``prometheus.serverAddress``: the one that
    scrapes the sidecars through the chart's PodMonitor."""
    webhook_port: int = 9443
    """Port of the pod-injection webhook (HTTPS, a certificate of the operator's own)."""
    webhook_address: str = "0.0.0.0"
    """Address the webhook listens on."""
    webhook_service: str = ""
    """``namespace/name`` of the Service in front of the operator's webhook port (port 443),
    which the API server calls (the chart's). Empty: ``webhook_url``."""
    webhook_url: str = ""
    """Base URL the API server calls the webhook at when it reaches the operator directly
    (``https://127.0.0.1:9443`` for an operator run beside a local API server). With neither
    this nor ``webhook_service``, no pod is injected and gated policies say so."""
    webhook_configuration: str = "slogate-injector"
    """The MutatingWebhookConfiguration the operator keeps its entries in (one per gated
    target) and its CA bundle; the chart creates it, the operator never creates or deletes it."""
    webhook_failure_policy: str = "Fail"
    """``Fail``: while no replica of the operator answers, the API server refuses to create
    the gated targets' pods (their rollouts and scale-ups wait; nothing ever serves ungated;
    other pods are not concerned). ``Ignore``: they start without the gate, and the policy
    says UngatedPods until they are restarted."""
    webhook_settle_seconds: float = 2.0
    """Wait between writing a target's webhook entry and rolling its pods, so that every API
    server has read the entry before the first new pod is admitted."""
    network_policy: bool = True
    """Each policy that injects keeps a NetworkPolicy ``<policy>-gate`` on its gated pods: the
    gate's client port and the other ports the pods declare open to everyone, the admin port
    (threshold pushes, /metrics, the drain hook) to ``admin_peers`` only, llama-server's own
    port closed, so no client gets past the gate. Takes effect where the CNI enforces
    NetworkPolicy. False: none, and the operator deletes those it made."""
    admin_peers: str = ""
    """Who may reach the gated pods' admin port over the network: a JSON list of NetworkPolicy
    peers (``namespaceSelector``, ``podSelector``, ``ipBlock``). The chart names its operator's
    pods and Prometheus. Empty: no pod (the kubelet's drain hook comes from the node)."""
    metrics_port: int = 9090
    """Port of the operator's Prometheus /metrics; 0: none."""
    liveness_port: int = 8080
    """Port of kopf's liveness endpoint (/healthz); 0: none."""

    def __post_init__(self) -> None:
        for name in (
            "resync_seconds",
            "error_backoff_seconds",
            "calibration_retry_seconds",
            "calibration_retry_max_seconds",
            "push_backoff_seconds",
            "push_timeout_seconds",
            "api_backoff_seconds",
            "webhook_settle_seconds",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise SettingsError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("push_attempts", "api_retries", "job_ttl_seconds", "peering_lifetime_seconds", "max_calibrations"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        self._check_webhook()
        self._check_peers()
        for name in ("metrics_port", "liveness_port", "webhook_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise SettingsError(f"{name} must be a port number or 0, got {getattr(self, name)!r}")
        for name in ("startup_jitter_seconds", "calibration_grace_seconds", "coalesce_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise SettingsError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.priority < 0:
            raise SettingsError(f"priority must be >= 0 (0: random), got {self.priority}")
        if not self.image:
            raise SettingsError("image must not be empty")
        if not re.fullmatch(r"https?://\S+", self.prometheus_url):
            raise SettingsError(f"prometheus_url must be an http(s) URL, got {self.prometheus_url!r}")
        if not self.standalone and not self.peering:
            raise SettingsError("peering must name a peering object unless standalone")

    def peers(self) -> tuple[Mapping[str, Any], ...]:
        """``admin_peers`` parsed (checked when the settings were made)."""
        return tuple(json.loads(self.admin_peers)) if self.admin_peers.strip() else ()

    def _check_peers(self) -> None:
        if not self.admin_peers.strip():
            return
        try:
            peers = json.loads(self.admin_peers)
        except ValueError as error:
            raise SettingsError(f"admin_peers must be JSON: {error}") from None
        if not isinstance(peers, list) or not all(isinstance(p, dict) and p for p in peers):
            raise SettingsError(f"admin_peers must be a JSON list of NetworkPolicy peers, got {self.admin_peers!r}")
        for peer in peers:
            unknown = set(peer) - PEER_KEYS
            if unknown:
                raise SettingsError(f"admin_peers: a peer names {sorted(PEER_KEYS)} only, not {sorted(unknown)}")

    def _check_webhook(self) -> None:
        if self.webhook_failure_policy not in ("Fail", "Ignore"):
            raise SettingsError(f"webhook_failure_policy must be Fail or Ignore, got {self.webhook_failure_policy!r}")
        if self.webhook_service and not re.fullmatch(r"[a-z0-9.-]+/[a-z0-9.-]+", self.webhook_service):
            raise SettingsError(f"webhook_service must be namespace/name, got {self.webhook_service!r}")
        if self.webhook_url and not re.fullmatch(r"https://[^/\s]+/?", self.webhook_url):
            raise SettingsError(f"webhook_url must be https://host[:port], got {self.webhook_url!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> OperatorSettings:
        """Settings from ``SLOGATE_OPERATOR_*`` variables, then ``overrides`` (CLI flags)."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = environ.get(ENV_PREFIX + field.name.upper())
            if raw is None:
                continue
            values[field.name] = _parse(field.name, str(field.type), raw)
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)

    @classmethod
    def environment_variables(cls) -> list[tuple[str, str, str]]:
        """(variable, default, docstring) of every setting, for the docs and their test."""
        docs = _field_docs()
        rows = []
        for field in dataclasses.fields(cls):
            default = field.default
            shown = ",".join(default) if isinstance(default, tuple) else str(default).lower()
            if isinstance(default, float | int) and not isinstance(default, bool):
                shown = f"{default:g}"
            rows.append((ENV_PREFIX + field.name.upper(), shown, docs[field.name]))
        return rows


def markdown_table() -> str:
    """The settings table of docs/operator.md."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for variable, default, doc in OperatorSettings.environment_variables():
        rows.append(f"| `{variable}` | {f'`{default}`' if default else '(empty)'} | {doc} |")
    return "\n".join(rows)


def _parse(name: str, annotation: str, raw: str) -> Any:
    text = raw.strip()
    try:
        if annotation.startswith("tuple"):
            return tuple(part.strip() for part in text.split(",") if part.strip())
        if annotation == "bool":
            if text.lower() in {"1", "true", "yes", "on"}:
                return True
            if text.lower() in {"0", "false", "no", "off", ""}:
                return False
            raise ValueError("expected true or false")
        if annotation == "int":
            return int(text)
        if annotation == "float":
            return float(text)
    except ValueError as error:
        raise SettingsError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {error}") from None
    return text


def _field_docs() -> dict[str, str]:
    """The docstring under each field, read from this module's source (one source of truth)."""
    tree = ast.parse(inspect.getsource(OperatorSettings))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, following in itertools.pairwise(body):
        documented = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and documented:
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs
