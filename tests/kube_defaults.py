"""Defaulting (and pruning) as kube-apiserver does them, driven by OpenAPI schemas.

One walker follows an object along its schema, ``$ref`` by ``$ref``, and at every node
applies (1) the ``default`` keywords the schema declares for absent properties and (2)
the defaults of that node's Kubernetes type, wherever the type occurs: a Probe is
defaulted whether it is the liveness probe of an init container of a Job's template or
the readiness probe of a Pod, as Go's ``SetDefaults_<Type>`` functions do.

- Built-in kinds walk the Kubernetes OpenAPI definitions shipped in ``kubernetes_validate``
  (``SCHEMA_VERSION``). Those schemas come from the v2 swagger and carry no ``default``
  keyword for any built-in field (checked for every version the package ships, 1.25 to
  1.37: the only "default" keys are properties named so, LimitRangeItem.default and the
  like). The values therefore come from ``GO_DEFAULTS``, a hand list of the Go
  ``SetDefaults_*`` functions, keyed by OpenAPI definition name; ``check_go_defaults``
  proves every key names a real definition and property. Should a future schema declare
  a ``default``, the walker applies it first, and the hand entry then only fills the rest.
- Custom resources walk their CRD's ``openAPIV3Schema``, whose ``default`` keywords are
  the whole story (structural defaulting), then unknown fields are pruned.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate

SCHEMA_VERSION = "v1.33.0"
DEFINITIONS_FILE = (
    Path(kubernetes_validate.__file__).parent
    / "kubernetes-json-schema"
    / f"{SCHEMA_VERSION}-local"
    / "_definitions.json"
)
BUILTIN_KINDS = {
    ("apps", "deployments"): "io.k8s.api.apps.v1.Deployment",
    ("batch", "jobs"): "io.k8s.api.batch.v1.Job",
    ("", "pods"): "io.k8s.api.core.v1.Pod",
    ("", "secrets"): "io.k8s.api.core.v1.Secret",
    ("autoscaling", "horizontalpodautoscalers"): "io.k8s.api.autoscaling.v2.HorizontalPodAutoscaler",
}
"""(group, plural) of the built-in kinds defaulted, and their OpenAPI definitions."""


def image_pull_policy(container: Mapping[str, Any]) -> str:
    """Always for an untagged or ``:latest`` image, else IfNotPresent (SetDefaults_Container)."""
    image = str(container.get("image") or "")
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else None
    return "Always" if tag in (None, "latest") else "IfNotPresent"


Default = Any
"""A value (deep-copied in), or a callable of the node returning one (None: leave unset)."""

GO_DEFAULTS: dict[str, dict[str, Default]] = {
    # Not declared in the OpenAPI: k8s.io/kubernetes pkg/apis/core/v1/defaults.go.
    "io.k8s.api.core.v1.Container": {
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": image_pull_policy,
        "resources": {},  # a non-pointer struct: every answer carries it
    },
    "io.k8s.api.core.v1.ContainerPort": {"protocol": "TCP"},
    "io.k8s.api.core.v1.Probe": {
        "timeoutSeconds": 1,
        "periodSeconds": 10,
        "successThreshold": 1,
        "failureThreshold": 3,
    },
    "io.k8s.api.core.v1.HTTPGetAction": {"scheme": "HTTP"},
    "io.k8s.api.core.v1.ConfigMapVolumeSource": {"defaultMode": 420},
    "io.k8s.api.core.v1.SecretVolumeSource": {"defaultMode": 420},
    "io.k8s.api.core.v1.ProjectedVolumeSource": {"defaultMode": 420},
    "io.k8s.api.core.v1.DownwardAPIVolumeSource": {"defaultMode": 420},
    "io.k8s.api.core.v1.ObjectFieldSelector": {"apiVersion": "v1"},
    "io.k8s.api.core.v1.PodSpec": {
        "restartPolicy": "Always",  # a Job's template keeps the Never/OnFailure it must set
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
        "securityContext": {},
        "terminationGracePeriodSeconds": 30,
    },
    "io.k8s.api.core.v1.Secret": {"type": "Opaque"},
    # pkg/apis/apps/v1/defaults.go
    "io.k8s.api.apps.v1.DeploymentSpec": {
        "replicas": 1,
        "strategy": {},
        "revisionHistoryLimit": 10,
        "progressDeadlineSeconds": 600,
    },
    "io.k8s.api.apps.v1.DeploymentStrategy": {
        "type": "RollingUpdate",
        "rollingUpdate": lambda strategy: {} if strategy.get("type") == "RollingUpdate" else None,
    },
    "io.k8s.api.apps.v1.RollingUpdateDeployment": {"maxUnavailable": "25%", "maxSurge": "25%"},
    # pkg/apis/batch/v1/defaults.go (completions before parallelism: both 1 only when neither is set)
    "io.k8s.api.batch.v1.JobSpec": {
        "completions": lambda spec: 1 if spec.get("parallelism") is None else None,
        "parallelism": 1,
        "backoffLimit": lambda spec: 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6,
        "completionMode": "NonIndexed",
        "suspend": False,
        "podReplacementPolicy": lambda spec: "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed",
    },
}


def _pod_hook(pod: dict[str, Any]) -> None:
    """SetDefaults_Pod (Pods only, not templates): service links on; a limit without a request
    requests the limit."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("enableServiceLinks", True)
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        resources = container.get("resources") or {}
        for resource, limit in (resources.get("limits") or {}).items():
            resources.setdefault("requests", {}).setdefault(resource, limit)


def _job_hook(job: dict[str, Any]) -> None:
    """SetDefaults_Job: a Job without labels takes its template's."""
    labels = (((job.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels")
    meta = job.setdefault("metadata", {})
    if labels and not meta.get("labels"):
        meta["labels"] = dict(labels)


HPA_SCALE_UP = {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                             {"type": "Percent", "value": 100, "periodSeconds": 15}]}  # fmt: skip
HPA_SCALE_DOWN = {"selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}


def _hpa_hook(hpa: dict[str, Any]) -> None:
    """SetDefaults_HorizontalPodAutoscaler (autoscaling/v2): minReplicas 1, CPU at 80% without
    metrics, and a behavior given has every unset field of both directions filled
    (GenerateHPAScaleUpRules / GenerateHPAScaleDownRules; scaleDown's window stays unset)."""
    spec = hpa.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("minReplicas", 1)
    if not spec.get("metrics"):
        target = {"type": "Utilization", "averageUtilization": 80}
        spec["metrics"] = [{"type": "Resource", "resource": {"name": "cpu", "target": target}}]
    behavior = spec.get("behavior")
    if isinstance(behavior, dict):
        for direction, rules in (("scaleUp", HPA_SCALE_UP), ("scaleDown", HPA_SCALE_DOWN)):
            given = behavior.get(direction) or {}
            behavior[direction] = copy.deepcopy(rules) | {k: v for k, v in given.items() if v is not None}


GO_HOOKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "io.k8s.api.core.v1.Pod": _pod_hook,
    "io.k8s.api.batch.v1.Job": _job_hook,
    "io.k8s.api.autoscaling.v2.HorizontalPodAutoscaler": _hpa_hook,
}


@functools.cache
def definitions() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DEFINITIONS_FILE.read_text())["$defs"]
    return found


def check_go_defaults() -> list[str]:
    """Hand-listed defaults that name no definition or property of the schema (should be [])."""
    defs = definitions()
    wrong = [name for name in [*GO_DEFAULTS, *GO_HOOKS] if name not in defs]
    for name, fields in GO_DEFAULTS.items():
        wrong += [f"{name}.{key}" for key in fields if key not in (defs.get(name) or {}).get("properties", {})]
    return wrong


def schema_defaults() -> list[str]:
    """Every property of the built-in definitions whose schema declares a ``default``."""
    return [
        f"{name}.{key}"
        for name, node in definitions().items()
        for key, prop in (node.get("properties") or {}).items()
        if isinstance(prop, dict) and "default" in prop
    ]


def _resolve(schema: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any]]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        return name, definitions().get(name, {})
    return None, schema


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> None:
    """Default ``value`` in place along ``schema`` (a built-in ``$ref`` or an inline CRD schema)."""
    name, node = _resolve(schema)
    if isinstance(value, dict):
        if name in GO_HOOKS:
            GO_HOOKS[name](value)
        properties: Mapping[str, Any] = node.get("properties") or {}
        _declared_defaults(value, properties)
        _go_defaults(value, GO_DEFAULTS.get(name or "", {}))
        for key, prop in properties.items():
            if key in value:
                apply_defaults(value[key], prop)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in [k for k in value if k not in properties]:
                apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for item in value:
            apply_defaults(item, node["items"])


def _declared_defaults(value: dict[str, Any], properties: Mapping[str, Any]) -> None:
    """The schema's ``default`` keywords, for absent properties (and nulls where not nullable)."""
    for key, prop in properties.items():
        declared = prop if "default" in prop else _resolve(prop)[1]
        if "default" in declared and (key not in value or (value[key] is None and not declared.get("nullable"))):
            value[key] = copy.deepcopy(declared["default"])


def _go_defaults(value: dict[str, Any], fields: Mapping[str, Default]) -> None:
    for key, default in fields.items():
        if value.get(key) in (None, ""):
            chosen = default(value) if callable(default) else copy.deepcopy(default)
            if chosen is not None:
                value[key] = chosen


def default_builtin(obj: dict[str, Any], group: str, plural: str) -> None:
    definition = BUILTIN_KINDS.get((group, plural))
    if definition is not None:
        apply_defaults(obj, {"$ref": f"#/$defs/{definition}"})


def prune(value: Any, schema: Mapping[str, Any], *, root: bool = False) -> Any:
    """Drop the fields a structural schema does not declare (unless it preserves unknown fields),
    as kube-apiserver does to custom resources before storing them."""
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-int-or-string")
        result = {}
        for key, item in value.items():
            if root and key in ("apiVersion", "kind", "metadata"):
                result[key] = item
            elif properties and key in properties:
                result[key] = prune(item, properties[key])
            elif isinstance(extra, dict):
                result[key] = prune(item, extra)
            elif keep_unknown or extra is True:
                result[key] = item
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"]) for item in value]
    return value
