"""The operator's test plumbing in one place: a cluster that behaves like kube-apiserver,
the real kopf operator, and the controllers Kubernetes would run (Jobs, Deployments)
played by the tests.

- ``ClusterEmulator`` (tests/kube_emulation.py): kmock 0.8 plus what a real API server
  does and kmock lacks: object metadata, RBAC for the operator's agents, defaulting,
  spec/status separation, label and field selectors, pod spec validation, no-op patches,
  custom resource defaulting and pruning; and the probes a kubelet could never pass.
- ``Cluster``: the emulator served from a background thread, with a small synchronous
  client for test code, the controller players (``complete_job``, ``run_pods``,
  ``write_deployment_status``...) and the counts of the operator's API calls.
- ``running_operator``: the real operator (``kopf run --standalone -A -m
  slogate_operator.handlers``) in kopf's KopfRunner thread, pointed at the cluster.
- ``eventually``: poll a condition; the timeout is a guard against hangs, never an
  assertion about speed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml
from kopf.testing import KopfRunner

from kube_emulation import RBAC_AGENTS, ClusterEmulator, Fault, RandomFaults, Refused, now
from kube_rules import KubeletProblem, rbac_verb
from ports import free_ports
from slogate_operator import metrics, names
from slogate_sidecar.app import build_sidecar, running
from slogate_sidecar.settings import SidecarSettings

__all__ = [  # what tests import from here, the emulator's names included
    "CONFIGMAPS", "CRD", "DEPLOYMENTS", "EVENTS", "JOBS", "NS", "OPERATOR_AGENT", "PODS", "POLICIES", "RBAC_AGENTS",
    "ROOT", "SCHEMA", "SECRETS", "ApiError", "Cluster", "ClusterEmulator", "Fault", "KubeletProblem", "RandomFaults",
    "Refused", "SidecarFleet", "admission_policy", "condition", "eventually", "job_names", "llama_deployment",
    "passes", "running_operator", "settle",
]  # fmt: skip

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
CRD_PATH = ROOT / "crds" / "admissionpolicies.slogate.dev.yaml"
CRD = yaml.safe_load(CRD_PATH.read_text())
SCHEMA: dict[str, Any] = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
"""The AdmissionPolicy openAPIV3Schema (OpenAPI 3.0: JSON-schema draft 4 with extensions)."""
POLICIES = "/apis/slogate.dev/v1alpha1/namespaces/{ns}/admissionpolicies"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"
JOBS = "/apis/batch/v1/namespaces/{ns}/jobs"
PODS = "/api/v1/namespaces/{ns}/pods"
CONFIGMAPS = "/api/v1/namespaces/{ns}/configmaps"
SECRETS = "/api/v1/namespaces/{ns}/secrets"
EVENTS = "/api/v1/namespaces/{ns}/events"
NS = "llm"
OPERATOR_AGENT = "slogate-operator/"
"""The User-Agent prefix of the operator's own API client (kopf's is "kopf/")."""


class LoopThread:
    """An asyncio loop in a daemon thread; ``run`` submits a coroutine and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:300]}")
        self.status = status
        self.body = body


class Cluster:
    """The emulated API server in a background thread, and a synchronous client for the tests.

    Kubelet problems (probes no kubelet could pass) fail the test at ``close()`` unless the
    test called ``allow_kubelet_problems()``; ``assert_kubelet_could_run()`` checks earlier.
    """

    def __init__(self) -> None:
        self.loop = LoopThread()
        self.emulator, self._server = self.loop.run(self._start())
        self.url = str(self._server.url).rstrip("/")
        self._kubelet_problems_allowed = False

    async def _start(self) -> tuple[ClusterEmulator, kmock.Server]:
        emulator = ClusterEmulator()
        await emulator.__aenter__()
        emulator.resources.load_bundled()
        crd = CRD["spec"]
        emulator.declare_custom(
            f"{crd['group']}/{crd['versions'][0]['name']}/{crd['names']['plural']}",
            kmock.ResourceInfo(
                kind=crd["names"]["kind"], singular=crd["names"]["singular"], namespaced=True,
                shortnames=set(crd["names"]["shortNames"]), subresources={"status"},
                verbs={"get", "list", "watch", "create", "patch", "delete", "update"},
            ),
            SCHEMA,
        )  # fmt: skip
        for plural, kind, namespaced in (("clusterkopfpeerings", "ClusterKopfPeering", False),
                                         ("kopfpeerings", "KopfPeering", True)):  # fmt: skip
            emulator.declare_custom(
                f"kopf.dev/v1/{plural}",
                kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs={"get", "list", "watch", "create", "patch"}),
            )
        server = kmock.Server(emulator)
        await server.__aenter__()
        return emulator, server

    def close(self) -> None:
        """Stop the server; then fail if a kubelet could not have run what was stored."""

        async def stop() -> None:
            await self._server.__aexit__(None, None, None)
            await self.emulator.__aexit__(None, None, None)

        with contextlib.suppress(Exception):
            self.loop.run(stop(), timeout=10)
        self.loop.stop()
        if not self._kubelet_problems_allowed:
            self.assert_kubelet_could_run()

    # ------------------------------------------------------------------ what a kubelet would meet

    @property
    def kubelet_problems(self) -> list[KubeletProblem]:
        """Probes of stored pod specs that no kubelet could pass, in the order first stored."""
        return list(self.emulator.kubelet_problems)

    def allow_kubelet_problems(self) -> None:
        """This test stores pod specs no kubelet could run on purpose: ``close()`` lets them be."""
        self._kubelet_problems_allowed = True

    def assert_kubelet_could_run(self) -> None:
        problems = self.kubelet_problems
        if problems:
            listed = "\n  ".join(str(p) for p in problems)
            raise AssertionError(f"{len(problems)} probe(s) no kubelet could pass:\n  {listed}")

    @property
    def forbidden(self) -> list[Refused]:
        """Requests of the operator's agents answered 403 (outside slogate_operator.rbac)."""
        return list(self.emulator.forbidden)

    # ------------------------------------------------------------------ HTTP

    def request(
        self, method: str, path: str, body: object = None, content_type: str = "application/json", agent: str = ""
    ) -> Any:
        """One call; ``agent`` sets the User-Agent (e.g. to call as the operator, under its RBAC)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} | ({"User-Agent": agent} if agent else {})
        request = urllib.request.Request(self.url + path, method=method, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, error.read().decode(errors="replace")) from None

    def get(self, collection: str, name: str, ns: str = NS) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.request("GET", f"{collection.format(ns=ns)}/{name}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    def list(self, collection: str, ns: str = NS, labels: str = "") -> list[dict[str, Any]]:
        query = f"?{urllib.parse.urlencode({'labelSelector': labels})}" if labels else ""
        return list(self.request("GET", collection.format(ns=ns) + query).get("items") or [])

    def create(self, collection: str, body: dict[str, Any], ns: str = NS) -> dict[str, Any]:
        body.setdefault("metadata", {}).setdefault("namespace", ns)
        created: dict[str, Any] = self.request("POST", collection.format(ns=ns), body)
        return created

    def patch(self, collection: str, name: str, patch: dict[str, Any], ns: str = NS, sub: str = "") -> dict[str, Any]:
        path = f"{collection.format(ns=ns)}/{name}" + (f"/{sub}" if sub else "")
        patched: dict[str, Any] = self.request("PATCH", path, patch, "application/merge-patch+json")
        return patched

    def json_patch(
        self, collection: str, name: str, ops: list[dict[str, Any]], ns: str = NS, sub: str = ""
    ) -> dict[str, Any]:
        path = f"{collection.format(ns=ns)}/{name}" + (f"/{sub}" if sub else "")
        patched: dict[str, Any] = self.request("PATCH", path, ops, "application/json-patch+json")
        return patched

    def delete(self, collection: str, name: str, ns: str = NS) -> None:
        self.request("DELETE", f"{collection.format(ns=ns)}/{name}")

    # ------------------------------------------------------------------ what was asked

    def calls(self, method: str, plural: str) -> list[kmock.Request]:
        """Requests the operator (and kopf) made, e.g. ``calls("POST", "jobs")``."""
        return [
            r for r in list(self.emulator._requests)
            if r.resource is not None and r.method.value == method and r.resource.plural == plural
        ]  # fmt: skip

    def verbs(self, exclude_agent: str = "") -> set[tuple[str, str, str]]:
        """(group, resource[/subresource], verb) of the API requests served so far, except
        those whose User-Agent starts with ``exclude_agent`` (this client's: urllib)."""
        found = set()
        for r in list(self.emulator._requests):
            if r.resource is None or r.resource.plural is None:
                continue
            if exclude_agent and r.headers.get("User-Agent", "").startswith(exclude_agent):
                continue
            resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
            found.add((r.resource.group or "", resource, rbac_verb(r.method.value, r.name, r.params)))
        return found

    def call_mark(self) -> int:
        """A point in the request log, for ``api_calls(since=..., until=...)``."""
        return len(self.emulator._requests)

    def api_calls(
        self, since: int = 0, until: int | None = None, agent: str = OPERATOR_AGENT
    ) -> Counter[tuple[str, str]]:
        """(verb, resource[/subresource]) of the API calls of ``agent`` (a User-Agent prefix;
        the operator's own client by default, "kopf/" for kopf's) between two marks."""
        found: Counter[tuple[str, str]] = Counter()
        for r in list(self.emulator._requests)[since:until]:
            if r.resource is None or r.resource.plural is None or not r.headers.get("User-Agent", "").startswith(agent):
                continue
            resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
            found[rbac_verb(r.method.value, r.name, r.params), resource] += 1
        return found

    # ------------------------------------------------------------------ the Job controller, played

    def _job_pod(self, job_name: str, ns: str) -> str:
        """Create a pod of the Job as the Job controller does: the template, owned by the Job."""
        job = self.get(JOBS, job_name, ns)
        assert job is not None, f"no Job {job_name}"
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{job_name}-{uuid.uuid4().hex[:5]}",
                "labels": dict(job["spec"]["template"]["metadata"]["labels"]),
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                     "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": job["spec"]["template"]["spec"],
        }  # fmt: skip
        return str(self.create(PODS, pod, ns)["metadata"]["name"])

    def job_pod(self, job_name: str, calibrator: dict[str, Any], phase: str, ns: str = NS) -> dict[str, Any]:
        """The Job's pod (as the Job controller), then its status with the calibrator container
        in the given terminated state (as the kubelet)."""
        name = self._job_pod(job_name, ns)
        status = {"phase": phase, "containerStatuses": [
            {"name": names.CALIBRATOR_CONTAINER, "ready": False, "restartCount": 0, "image": "slogate",
             "imageID": "", "state": {"terminated": calibrator}},
        ]}  # fmt: skip
        return self.patch(PODS, name, {"status": status}, ns, sub="status")

    def pending_job_pod(
        self, job_name: str, reason: str = "Unschedulable", message: str = "", ns: str = NS
    ) -> dict[str, Any]:
        """The Job's pod, created and left Pending by the scheduler (PodScheduled False with
        ``reason`` and ``message``, e.g. "0/3 nodes are available: 3 Insufficient cpu.")."""
        name = self._job_pod(job_name, ns)
        scheduled = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                     "lastTransitionTime": now()}  # fmt: skip
        status = {"phase": "Pending", "conditions": [scheduled]}
        return self.patch(PODS, name, {"status": status}, ns, sub="status")

    def complete_job(self, job_name: str, message: str, ns: str = NS) -> None:
        """The calibrator exited 0 with ``message`` as its termination message; the Job completes."""
        self.job_pod(job_name, {"exitCode": 0, "reason": "Completed", "message": message}, "Succeeded", ns)
        conditions = [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]
        self.patch(JOBS, job_name, {"status": {"succeeded": 1, "conditions": conditions}}, ns, sub="status")

    def fail_job(self, job_name: str, log_tail: str, reason: str = "BackoffLimitExceeded", ns: str = NS) -> None:
        """The calibrator failed (its log tail is the message); the Job fails with ``reason``."""
        self.job_pod(job_name, {"exitCode": 2, "reason": "Error", "message": log_tail}, "Failed", ns)
        failed = {
            "type": "Failed",
            "status": "True",
            "reason": reason,
            "message": "Job has reached the specified backoff limit",
        }
        self.patch(JOBS, job_name, {"status": {"failed": 1, "conditions": [failed]}}, ns, sub="status")

    # ------------------------------------------------------------------ the Deployment controller, played

    def run_pods(self, deployment_name: str, ips: list[str], ns: str = NS) -> list[str]:
        """Running pods of the Deployment's current template, one per IP; their sidecars run."""
        deployment = self.get(DEPLOYMENTS, deployment_name, ns)
        assert deployment is not None
        template = deployment["spec"]["template"]
        made = []
        for index, ip in enumerate(ips):
            statuses = [
                {"name": c["name"], "ready": False, "restartCount": 0, "image": c["image"], "imageID": "",
                 "state": {"running": {"startedAt": now()}}}
                for c in template["spec"]["containers"]
            ]  # fmt: skip
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{deployment_name}-{index}-{uuid.uuid4().hex[:5]}",
                             "labels": dict(template["metadata"]["labels"])},
                "spec": template["spec"],
            }  # fmt: skip
            name = self.create(PODS, pod, ns)["metadata"]["name"]
            status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "containerStatuses": statuses}
            self.patch(PODS, name, {"status": status}, ns, sub="status")
            made.append(name)
        return made

    def write_deployment_status(
        self,
        name: str,
        *,
        replicas: int | None = None,
        ready_replicas: int | None = None,
        observed_generation: int | None = None,
        conditions: list[dict[str, Any]] | None = None,
        ns: str = NS,
    ) -> dict[str, Any]:
        """The Deployment controller's status write, through /status (a status-only watch
        event, no new generation). Defaults: the spec's replicas, all ready, the current
        generation observed, Available and Progressing."""
        deployment = self.get(DEPLOYMENTS, name, ns)
        assert deployment is not None, f"no Deployment {name}"
        replicas = int(deployment["spec"].get("replicas", 1)) if replicas is None else replicas
        ready = replicas if ready_replicas is None else ready_replicas
        stamp = now()
        status: dict[str, Any] = {
            "observedGeneration": deployment["metadata"]["generation"] if observed_generation is None
            else observed_generation,
            "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready, "availableReplicas": ready,
            "conditions": conditions if conditions is not None else [
                {"type": "Available", "status": "True" if ready else "False", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability.", "lastUpdateTime": stamp, "lastTransitionTime": stamp},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                 "message": f'ReplicaSet "{name}" has successfully progressed.', "lastUpdateTime": stamp,
                 "lastTransitionTime": stamp},
            ],
        }  # fmt: skip
        if ready < replicas:
            status["unavailableReplicas"] = replicas - ready
        # A whole-status replacement, as the controller's UpdateStatus.
        return self.json_patch(DEPLOYMENTS, name, [{"op": "add", "path": "/status", "value": status}], ns, sub="status")


class SidecarFleet:
    """Real sidecars (the in-process app of slogate_sidecar) standing in for the pods' own:
    one per loopback address, all on the same admin port, as pods share a containerPort.

    ``mount_token`` and ``boot_thresholds`` do what the kubelet does with the Secret and
    ConfigMap volumes: put their content where the sidecar reads it.
    """

    def __init__(self, cluster: Cluster, upstream: str, workdir: Path) -> None:
        self.cluster = cluster
        self.upstream = upstream
        self.workdir = workdir
        self.admin_port = _free_port()
        self.token_file = workdir / "token"
        self.token_file.write_text("")  # an empty token refuses every push until the Secret is mounted
        self.urls: dict[str, str] = {}
        self._stacks: list[contextlib.AsyncExitStack] = []

    def start(self, ip: str, thresholds_json: str | None = None) -> None:
        thresholds = self.workdir / f"thresholds-{ip}.json"
        if thresholds_json is not None:
            thresholds.write_text(thresholds_json)
        settings = SidecarSettings(
            upstream=self.upstream, host=ip, port=0, admin_port=self.admin_port, thresholds_file=thresholds,
            admin_token_file=self.token_file, poll_interval_s=0.5,
        )  # fmt: skip

        async def serve() -> contextlib.AsyncExitStack:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(running(build_sidecar(settings)))
            return stack

        self._stacks.append(self.cluster.loop.run(serve()))
        self.urls[ip] = f"http://{ip}:{self.admin_port}"

    def mount_token(self, secret_name: str = "slogate-admin-token", ns: str = NS) -> None:
        secret = eventually(lambda: self.cluster.get(SECRETS, secret_name, ns), what="the admin token Secret")
        self.token_file.write_text(base64.b64decode(secret["data"]["token"]).decode())

    def state(self, ip: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.urls[ip] + "/slogate/v1/state", timeout=10) as response:
            found: dict[str, Any] = json.loads(response.read())
            return found

    def close(self) -> None:
        for stack in reversed(self._stacks):
            with contextlib.suppress(Exception):
                self.cluster.loop.run(stack.aclose(), timeout=10)


def _free_port() -> int:
    (port,) = free_ports()
    return port


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


TEST_SETTINGS = {
    "STANDALONE": "true",
    "RESYNC_SECONDS": "0.5",
    "ERROR_BACKOFF_SECONDS": "0.2",
    "CALIBRATION_RETRY_SECONDS": "1",
    "PUSH_ATTEMPTS": "2",
    "PUSH_BACKOFF_SECONDS": "0.05",
    "PUSH_TIMEOUT_SECONDS": "2",
    "API_BACKOFF_SECONDS": "0.05",
    "METRICS_PORT": "0",
    "LIVENESS_PORT": "0",
    "IMAGE": "slogate:test",
    "STARTUP_JITTER_SECONDS": "0",
}


@contextlib.contextmanager
def running_operator(cluster: Cluster, **settings: str) -> Iterator[KopfRunner]:
    """The real operator, in kopf's test runner thread, against the cluster."""
    env = {f"SLOGATE_OPERATOR_{k}": v for k, v in {**TEST_SETTINGS, **settings}.items()}
    env["SLOGATE_OPERATOR_KUBE_API"] = cluster.url
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        with KopfRunner(["run", "--standalone", "-A", "-m", "slogate_operator.handlers"], timeout=30) as runner:
            yield runner
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def eventually(check: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``check`` until it returns something truthy; fail with its last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, KeyError, TypeError, IndexError) as problem:
            last = problem
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"never happened{': ' + what if what else ''}; last seen: {last!r}")


def condition(policy: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    """A condition of a policy's status, or {} if absent."""
    for found in ((policy or {}).get("status") or {}).get("conditions") or ():
        if found.get("type") == kind:
            return dict(found)
    return {}


def passes(name: str, ns: str = NS) -> float:
    """Completed reconcile passes of a policy (the operator runs in this process)."""
    value = metrics.REGISTRY.get_sample_value(
        "slogate_operator_reconciles_total", {"namespace": ns, "policy": name, "result": "ok"}
    )
    return value or 0.0


def settle(name: str, ns: str = NS, more: int = 2) -> None:
    """Wait until the operator has run ``more`` further passes over the policy."""
    target = passes(name, ns) + more
    eventually(lambda: passes(name, ns) >= target, what=f"{more} more reconcile passes of {ns}/{name}")


def job_names(cluster: Cluster, ns: str = NS) -> list[str]:
    return sorted(j["metadata"]["name"] for j in cluster.list(JOBS, ns))
