"""The operator's test plumbing in one place: a kmock cluster, the real kopf operator,
and the controllers Kubernetes would run (Jobs, Deployments) played by the tests.

- ``ClusterEmulator``: kmock 0.8 plus what kopf and the operator rely on and kmock
  lacks: uid, creationTimestamp, resourceVersion (bumped on every write), generation
  (bumped on spec changes), 422 for a failed JSON-patch ``test``, and injected faults.
- ``Cluster``: the emulator served from a background thread, with a small synchronous
  client for test code and the controller players (``complete_job``, ``run_pods``...).
- ``running_operator``: the real operator (``kopf run --standalone -A -m
  slogate_operator.handlers``) in kopf's KopfRunner thread, pointed at the cluster.
- ``eventually``: poll a condition; the timeout is a guard against hangs, never an
  assertion about speed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import itertools
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml
from kopf.testing import KopfRunner

from slogate_operator import metrics, names
from slogate_sidecar.app import build_sidecar, running
from slogate_sidecar.settings import SidecarSettings

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


@dataclass
class Fault:
    """Answer the next ``times`` requests of ``method`` on ``plural`` with ``status``."""

    method: str
    plural: str
    status: int
    times: int = 1


@dataclass
class RandomFaults:
    """Answer a seeded random ``share`` of the resource calls of ``agents`` (User-Agent
    prefixes: the operator's own client and kopf's) with one of ``statuses``. As a real API
    server, a 409 only ever answers a write (a read drawn for 409 gets a 500); discovery is
    spared, and watch streams unless ``watches`` (a broken watch delays kopf's events only)."""

    share: float
    seed: int
    statuses: tuple[int, ...] = (500, 409)
    agents: tuple[str, ...] = ("slogate-operator/", "kopf/")
    watches: bool = False
    blackout_after_create: str | None = None
    """Once an object of this plural is created, fail every call of ``agents`` with 500 from
    then on, as if the operator had died right after that create (until ``blackout`` is cleared)."""
    blackout: bool = False
    met: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    """(method, plural, status) of every call failed so far."""

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def status_for(self, request: kmock.Request) -> int | None:
        """The status to fail ``request`` with, or None to serve it."""
        plural = request.resource.plural if request.resource is not None else None
        if not plural or not request.headers.get("User-Agent", "").startswith(self.agents):
            return None
        if not self.watches and request.params.get("watch") in ("true", "1"):
            return None
        if self.blackout:
            status = 500
        elif self._rng.random() < self.share:
            status = self._rng.choice(self.statuses)
            if status == 409 and request.method.value == "GET":
                status = 500
        else:
            return None
        self.met[request.method.value, plural, status] += 1
        return status

    @property
    def failed(self) -> int:
        """How many calls were failed so far."""
        return sum(self.met.values())


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the object metadata a real API server maintains."""

    versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1))
    faults: list[Fault] = attrs.field(factory=list)
    chaos: RandomFaults | None = None
    created: list[tuple[str, str]] = attrs.field(factory=list)
    """(plural, name) of every create the emulator served successfully, in order."""

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None:
            self._inject_fault(request)
            data = request.data
            if request.action == kmock.action.CREATE and isinstance(data, dict):
                meta = data.setdefault("metadata", {})
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                meta["resourceVersion"] = str(next(self.versions))
                meta["generation"] = 1
            elif request.action == kmock.action.UPDATE and request.name:
                version = str(next(self.versions))
                spec_changed = self._touches_spec(request)
                if isinstance(data, dict):
                    meta = data.setdefault("metadata", {})
                    if isinstance(meta, dict):
                        meta["resourceVersion"] = version
                        if spec_changed:
                            meta["generation"] = self._generation(request) + 1
                elif isinstance(data, list):
                    data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
                    if spec_changed:
                        data.append(
                            {"op": "add", "path": "/metadata/generation", "value": self._generation(request) + 1}
                        )
        response = await super()._handle(request)
        if request.resource is not None and request.action == kmock.action.CREATE and response.status < 400:
            name = str(((request.data or {}).get("metadata") or {}).get("name") or "")
            self.created.append((request.resource.plural or "", name))
            if self.chaos is not None and self.chaos.blackout_after_create == request.resource.plural:
                self.chaos.blackout = True
        return response

    def _inject_fault(self, request: kmock.Request) -> None:
        for fault in self.faults:
            if fault.times > 0 and request.method.value == fault.method and request.resource.plural == fault.plural:
                fault.times -= 1
                raise kmock.KubernetesError(status=fault.status, reason="InjectedFault", message="injected by the test")
        status = self.chaos.status_for(request) if self.chaos is not None else None
        if status is not None:
            raise kmock.KubernetesError(status=status, reason="InjectedFault", message="injected at random by the test")

    def _touches_spec(self, request: kmock.Request) -> bool:
        if request.subresource == "status":
            return False
        if isinstance(request.data, dict):
            return "spec" in request.data
        if isinstance(request.data, list):
            return any(str(op.get("path", "")).startswith("/spec") for op in request.data)
        return False

    def _generation(self, request: kmock.Request) -> int:
        try:
            stored = self.objects[request.resource, request.namespace, request.name]
        except KeyError:
            return 0
        if stored.deleted:
            return 0
        return int(stored.get("metadata", {}).get("generation", 1))

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):  # as kube-apiserver: 422
            body = {"kind": "Status", "apiVersion": "v1", "code": 422, "status": "Failure",
                    "reason": "Invalid", "message": str(exc)}  # fmt: skip
            return aiohttp.web.json_response(body, status=422)
        return await super()._render_error(exc)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


class Cluster:
    """kmock in a background thread, and a synchronous client for the tests."""

    def __init__(self) -> None:
        self.loop = LoopThread()
        self.emulator, self._server = self.loop.run(self._start())
        self.url = str(self._server.url).rstrip("/")

    async def _start(self) -> tuple[ClusterEmulator, kmock.Server]:
        emulator = ClusterEmulator()
        await emulator.__aenter__()
        emulator.resources.load_bundled()
        crd = CRD["spec"]
        emulator.resources[f"{crd['group']}/{crd['versions'][0]['name']}/{crd['names']['plural']}"] = kmock.ResourceInfo(
            kind=crd["names"]["kind"], singular=crd["names"]["singular"], namespaced=True,
            shortnames=set(crd["names"]["shortNames"]), subresources={"status"},
            verbs={"get", "list", "watch", "create", "patch", "delete", "update"},
        )  # fmt: skip
        for plural, kind, namespaced in (("clusterkopfpeerings", "ClusterKopfPeering", False),
                                         ("kopfpeerings", "KopfPeering", True)):  # fmt: skip
            emulator.resources[f"kopf.dev/v1/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs={"get", "list", "watch", "create", "patch"}
            )
        server = kmock.Server(emulator)
        await server.__aenter__()
        return emulator, server

    def close(self) -> None:
        async def stop() -> None:
            await self._server.__aexit__(None, None, None)
            await self.emulator.__aexit__(None, None, None)

        with contextlib.suppress(Exception):
            self.loop.run(stop(), timeout=10)
        self.loop.stop()

    # ------------------------------------------------------------------ HTTP

    def request(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, method=method, data=data, headers={"Content-Type": content_type}
        )
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

    def list(self, collection: str, ns: str = NS) -> list[dict[str, Any]]:
        return list(self.request("GET", collection.format(ns=ns)).get("items") or [])

    def create(self, collection: str, body: dict[str, Any], ns: str = NS) -> dict[str, Any]:
        body.setdefault("metadata", {}).setdefault("namespace", ns)
        created: dict[str, Any] = self.request("POST", collection.format(ns=ns), body)
        return created

    def patch(self, collection: str, name: str, patch: dict[str, Any], ns: str = NS, sub: str = "") -> dict[str, Any]:
        path = f"{collection.format(ns=ns)}/{name}" + (f"/{sub}" if sub else "")
        patched: dict[str, Any] = self.request("PATCH", path, patch, "application/merge-patch+json")
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
            method = r.method.value
            if method == "GET":
                verb = "get" if r.name else ("watch" if r.params.get("watch") in ("true", "1") else "list")
            else:
                verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}.get(method, method)
            found.add((r.resource.group or "", resource, verb))
        return found

    # ------------------------------------------------------------------ the Job controller, played

    def job_pod(self, job_name: str, calibrator: dict[str, Any], phase: str, ns: str = NS) -> dict[str, Any]:
        """Create the Job's pod with the calibrator container in the given terminated state."""
        job = self.get(JOBS, job_name, ns)
        assert job is not None, f"no Job {job_name}"
        uid = job["metadata"]["uid"]
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{job_name}-{uuid.uuid4().hex[:5]}",
                "labels": dict(job["spec"]["template"]["metadata"]["labels"], **{
                    "job-name": job_name, "batch.kubernetes.io/job-name": job_name, "controller-uid": uid,
                }),
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": uid,
                                     "controller": True}],
            },
            "spec": job["spec"]["template"]["spec"],
            "status": {"phase": phase, "containerStatuses": [
                {"name": names.CALIBRATOR_CONTAINER, "ready": False, "restartCount": 0, "image": "slogate",
                 "imageID": "", "state": {"terminated": calibrator}},
            ]},
        }  # fmt: skip
        return self.create(PODS, pod, ns)

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
                 "state": {"running": {"startedAt": _now()}}}
                for c in template["spec"]["containers"]
            ]  # fmt: skip
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{deployment_name}-{index}-{uuid.uuid4().hex[:5]}",
                             "labels": dict(template["metadata"]["labels"])},
                "spec": template["spec"],
                "status": {"phase": "Running", "podIP": ip, "containerStatuses": statuses},
            }  # fmt: skip
            made.append(self.create(PODS, pod, ns)["metadata"]["name"])
        return made


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
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
                        "name": "model", "image": "ghcr.io/slogate/smollm2-gguf:0.1.2",
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
