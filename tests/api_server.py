"""The one real API server of a test process: etcd and kube-apiserver (e2e/kube/control_plane.py,
the binaries `make kube` built) on 127.0.0.1, started on first use and stopped at exit, with
what every operator test expects installed once: the AdmissionPolicy and kopf peering CRDs
from the chart, the operator's ServiceAccount bound to a ClusterRole of slogate_operator.rbac's
table (the chart's when it serves all namespaces), and the namespace ``llm``. ``Admin`` calls
it directly as its administrator (tests/api_cluster.py's proxy is for what the test observes).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import ssl
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from api_proxy import OPERATOR_ACCOUNT
from project_files import CRD_PATH, ROOT
from slogate_operator import rbac
from slogate_operator.settings import OperatorSettings

sys.path.insert(0, str(ROOT / "e2e" / "kube"))
from control_plane import STOP_ORDER, Binaries, ControlPlane, free_port, wait_for
from teardown import end_processes

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NS = "llm"
"""The namespace of the tests' objects (others are made when a test writes to them)."""
PEERING_CRDS = ROOT / "charts" / "slogate" / "crds" / "kopf.dev_peerings.yaml"


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:300]}")
        self.status = status
        self.body = body


def call(url: str, method: str, body: object, headers: dict[str, str], tls: ssl.SSLContext | None = None) -> Any:
    """One JSON call; an error status raises ApiError with the server's body."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=tls) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        raise ApiError(error.code, error.read().decode(errors="replace")) from None


class Admin:
    """Synchronous calls to the API server itself, as its administrator (never through a proxy)."""

    def __init__(self, server: str, tls: ssl.SSLContext) -> None:
        self.server, self.tls = server, tls

    def __call__(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> Any:
        return call(self.server + path, method, body, {"Content-Type": content_type}, self.tls)

    def exists(self, path: str) -> bool:
        try:
            self("GET", path)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def apply(self, collection: str, body: dict[str, Any]) -> None:
        """Create, or leave as it is if it exists."""
        try:
            self("POST", collection, body)
        except ApiError as error:
            if error.status != 409:
                raise

    def install_crd(self, crd: dict[str, Any]) -> None:
        self.apply(CRDS, crd)
        name = crd["metadata"]["name"]

        def established() -> bool:
            conditions = (self("GET", f"{CRDS}/{name}").get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(f"CRD {name} established", established, timeout_s=60)
        version, names = crd["spec"]["versions"][0]["name"], crd["spec"]["names"]
        self.wait_served(f"/apis/{crd['spec']['group']}/{version}/{names['plural']}")

    def wait_served(self, collection: str) -> None:
        """Until the collection answers (after a CRD is created the server answers 429,
        "storage is (re)initializing", for a moment)."""

        def served() -> bool:
            try:
                self("GET", collection)
            except ApiError as error:
                if error.status in (404, 429):
                    return False
                raise
            return True

        wait_for(f"{collection} served", served, timeout_s=60)

    def remove_crd(self, name: str) -> None:
        with contextlib.suppress(ApiError):
            self("DELETE", f"{CRDS}/{name}")
        wait_for(f"CRD {name} removed", lambda: not self.exists(f"{CRDS}/{name}"), timeout_s=60)

    def ensure_namespace(self, ns: str) -> None:
        self.apply("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        self.apply(f"/api/v1/namespaces/{ns}/serviceaccounts",
                   {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})  # fmt: skip


WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def empty_webhook_configuration() -> dict[str, Any]:
    """The injection webhook's configuration as the chart installs it: no entry, no CA yet."""
    name = OperatorSettings().webhook_configuration
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name}, "webhooks": []}  # fmt: skip


def operator_cluster_role() -> dict[str, Any]:
    """slogate_operator.rbac's table as one ClusterRole (the chart's when serving all namespaces)."""
    defaults = OperatorSettings()
    rules = [{"apiGroups": [p.group], "resources": [p.resource], "verbs": list(p.verbs),
              **({"resourceNames": [getattr(defaults, p.named_by)]} if p.named_by else {})}
             for p in rbac.PERMISSIONS]  # fmt: skip
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "slogate-operator"}, "rules": rules}  # fmt: skip


PREFIX = "slogate-apiserver-"
OWNER = "owner.pid"


def remove_abandoned() -> None:
    """Stop and remove the control planes of test processes that died without their atexit
    (killed by a timeout, say): found by their directories, whose owner no longer runs."""
    for workdir in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = int((workdir / OWNER).read_text())
            os.kill(owner, 0)
        except (OSError, ValueError):
            end_processes(str(workdir.resolve()), STOP_ORDER)
            shutil.rmtree(workdir, ignore_errors=True)


class ControlPlaneProcess:
    """The one control plane of this test process: started on first use, stopped at exit."""

    _started: ControlPlaneProcess | None = None

    def __init__(self) -> None:
        remove_abandoned()
        self.workdir = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.workdir / OWNER).write_text(str(os.getpid()))
        self.plane = ControlPlane(self.workdir, Binaries.from_cache(), "127.0.0.1", free_port(), "198.19.0.0/16",
                                  ("--endpoint-reconciler-type=none",))  # fmt: skip
        self.plane.pki.create(server_ips=["127.0.0.1"], server_names=["localhost"], node="none")
        self.plane.start()
        self.tls = self.plane.admin_context()
        self.admin = Admin(self.plane.server, self.tls)
        for crd_file in (CRD_PATH, PEERING_CRDS):
            for crd in yaml.safe_load_all(crd_file.read_text()):
                if crd:
                    self.admin.install_crd(crd)
        namespace, account = OPERATOR_ACCOUNT
        self.admin.ensure_namespace(namespace)
        self.admin.apply(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                         {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}})  # fmt: skip
        self.admin.apply("/apis/rbac.authorization.k8s.io/v1/clusterroles", operator_cluster_role())
        self.admin.apply("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "slogate-operator"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "slogate-operator"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        })  # fmt: skip
        self.admin.apply(WEBHOOK_CONFIGURATIONS, empty_webhook_configuration())
        self.admin.ensure_namespace(NS)
        self.namespaces = {NS, namespace}

    @classmethod
    def get(cls) -> ControlPlaneProcess:
        if cls._started is None:
            cls._started = cls()
            atexit.register(cls._started.stop)
        return cls._started

    def stop(self) -> None:
        self.plane.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
