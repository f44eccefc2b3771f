"""The emulated API server (tests/kube_emulation.py) served from a background thread, with a
small synchronous client for test code and the accounting of the API calls it received.

Kubelet problems (probes no kubelet could pass) fail the test at ``Cluster.close()`` unless
the test called ``allow_kubelet_problems()``; ``assert_kubelet_could_run()`` checks earlier.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import kmock

from kube_emulation import ClusterEmulator, Refused
from kube_rules import KubeletProblem, rbac_verb
from project_files import CRD, SCHEMA

T = TypeVar("T")
POLICIES = "/apis/slogate.dev/v1alpha1/namespaces/{ns}/admissionpolicies"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"
JOBS = "/apis/batch/v1/namespaces/{ns}/jobs"
PODS = "/api/v1/namespaces/{ns}/pods"
CONFIGMAPS = "/api/v1/namespaces/{ns}/configmaps"
SECRETS = "/api/v1/namespaces/{ns}/secrets"
EVENTS = "/api/v1/namespaces/{ns}/events"
SCALED_OBJECTS = "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects"
HPAS = "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers"
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
    """The emulated API server in a background thread, and a synchronous client for the tests."""

    def __init__(self) -> None:
        self.loop = LoopThread()
        self.emulator, self.server = self.loop.run(self._start())
        self.url = str(self.server.url).rstrip("/")
        self._kubelet_problems_allowed = False

    @staticmethod
    async def _start() -> tuple[ClusterEmulator, kmock.Server]:
        emulator = ClusterEmulator()
        await emulator.__aenter__()
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
        server = kmock.Server(emulator.handler)
        await server.__aenter__()
        return emulator, server

    def install_keda(self, schema: dict[str, Any] | None = None) -> None:
        """Serve KEDA's ScaledObject, as its CRD does once installed (``schema``: its
        openAPIV3Schema, for defaulting and pruning; None: stored as sent). Until then every
        request on keda.sh is 404, as on a cluster without KEDA."""

        async def declare() -> None:
            self.emulator.declare_custom(
                "keda.sh/v1alpha1/scaledobjects",
                kmock.ResourceInfo(
                    kind="ScaledObject", singular="scaledobject", namespaced=True, shortnames={"so"},
                    subresources={"status"}, verbs={"get", "list", "watch", "create", "patch", "delete", "update"},
                ),
                schema,
            )  # fmt: skip

        self.loop.run(declare())

    def close(self) -> None:
        """Stop the server; then fail if a kubelet could not have run what was stored."""

        async def stop() -> None:
            await self.server.__aexit__(None, None, None)
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

    def received(self) -> list[kmock.Request]:
        """Every request the server received so far, in order (kmock's request log)."""
        return list(self.emulator.handler)

    def calls(self, method: str, plural: str) -> list[kmock.Request]:
        """Requests the operator (and kopf) made, e.g. ``calls("POST", "jobs")``."""
        return [
            r for r in self.received()
            if r.resource is not None and r.method.value == method and r.resource.plural == plural
        ]  # fmt: skip

    def verbs(self, exclude_agent: str = "") -> set[tuple[str, str, str]]:
        """(group, resource[/subresource], verb) of the API requests served so far, except
        those whose User-Agent starts with ``exclude_agent`` (this client's: urllib)."""
        found = set()
        for r in self.received():
            if r.resource is None or r.resource.plural is None:
                continue
            if exclude_agent and r.headers.get("User-Agent", "").startswith(exclude_agent):
                continue
            resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
            found.add((r.resource.group or "", resource, rbac_verb(r.method.value, r.name, r.params)))
        return found

    def call_mark(self) -> int:
        """A point in the request log, for ``api_calls(since=..., until=...)``."""
        return len(self.received())

    def api_calls(
        self, since: int = 0, until: int | None = None, agent: str = OPERATOR_AGENT
    ) -> Counter[tuple[str, str]]:
        """(verb, resource[/subresource]) of the API calls of ``agent`` (a User-Agent prefix;
        the operator's own client by default, "kopf/" for kopf's) between two marks."""
        found: Counter[tuple[str, str]] = Counter()
        for r in self.received()[since:until]:
            if r.resource is None or r.resource.plural is None or not r.headers.get("User-Agent", "").startswith(agent):
                continue
            resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
            found[rbac_verb(r.method.value, r.name, r.params), resource] += 1
        return found
