"""Two releases of slogate on the real cluster, and what a change of release does to the
target's pods: test_operator_upgrade.py's parts.

The previous release is the commit whose image build-images.sh built as `slogate:<commit>`
(it lists it in images.txt); its chart is taken from the same commit with `git archive`,
so the image and the chart can never be of two different versions. A clone without that
commit fails here, as build-images.sh does: the suite never skips the upgrade.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_tools import CommandError, Kube, run
from control_plane import cache_dir
from suite import APP_NAMESPACE, E2E, RELEASE, RELEASE_NAMESPACE, REPO, SLOGATE_IMAGE, Example, seconds
from workload_state import SIDECAR, container_names

REVISION = "deployment.kubernetes.io/revision"
"""The Deployment controller's count of the template's rollouts (kept on a reused ReplicaSet too)."""
OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"
CURRENT_CHART = REPO / "charts" / "slogate"


@dataclass(frozen=True)
class Release:
    """A chart and the image its operator and sidecars run."""

    name: str
    chart: Path
    image: str

    @property
    def tag(self) -> str:
        return self.image.rsplit(":", 1)[1]


def current_release() -> Release:
    return Release("current", CURRENT_CHART, SLOGATE_IMAGE)


def previous_release(workdir: Path) -> Release:
    """The previous release: its image as build-images.sh listed it, its chart from `git archive`."""
    listed = (cache_dir() / "images" / "images.txt").read_text().split()
    found = [n for n in listed if n.startswith("slogate:") and n != SLOGATE_IMAGE]
    if len(found) != 1:
        raise CommandError(f"images.txt lists {found} as the previous release's image (one expected): "
                           f"`make kube-images` builds it (e2e/kube/build-images.sh, PREVIOUS)")  # fmt: skip
    commit = found[0].split(":", 1)[1]
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "charts/slogate"],
                             capture_output=True, check=False)  # fmt: skip
    if archive.returncode != 0:
        raise CommandError(f"the previous release's chart: `git archive {commit}` failed: "
                           f"{archive.stderr.decode(errors='replace').strip()} (fetch the commit: "
                           f"git fetch --unshallow)")  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(workdir, filter="data")
    return Release(commit, workdir / "charts" / "slogate", found[0])


def helm_upgrade(kube: Kube, release: Release) -> None:
    """`helm upgrade` of the suite's release to this chart and image, as a platform team rolls
    back or forward: the suite's values, the image tag set, waited for."""
    run(["helm", "upgrade", RELEASE, str(release.chart), "--kubeconfig", str(kube.kubeconfig),
         "--namespace", RELEASE_NAMESPACE, "-f", str(E2E / "values.yaml"), "--set", f"image.tag={release.tag}",
         "--wait", "--timeout", f"{int(seconds(300))}s"],
        hint=f"helm history {RELEASE} -n {RELEASE_NAMESPACE}; kubectl -n {RELEASE_NAMESPACE} describe pods",
        timeout_s=seconds(420))  # fmt: skip


def operator_images(kube: Kube) -> list[str]:
    """The image of every operator pod that runs (not on its way out)."""
    pods = kube.json("-n", RELEASE_NAMESPACE, "get", "pods", "-l", OPERATOR_SELECTOR, hint="kubectl get pods")
    return sorted(c["image"] for p in pods["items"] if not p["metadata"].get("deletionTimestamp")
                  for c in p["spec"]["containers"])  # fmt: skip


def revision(deployment: dict[str, Any]) -> int:
    return int((deployment["metadata"].get("annotations") or {}).get(REVISION, "0"))


def calibration_jobs(kube: Kube, example: Example) -> set[str]:
    """The policy's calibration Jobs (owned by it)."""
    jobs = kube.json("-n", APP_NAMESPACE, "get", "jobs", hint="kubectl get jobs")["items"]
    return {j["metadata"]["name"] for j in jobs
            if any(r["kind"] == "AdmissionPolicy" and r["name"] == example.policy
                   for r in j["metadata"].get("ownerReferences") or ())}  # fmt: skip


def policy_events(kube: Kube, example: Example, reason: str) -> list[str]:
    """The messages of the policy's Events of that reason (the operator posts them on the policy)."""
    events = kube.json("-n", APP_NAMESPACE, "get", "events", "--field-selector", f"reason={reason}",
                       hint="kubectl get events")["items"]  # fmt: skip
    return [e.get("message", "") for e in events
            if (e.get("involvedObject") or {}).get("name") == example.policy]  # fmt: skip


def webhook_entries(kube: Kube) -> list[str] | None:
    """The names of the chart's MutatingWebhookConfiguration's entries; None without it."""
    found = kube.maybe_json("get", "mutatingwebhookconfiguration", f"{RELEASE}-injector")
    return None if found is None else [w["name"] for w in found.get("webhooks") or ()]


# ------------------------------------------------------------------------------ the pods' history


@dataclass
class PodSeen:
    gated: bool
    """Has the sidecar container (a pod's containers never change)."""
    sidecar_image: str | None
    versions: int = 0
    ready_versions: int = 0


@dataclass
class PodHistory:
    """Every version of the target's pods that the API server stored while it ran: a
    `kubectl get --watch` (each change of a pod is an event), not a poll that could miss a
    pod that was Ready for a moment. `ungated_ready` names the pods ever Ready without the
    gate; a pod's containers cannot change, so a pod is gated or not for its whole life."""

    kube: Kube
    selector: str
    pods: dict[str, PodSeen] = field(default_factory=dict)
    watches: int = 0
    """How many watches ran (one unless the server ended one: each starts with a full list)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _process: subprocess.Popen[str] | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _synced: threading.Event = field(default_factory=threading.Event)

    def start(self) -> PodHistory:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._synced.wait(seconds(60)):
            raise CommandError(f"kubectl get pods --watch -l {self.selector} printed nothing in 60 s")
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._process is not None:
            self._process.terminate()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stopping.is_set():  # a watch the server ends is started again
            self.watches += 1
            self._process = subprocess.Popen(
                ["kubectl", f"--kubeconfig={self.kube.kubeconfig}", "-n", APP_NAMESPACE, "get", "pods", "-l",
                 self.selector, "--watch", "-o", "json"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            assert self._process.stdout is not None
            for pod in _objects(self._process.stdout):
                self._note(pod)
                self._synced.set()
            self._process.wait()
            self._stopping.wait(1)  # not a busy loop while the API server is away

    def _note(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        sidecars = [c["image"] for c in pod["spec"]["containers"] if c["name"] == SIDECAR]
        # A pod on its way out is no endpoint a client is sent to: the ungated pods of the
        # state before (deleted already when the watch starts) are no finding.
        ready = not pod["metadata"].get("deletionTimestamp") and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or ()
        )
        with self._lock:
            seen = self.pods.setdefault(name, PodSeen(SIDECAR in container_names(pod), next(iter(sidecars), None)))
            seen.versions += 1
            seen.ready_versions += ready

    @property
    def ungated_ready(self) -> list[str]:
        with self._lock:
            return sorted(n for n, s in self.pods.items() if not s.gated and s.ready_versions)

    def summary(self) -> str:
        with self._lock:
            pods = dict(self.pods)
        images: dict[str, int] = {}
        for seen in pods.values():
            key = seen.sidecar_image or "(no sidecar)"
            images[key] = images.get(key, 0) + 1
        return (f"{sum(s.versions for s in pods.values())} pod versions of {len(pods)} pods in {self.watches} "
                f"watch(es); pods by sidecar image: {dict(sorted(images.items()))}; ever Ready ungated: "
                f"{sorted(n for n, s in pods.items() if not s.gated and s.ready_versions)}")  # fmt: skip


def _objects(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The objects kubectl's JSON printer writes one after another: each ends with a `}` of its own line."""
    buffer: list[str] = []
    for line in lines:
        buffer.append(line)
        if line.rstrip("\n") == "}":
            yield json.loads("".join(buffer))
            buffer = []
