"""A fleet of fake nodes and the 200-pod llama-server Deployment that runs on them, and what
test_fleet_rollout.py reads of the operator while it rolls: its reconcile passes (its own
Prometheus counter, through the API server's pod proxy), its API calls (the API server's
audit log) and every pod the Deployment's ReplicaSets create (a watch).

The fake nodes are played by kwok (e2e/kube/kwok.py): annotated and tainted so kwok plays
them and nothing but the fleet lands there, with pod ranges in 127.0.0.0/8 so whatever tries
a fake pod's address (the operator's threshold pushes) stays on a loopback.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cluster_tools import CommandError, Kube, metric_sum
from kwok import MANAGED
from suite import RELEASE, RELEASE_NAMESPACE, Example
from workload_state import PEERING, WRITES, audit_mark, operator_calls

from slogate_operator.settings import OperatorSettings

NAMESPACE = "slogate-fleet"
NAME = "fleet"
"""The Deployment's and the policy's name."""
SELECTOR = f"app.kubernetes.io/name={NAME}"
REPLICAS = 200
NODES = 3
NODE_PODS = 110
"""Each node's allocatable pods (the kubelet's default): 3 x 110 hold 200 pods and the 50 a
rollout surges (maxSurge 25%)."""
FAKE = dict([MANAGED.split("=")])
TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
OPERATOR_PODS = "app.kubernetes.io/component=operator"


def node_name(index: int) -> str:
    return f"kwok-fleet-{index}"


def fake_node(index: int) -> dict[str, Any]:
    """A node for kwok alone: its pods get 127.0.<20+i>.x, its own address is 127.0.19.<i+1>."""
    cidr = f"127.0.{20 + index}.0/24"
    resources = {"cpu": "64", "memory": "512Gi", "pods": str(NODE_PODS)}
    name = node_name(index)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {**FAKE, "node.alpha.kubernetes.io/ttl": "0"},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **FAKE}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": [TAINT]},
        "status": {"allocatable": resources, "capacity": resources,
                   "addresses": [{"type": "InternalIP", "address": f"127.0.19.{index + 1}"}]},
    }  # fmt: skip


def fleet_documents(example: Example) -> tuple[dict[str, Any], dict[str, Any]]:
    """The example's Deployment and policy, renamed, with no replica yet and no placement: the
    policy's calibration Job copies the pod's nodeSelector and tolerations, and has to run on
    the real node (the real llama-server and model). Placement is not in the fingerprint, so
    `to_the_fleet` moves the pods onto the fake nodes without a recalibration."""
    deployment = copy.deepcopy(example.one("Deployment"))
    labels = {"app.kubernetes.io/name": NAME}
    deployment["metadata"] = {"name": NAME, "labels": labels}
    deployment["spec"]["replicas"] = 0
    deployment["spec"]["selector"] = {"matchLabels": labels}
    deployment["spec"]["template"]["metadata"]["labels"] = labels
    policy = copy.deepcopy(example.one("AdmissionPolicy"))
    policy["metadata"] = {"name": NAME}
    policy["spec"]["targetRef"]["name"] = NAME
    return deployment, policy


def to_the_fleet() -> dict[str, Any]:
    """The merge patch that scales the Deployment to REPLICAS pods on the fake nodes only."""
    return {"spec": {"replicas": REPLICAS, "template": {"spec": {"nodeSelector": FAKE, "tolerations": [
        {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]}]}}}}  # fmt: skip


# ------------------------------------------------------------------------------ the operator


def operator_settings(kube: Kube) -> OperatorSettings:
    """The settings the operator runs with: its container's environment, as it reads it."""
    deployment = kube.json("-n", RELEASE_NAMESPACE, "get", "deployment", f"{RELEASE}-operator", hint="helm status")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    env = {e["name"]: e["value"] for e in container.get("env") or () if "value" in e}
    return OperatorSettings.from_env(env)


def operator_pods(kube: Kube) -> list[dict[str, Any]]:
    return kube.json("-n", RELEASE_NAMESPACE, "get", "pods", "-l", OPERATOR_PODS, hint="kubectl get pods")["items"]


def passes(kube: Kube, settings: OperatorSettings) -> Counter[str]:
    """The fleet policy's reconcile passes (ok and error) by operator pod: one leads, and the
    sum stays right when the lead moves, as long as no operator pod restarts."""
    made: Counter[str] = Counter()
    for pod in operator_pods(kube):
        name = pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods/{name}:{settings.metrics_port}/proxy/metrics"
        text = kube("get", "--raw", path, hint="the operator's metrics port (the chart's)")
        made[name] = metric_sum(text, "slogate_operator_reconciles_total", namespace=NAMESPACE, policy=NAME)
    return made


def restarts(kube: Kube) -> int:
    return sum(int(s.get("restartCount") or 0) for p in operator_pods(kube)
               for s in p["status"].get("containerStatuses") or ())  # fmt: skip


def push_warnings(kube: Kube, since_s: float) -> int:
    """The operator's log lines of the last `since_s` about a sidecar without its thresholds
    (push.py logs one per failed push)."""
    count = 0
    for pod in operator_pods(kube):
        text = kube("-n", RELEASE_NAMESPACE, "logs", pod["metadata"]["name"], f"--since={int(since_s)}s",
                    hint=f"kubectl -n {RELEASE_NAMESPACE} logs", timeout_s=120)  # fmt: skip
        count += sum("does not have thresholds" in line for line in text.splitlines())
    return count


def calls_by_pod(kube: Kube, since: int) -> Counter[tuple[str, str, str]]:
    """The operator's calls after `since` as (operator pod, verb, resource), the pod told by
    the call's source address: the one that leads makes the passes, either one may answer
    the injection webhook (the API server picks an endpoint of its Service)."""
    by_ip = {p["status"].get("podIP"): p["metadata"]["name"] for p in operator_pods(kube)}
    calls: Counter[tuple[str, str, str]] = Counter()
    for call in operator_calls(kube, since=since):
        calls[(by_ip.get(call["source"], "another pod"), call["verb"], call["resource"])] += 1
    return calls


@dataclass(frozen=True)
class Window:
    """What the operator did between two moments: passes and API calls, by operator pod."""

    seconds: float
    passes: Counter[str]
    calls: Counter[tuple[str, str, str]]

    @property
    def total_passes(self) -> float:
        return sum(self.passes.values())

    def line(self) -> str:
        by_call: Counter[tuple[str, str]] = Counter()
        for (_, verb, resource), n in self.calls.items():
            by_call[(verb, resource)] += n
        listed = ", ".join(f"{verb} {resource} x{n}" for (verb, resource), n in sorted(by_call.items()))
        pods = sorted({pod for pod, _, _ in self.calls} | set(self.passes))
        each = "; ".join(
            f"{pod}: {self.passes[pod]:g} passes, "
            + ", ".join(f"{verb} {resource} x{n}" for (p, verb, resource), n in sorted(self.calls.items()) if p == pod)
            for pod in pods
        )
        return (f"{self.total_passes:g} passes, {sum(self.calls.values())} API calls in {self.seconds:.0f} s: "
                f"{listed}\n    by operator pod: {each}")  # fmt: skip


@dataclass
class Meter:
    """A window opened now: `close()` reads the passes and the calls since."""

    kube: Kube
    settings: OperatorSettings
    started: float = field(default_factory=time.monotonic)
    mark: int = 0
    before: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.mark, self.before = audit_mark(self.kube), passes(self.kube, self.settings)

    def close(self) -> Window:
        made = passes(self.kube, self.settings)
        made.subtract(self.before)
        return Window(time.monotonic() - self.started, made, calls_by_pod(self.kube, self.mark))


def wait_for_quiet(kube: Kube, quiet_s: float, *, limit_s: float) -> bool:
    """Until the operator has written nothing (kopf's peering keepalive aside) for `quiet_s`
    (a wait, never a measurement); False when `limit_s` ran out first."""
    deadline, last_write, mark = time.monotonic() + limit_s, time.monotonic(), audit_mark(kube)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        calls = operator_calls(kube, since=mark)
        mark = audit_mark(kube)
        if any(c["verb"] in WRITES and c["resource"] not in PEERING for c in calls):
            last_write = time.monotonic()
        elif time.monotonic() - last_write >= quiet_s:
            return True
    return False


# ------------------------------------------------------------------------------ the pods


class PodWatch:
    """Every pod of the Deployment as created: name, pod-template-hash, container names. A
    pod's containers never change after its admission, so its first event shows whether the
    webhook injected the gate.

    A list, then a watch from the list's resourceVersion (``kubectl get --raw``: one JSON event
    per line), resumed from the last version seen whenever the API server ends it. It does
    end one on a busy machine: "Forcing pods watcher close due to unresponsiveness" when the
    reader falls behind a 200-pod rollout, and `kubectl get -w` then simply exits, which once
    left this watch blind after the first new pod. Only a 410 (the version compacted away)
    lists again; ``rewatches`` counts the resumptions."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.pods: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        self.rewatches = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._process: subprocess.Popen[str] | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def _record(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        names = tuple(c["name"] for c in (pod.get("spec") or {}).get("containers") or ())
        rs_hash = (meta.get("labels") or {}).get("pod-template-hash", "")
        if meta.get("uid"):
            with self._lock:
                self.pods.setdefault(meta["uid"], (meta.get("name", ""), rs_hash, names))

    def _run(self) -> None:
        version = ""
        while not self._stopping.is_set():
            # A list that failed, or a line cut short by a dying kubectl: again from `version`.
            with contextlib.suppress(CommandError, json.JSONDecodeError, KeyError):
                version = self._watch(version)
            if not self._stopping.is_set():
                self.rewatches += 1
                time.sleep(0.5)

    def _watch(self, version: str) -> str:
        """One list (when ``version`` is empty) and one watch; the version to resume from."""
        if not version:
            listing = self.kube.json("-n", NAMESPACE, "get", "pods", "-l", SELECTOR, hint="kubectl get pods")
            for pod in listing["items"]:
                self._record(pod)
            version = listing["metadata"]["resourceVersion"]
        query = urllib.parse.urlencode(
            {"watch": 1, "allowWatchBookmarks": "true", "labelSelector": SELECTOR, "resourceVersion": version}
        )
        with self._lock:
            if self._stopping.is_set():
                return version
            self._process = subprocess.Popen(
                ["kubectl", f"--kubeconfig={self.kube.kubeconfig}", "get", "--raw",
                 f"/api/v1/namespaces/{NAMESPACE}/pods?{query}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
        process = self._process
        assert process.stdout is not None
        try:
            for line in process.stdout:
                event = json.loads(line)
                if event["type"] == "ERROR":  # a Status: 410 Gone means list again
                    return "" if event["object"].get("code") == 410 else version
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    self._record(event["object"])
            return version
        finally:
            process.terminate()
            process.wait()

    def seen(self) -> dict[str, tuple[str, str, tuple[str, ...]]]:
        with self._lock:
            return dict(self.pods)

    def close(self) -> None:
        with self._lock:
            self._stopping.set()
            process = self._process
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def newest_hash(kube: Kube) -> str:
    """The pod-template-hash of the Deployment's newest ReplicaSet (its revision annotation)."""
    sets = kube.json("-n", NAMESPACE, "get", "rs", "-l", SELECTOR, hint="kubectl get rs")
    newest = max(sets["items"], key=lambda r: int(r["metadata"]["annotations"]["deployment.kubernetes.io/revision"]))
    return str(newest["metadata"]["labels"]["pod-template-hash"])


def fleet_pods(kube: Kube) -> list[dict[str, Any]]:
    """The Deployment's pods that are not on their way out."""
    pods = kube.json("-n", NAMESPACE, "get", "pods", "-l", SELECTOR, hint="kubectl get pods")
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
