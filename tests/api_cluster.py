"""One test's view of the real API server (tests/api_server.py: etcd and kube-apiserver on
127.0.0.1, once per test process, envtest's way: no controllers and no node, so the tests play
the Job and Deployment controllers in tests/workload_controllers.py).

Each ``Cluster`` puts a fresh tests/api_proxy.py in front (its own call log, faults and chaos),
gives test code a synchronous client, and on ``close()`` deletes every object the test and the
operator created, so the next test starts from empty namespaces. Kubelet problems (probes no
kubelet could pass) fail the test at ``close()`` unless it called ``allow_kubelet_problems()``.
``create`` makes the namespace it writes to, once, with its ``default`` ServiceAccount, as a
namespace controller would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from api_proxy import ApiProxy, Call, Refused, Resource
from api_server import (
    CRDS,
    NS,
    WEBHOOK_CONFIGURATIONS,
    ApiError,
    ControlPlaneProcess,
    call,
    empty_webhook_configuration,
    operator_cluster_role,
    wait_for,
)
from kube_faults import Fault, RandomFaults
from kubelet_lint import KubeletProblem
from project_files import CRD

__all__ = ["ApiError", "Call", "Cluster", "Fault", "RandomFaults", "Refused"]
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
CLUSTER_ROLE = "/apis/rbac.authorization.k8s.io/v1/clusterroles/slogate-operator"
OPERATOR_AGENT = "slogate-operator/"
"""The User-Agent prefix of the operator's own API client (kopf's is "kopf/")."""
KEDA_CRD = "scaledobjects.keda.sh"


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


class Cluster:
    """One test's view of the real API server: its proxy, a client, and the cleanup after it."""

    def __init__(self) -> None:
        self.process = ControlPlaneProcess.get()
        self.admin = self.process.admin
        self.loop = LoopThread()
        self.proxy = ApiProxy(self.process.plane.server, self.process.tls)
        self.loop.run(self.proxy.start())
        self.url = self.proxy.url
        self._kubelet_problems_allowed = False
        self._keda = False
        self._narrowed = False
        self._closed = False

    # ------------------------------------------------------------------ faults, on cue

    @property
    def faults(self) -> list[Fault]:
        """Faults the proxy answers instead of the server (append to inject one)."""
        return self.proxy.faults

    @faults.setter
    def faults(self, value: list[Fault]) -> None:
        self.proxy.faults = value

    @property
    def chaos(self) -> RandomFaults | None:
        return self.proxy.chaos

    @chaos.setter
    def chaos(self, value: RandomFaults | None) -> None:
        self.proxy.chaos = value

    @property
    def created(self) -> list[tuple[str, str]]:
        """(plural, name) of every create the server accepted, in order."""
        return list(self.proxy.created)

    def grant_only(self, keep: Callable[[dict[str, Any]], bool] | None) -> None:
        """Narrow the operator's ClusterRole to the rules ``keep(rule)`` accepts; None: the
        whole table again (as ``close()`` restores it)."""
        role = operator_cluster_role()
        role["rules"] = [r for r in role["rules"] if keep is None or keep(r)]
        self.admin("PUT", CLUSTER_ROLE, role)
        self._narrowed = True

    def install_keda(self, schema: dict[str, Any] | None = None) -> None:
        """Install KEDA's ScaledObject CRD (``schema``: its openAPIV3Schema; None: any object).
        Until then every request on keda.sh is 404, as on a cluster without KEDA; removed at close."""
        version: dict[str, Any] = {
            "name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }  # fmt: skip
        self.admin.install_crd({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": KEDA_CRD},
            "spec": {"group": "keda.sh", "scope": "Namespaced", "versions": [version],
                     "names": {"kind": "ScaledObject", "listKind": "ScaledObjectList", "plural": "scaledobjects",
                               "singular": "scaledobject", "shortNames": ["so"]}},
        })  # fmt: skip
        self._keda = True

    @contextlib.contextmanager
    def policy_crd_without_rules(self) -> Iterator[None]:
        """The AdmissionPolicy CRD, for a while, with a spec of any shape (no schema, no CEL),
        as an older CRD would have stored what today's refuses; restored on leaving."""
        loose = copy.deepcopy(CRD)
        properties = loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        properties["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        try:
            self._replace_policy_crd(loose, refuses_invalid=False)
            yield
        finally:
            self._replace_policy_crd(copy.deepcopy(CRD), refuses_invalid=True)

    def _replace_policy_crd(self, crd: dict[str, Any], *, refuses_invalid: bool) -> None:
        name = crd["metadata"]["name"]
        crd["metadata"]["resourceVersion"] = self.admin("GET", f"{CRDS}/{name}")["metadata"]["resourceVersion"]
        self.admin("PUT", f"{CRDS}/{name}", crd)
        invalid = {"apiVersion": "slogate.dev/v1alpha1", "kind": "AdmissionPolicy",
                   "metadata": {"name": "schema-probe", "namespace": NS}, "spec": {"slo": {"ttftSeconds": -1}}}  # fmt: skip

        def in_force() -> bool:
            """The server's verdict on an invalid spec (a dry run) is the one this CRD gives."""
            try:
                self.admin("POST", POLICIES.format(ns=NS) + "?dryRun=All", invalid)
            except ApiError as error:
                if error.status == 429:  # storage is (re)initializing
                    return False
                return refuses_invalid and error.status == 422
            return not refuses_invalid

        wait_for(f"CRD {name} in force", in_force, timeout_s=60)

    # ------------------------------------------------------------------ the end of a test

    def close(self) -> None:
        """Stop the proxy, delete what the test made; then fail if a kubelet could not have
        run what was stored."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.loop.run(self.proxy.stop(), timeout=10)
        self.loop.stop()
        self.clean()
        if not self._kubelet_problems_allowed:
            self.assert_kubelet_could_run()

    def clean(self) -> None:
        # The operator's webhook entries first: they would send the next test's pods to a
        # webhook that is gone (failurePolicy Fail).
        self.admin("PATCH", f"{WEBHOOK_CONFIGURATIONS}/{empty_webhook_configuration()['metadata']['name']}",
                   {"webhooks": [], "metadata": {"annotations": None}}, "application/merge-patch+json")  # fmt: skip
        written = {c.resource for c in self.proxy.calls
                   if c.resource is not None and c.method == "POST" and c.status is not None and c.status < 300}  # fmt: skip
        for resource in sorted(written, key=lambda r: (r.group, r.plural)):
            self._delete_all(resource)
        if self._keda:
            self.admin.remove_crd(KEDA_CRD)
        if self._narrowed:
            self.admin("PUT", CLUSTER_ROLE, operator_cluster_role())

    def _delete_all(self, resource: Resource) -> None:
        base = f"/api/{resource.version}" if not resource.group else f"/apis/{resource.group}/{resource.version}"
        if resource.plural in ("namespaces", "serviceaccounts") or (resource.group, resource.plural) == (
            "apiextensions.k8s.io", "customresourcedefinitions"):  # fmt: skip
            return
        try:
            items = self.admin("GET", f"{base}/{resource.plural}").get("items") or []
        except ApiError as error:
            if error.status == 404:  # its CRD is gone already
                return
            raise
        deleted = []
        for item in items:
            meta = item["metadata"]
            if str(meta.get("namespace", "")).startswith("kube-"):
                continue  # the API server's own (e.g. kube-system's extension-apiserver-authentication)
            path = (f"{base}/namespaces/{meta['namespace']}/{resource.plural}/{meta['name']}" if meta.get("namespace")
                    else f"{base}/{resource.plural}/{meta['name']}")  # fmt: skip
            with contextlib.suppress(ApiError):
                if meta.get("finalizers"):
                    self.admin("PATCH", path, {"metadata": {"finalizers": None}}, "application/merge-patch+json")
                # Background: no "orphan" finalizer (Jobs' default), which only a garbage collector removes.
                self.admin("DELETE", path + "?gracePeriodSeconds=0&propagationPolicy=Background")
                deleted.append(path)
        for path in deleted:
            wait_for(f"{path} deleted", lambda path=path: not self.admin.exists(path), timeout_s=30)

    # ------------------------------------------------------------------ what a kubelet would meet

    @property
    def kubelet_problems(self) -> list[KubeletProblem]:
        """Probes of stored pod specs that no kubelet could pass, in the order first stored."""
        return list(self.proxy.kubelet_problems)

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
        """The operator's requests the API server answered 403 (outside its ClusterRole)."""
        return list(self.proxy.forbidden)

    # ------------------------------------------------------------------ HTTP

    def request(
        self, method: str, path: str, body: object = None, content_type: str = "application/json", agent: str = ""
    ) -> Any:
        """One call through the proxy; ``agent`` sets the User-Agent (e.g. to call as the
        operator, under its RBAC)."""
        headers = {"Content-Type": content_type} | ({"User-Agent": agent} if agent else {})
        return call(self.url + path, method, body, headers)

    def ensure_namespace(self, ns: str) -> None:
        if ns not in self.process.namespaces:
            self.admin.ensure_namespace(ns)
            self.process.namespaces.add(ns)

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
        if "{ns}" in collection:
            self.ensure_namespace(ns)
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

    def received(self) -> list[Call]:
        """Every request the proxy received so far, in order."""
        return list(self.proxy.calls)

    def calls(self, method: str, plural: str) -> list[Call]:
        """Requests made (by anyone) of ``method`` on ``plural``, e.g. ``calls("POST", "jobs")``."""
        return [r for r in self.received()
                if r.resource is not None and r.method == method and r.resource.plural == plural]  # fmt: skip

    def verbs(self, exclude_agent: str = "") -> set[tuple[str, str, str]]:
        """(group, resource[/subresource], verb) of the API requests served so far, except
        those whose User-Agent starts with ``exclude_agent`` (this client's: urllib)."""
        return {(r.resource.group, r.rbac_resource, r.verb) for r in self.received()
                if r.resource is not None and not (exclude_agent and r.agent.startswith(exclude_agent))}  # fmt: skip

    def call_mark(self) -> int:
        """A point in the request log, for ``api_calls(since=..., until=...)``."""
        return len(self.received())

    def api_calls(
        self, since: int = 0, until: int | None = None, agent: str = OPERATOR_AGENT
    ) -> Counter[tuple[str, str]]:
        """(verb, resource[/subresource]) of the API calls of ``agent`` (a User-Agent prefix;
        the operator's own client by default, "kopf/" for kopf's) between two marks."""
        return Counter((r.verb, r.rbac_resource) for r in self.received()[since:until]
                       if r.resource is not None and r.agent.startswith(agent))  # fmt: skip
