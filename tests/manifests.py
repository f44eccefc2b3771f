"""The Kubernetes objects the operator tests apply, and what they read back from a policy."""

from __future__ import annotations

from typing import Any


def llama_deployment(
    name: str = "smollm2", args: list[str] | None = None, labels: dict[str, str] | None = None, replicas: int = 1
) -> dict[str, Any]:
    """A llama.cpp Deployment shaped like examples/smollm2.yaml: model from an init container."""
    match = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels or {}, app=name)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": dict(match)},
                "spec": {
                    "initContainers": [{
                        "name": "model", "image": "smollm2-gguf:0.1.2",
                        "command": ["cp", "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "/model/"],
                        "volumeMounts": [{"name": "model", "mountPath": "/model"}],
                    }],
                    "containers": [{
                        "name": "llama", "image": "ghcr.io/ggml-org/llama.cpp:server",
                        "args": args if args is not None else [
                            "-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port", "8080",
                            "-t", "2", "-np", "4", "-c", "8192", "--metrics",
                        ],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "resources": {"requests": {"cpu": "2", "memory": "512Mi"}, "limits": {"cpu": "2"}},
                        "volumeMounts": [{"name": "model", "mountPath": "/model", "readOnly": True}],
                    }],
                    "volumes": [{"name": "model", "emptyDir": {}}],
                },
            },
        },
    }  # fmt: skip


def admission_policy(name: str = "smollm2", **spec: Any) -> dict[str, Any]:
    """An AdmissionPolicy for the Deployment of the same name, with a 2 s TTFT SLO unless told."""
    body: dict[str, Any] = {"targetRef": {"kind": "Deployment", "name": name}, "slo": {"ttftSeconds": 2.0}}
    body.update(spec)
    return {"apiVersion": "slogate.dev/v1alpha1", "kind": "AdmissionPolicy", "metadata": {"name": name}, "spec": body}


def condition(policy: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    """A condition of a policy's status, or {} if absent."""
    for found in ((policy or {}).get("status") or {}).get("conditions") or ():
        if found.get("type") == kind:
            return dict(found)
    return {}
