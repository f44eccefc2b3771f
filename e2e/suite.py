"""What the suite deploys and how long it waits: shared by conftest and the tests."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
E2E = REPO / "e2e"
EXAMPLE = REPO / "examples" / "smollm2.yaml"
CLUSTER = os.environ.get("SLOGATE_E2E_CLUSTER", "slogate-e2e")
SCALE = float(os.environ.get("SLOGATE_E2E_TIMEOUT_SCALE", "1"))
SLOGATE_IMAGE = "ghcr.io/slogate/slogate:e2e"
RELEASE, RELEASE_NAMESPACE = "slogate", "slogate-system"
APP_NAMESPACE = "llm"


def seconds(base: float) -> float:
    return base * SCALE


@dataclass(frozen=True)
class Example:
    """What examples/smollm2.yaml deploys, read from the file (so the suite follows it)."""

    documents: list[dict[str, Any]]

    def one(self, kind: str) -> dict[str, Any]:
        (found,) = [d for d in self.documents if d["kind"] == kind]
        return found

    @property
    def deployment(self) -> str:
        return str(self.one("Deployment")["metadata"]["name"])

    @property
    def policy(self) -> str:
        return str(self.one("AdmissionPolicy")["metadata"]["name"])

    @property
    def service(self) -> str:
        return str(self.one("Service")["metadata"]["name"])

    @property
    def llama_container(self) -> str:
        return str(self.one("AdmissionPolicy")["spec"].get("container") or self.pod_spec["containers"][0]["name"])

    @property
    def pod_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.one("Deployment")["spec"]["template"]["spec"]
        return spec

    @property
    def replicas(self) -> int:
        return int(self.one("Deployment")["spec"].get("replicas", 1))

    @property
    def images(self) -> list[str]:
        spec = self.pod_spec
        return sorted({c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]})

    @property
    def selector(self) -> str:
        labels = self.one("Deployment")["spec"]["selector"]["matchLabels"]
        return ",".join(f"{k}={v}" for k, v in labels.items())
