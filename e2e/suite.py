"""What the suite deploys and how long it waits: shared by conftest and the tests."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_tools import Kube

REPO = Path(__file__).resolve().parents[1]
E2E = REPO / "e2e"
EXAMPLE = REPO / "examples" / "smollm2.yaml"
SCALE = float(os.environ.get("SLOGATE_E2E_TIMEOUT_SCALE", "1"))
SLOGATE_IMAGE = "slogate:e2e"
RELEASE, RELEASE_NAMESPACE = "slogate", "slogate-system"
APP_NAMESPACE = "llm"
CLIENT_POD = "slogate-e2e-client"
"""A pod of the app namespace that sends requests through the Service (kubectl exec)."""
SIDECAR_PORT_DEFAULTS = {"port": 8081, "adminPort": 8082}
NODE_CPU_REQUEST = "250m"
"""llama-server's CPU request on the suite's 2-CPU node (Example.with_cpu_request)."""
UPSTREAM_LLAMA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server"
"""The llama.cpp image the example names; no registry can be reached here, so the suite runs
the llama-server `make llama` built, in the image `make kube-images` made of it."""


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

    @property
    def llama_spec(self) -> dict[str, Any]:
        (found,) = [c for c in self.pod_spec["containers"] if c["name"] == self.llama_container]
        return dict(found)

    @property
    def service_port(self) -> int:
        (port,) = self.one("Service")["spec"]["ports"]
        return int(port["port"])

    @property
    def target_port(self) -> str:
        """The Service's targetPort: a name (llama-server's port, the gate's once injected)."""
        (port,) = self.one("Service")["spec"]["ports"]
        target = port["targetPort"]
        if not isinstance(target, str):
            raise ValueError(f"the example's Service targets port {target!r} by number: it would bypass the gate")
        return target

    @property
    def llama_port(self) -> int:
        """The number of llama-server's port, the one named as the Service targets."""
        (port,) = [p for p in self.llama_spec.get("ports") or () if p.get("name") == self.target_port]
        return int(port["containerPort"])

    def sidecar_port(self, key: str) -> int:
        """The policy's spec.sidecar.port or .adminPort (the CRD's default when unset)."""
        sidecar = self.one("AdmissionPolicy")["spec"].get("sidecar") or {}
        return int(sidecar.get(key, SIDECAR_PORT_DEFAULTS[key]))

    @property
    def workload_documents(self) -> list[dict[str, Any]]:
        """Everything but the AdmissionPolicy: the workload as it runs before slogate."""
        return [d for d in self.documents if d["kind"] != "AdmissionPolicy"]

    def with_images(self, replacements: dict[str, str]) -> Example:
        """The example with these images replaced in every container and init container (as a
        user edits it for a registry of their own); each named image must be in the example."""
        documents = copy.deepcopy(self.documents)
        seen: set[str] = set()
        for document in documents:
            if document["kind"] != "Deployment":
                continue
            spec = document["spec"]["template"]["spec"]
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                if c["image"] in replacements:
                    seen.add(c["image"])
                    c["image"] = replacements[c["image"]]
        if seen != set(replacements):
            gone = sorted(set(replacements) - seen)
            raise ValueError(f"examples/smollm2.yaml no longer runs {gone}: update e2e/suite.py")
        return Example(documents)

    def with_cpu_request(self, cpu: str) -> Example:
        """The example with llama-server's CPU request lowered to `cpu` (its limit kept), as a
        user edits it for a smaller node: the real node here has 2 CPUs, and two replicas, a
        calibration pod and a surge pod of a rollout must all be scheduled at once."""
        documents = copy.deepcopy(self.documents)
        (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
        (llama,) = [
            c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == self.llama_container
        ]
        llama.setdefault("resources", {}).setdefault("requests", {})["cpu"] = cpu
        return Example(documents)


def apply_policy(kube: Kube, example: Example) -> None:
    """The example's AdmissionPolicy (idempotent: applying it again changes nothing)."""
    kube.apply(APP_NAMESPACE, [example.one("AdmissionPolicy")],
               hint="the CRD is installed by the chart (kubectl get crd admissionpolicies.slogate.dev)")  # fmt: skip
