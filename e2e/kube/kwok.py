"""kwok, one more process of the cluster: the kubelet of fake nodes. It makes a node Ready,
renews its Lease, and plays its pods' lifecycle (Running and Ready once bound, a Job's pod
Succeeded, a deleted pod gone) through the real API server, so the real controllers,
scheduler, webhooks and operator see a fleet no 2-core machine could run.

It manages only the nodes a test annotates `kwok.x-k8s.io/node: fake` (never the real node
`slogate-node`), with the Stages kwokctl gives it by default (build-binaries.sh copies them
from the module: kwok alone starts with none). A pod's IP comes from its node's
`spec.podCIDR`: the tests give fake nodes ranges in 127.0.0.0/8, so nothing that tries a
fake pod's address can leave the machine (it finds no listener on loopback, or no route).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from control_plane import cache_dir, versions

MANAGED = "kwok.x-k8s.io/node=fake"
"""The annotation (and the NoSchedule taint the tests add) of every node kwok plays."""
FALLBACK_CIDR = "127.0.8.0/24"
"""Pod IPs for a managed node without a podCIDR (kwok's own default is 10.0.0.0/24)."""
LEASE_SECONDS = 40
"""As kwokctl runs it (the kubelet's own default too)."""


@dataclass(frozen=True)
class Kwok:
    binary: Path
    stages: Path

    @classmethod
    def from_cache(cls) -> Kwok:
        root = cache_dir() / f"kwok-{versions()['KWOK_VERSION']}"
        if not (root / ".complete").exists():
            raise FileNotFoundError(f"not built: {root}; `make kube` builds it")
        return cls(root / "bin" / "kwok", root / "stages.yaml")

    def argv(self, kubeconfig: Path) -> list[str]:
        return [
            str(self.binary), f"--kubeconfig={kubeconfig}", f"--config={self.stages}",
            "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={MANAGED}",
            f"--cidr={FALLBACK_CIDR}",
            # Renew each node's Lease (as kwokctl has it do): without, the node lifecycle
            # controller finds the nodes unresponsive after 40 s and marks their pods NotReady.
            f"--node-lease-duration-seconds={LEASE_SECONDS}",
            # No --server-address: kwok serves no kubelet API (no logs or exec of fake pods),
            # so it listens on nothing.
        ]  # fmt: skip

    @staticmethod
    def environment(home: Path) -> dict[str, str]:
        """A HOME of the run's own: kwok reads ~/.kwok/kwok.yaml first when it exists."""
        home.mkdir(parents=True, exist_ok=True)
        return {"HOME": str(home), "PATH": "/usr/bin:/bin"}
