"""What a real API server cannot do on cue, in front of one that is real: a proxy between the
operator (and the tests) and kube-apiserver that injects faults, counts calls and notes what
a kubelet would meet. Everything else (defaulting, validation, CEL, RBAC, selectors, watches,
resourceVersions, status subresources) is the real server's answer, passed through unchanged.

  faults      ``Fault``: the next N calls of a method on a plural answered with a status
  chaos       ``RandomFaults``: a seeded random share of the operator's calls failed
  calls       every request received, in order (``Call``), with the status it was answered
  identity    requests whose User-Agent is the operator's (its own client's, kopf's) go to the
              server as the operator's ServiceAccount (impersonated), so RBAC is the server's
              verdict on the chart's ClusterRole; the tests' own requests go as the admin
  forbidden   the operator's requests the server answered 403
  kubelet     every pod spec the server accepted, checked by tests/kubelet_lint.py

aiohttp (kopf's own HTTP library) serves and forwards; the proxy runs in the tests' loop thread.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from kube_faults import RBAC_AGENTS, Fault, RandomFaults
from kubelet_lint import KubeletProblem, kubelet_problems, pod_spec_of

OPERATOR_ACCOUNT = ("slogate-system", "slogate-operator")
"""(namespace, name) of the ServiceAccount the operator's requests are impersonated as."""
PASSED_HEADERS = ("Content-Type", "Accept", "User-Agent")
KINDS_WITH_POD_SPECS = {"pods": "Pod", "deployments": "Deployment", "jobs": "Job"}


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str


@dataclass
class Call:
    """One request the proxy received: what kube-apiserver's RequestInfoFactory would read of it."""

    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    resource: Resource | None
    namespace: str | None
    name: str | None
    subresource: str | None
    body: Any = None
    status: int | None = None
    """What it was answered (None while a watch streams)."""

    @property
    def agent(self) -> str:
        return self.headers.get("User-Agent", "")

    @property
    def verb(self) -> str:
        return rbac_verb(self.method, self.name, self.params)

    @property
    def rbac_resource(self) -> str:
        assert self.resource is not None
        return self.resource.plural + (f"/{self.subresource}" if self.subresource else "")


@dataclass(frozen=True)
class Refused:
    """An operator's request the API server answered 403 (outside the ClusterRole it was given)."""

    agent: str
    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None
    message: str


def rbac_verb(method: str, name: str | None, params: Mapping[str, str]) -> str:
    """The RBAC verb of a request, as kube-apiserver's RequestInfoFactory derives it."""
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    if method == "DELETE" and not name:
        return "deletecollection"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())


def parse(method: str, path: str, params: Mapping[str, str], headers: Mapping[str, str], body: Any) -> Call:
    """A request on /api/v1/... or /apis/<group>/<version>/...; discovery has no resource."""
    parts = [p for p in path.split("/") if p]
    group, version, rest = "", "", []
    if parts[:1] == ["api"] and len(parts) >= 2:
        version, rest = parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource = Resource(group, version, rest[0]) if rest else None
    name = rest[1] if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) >= 3 else None
    return Call(method, path, dict(params), dict(headers), resource, namespace, name, subresource, body)


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``Status`` object as kube-apiserver answers errors."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


@dataclass
class ApiProxy:
    """Serve on 127.0.0.1 (``url`` once started), forward to ``upstream`` with ``tls`` (the admin's)."""

    upstream: str
    tls: ssl.SSLContext
    faults: list[Fault] = field(default_factory=list)
    chaos: RandomFaults | None = None
    calls: list[Call] = field(default_factory=list)
    created: list[tuple[str, str]] = field(default_factory=list)
    """(plural, name) of every create the server accepted, in order."""
    forbidden: list[Refused] = field(default_factory=list)
    kubelet_problems: list[KubeletProblem] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self.handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.tls, limit=0))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        content_type = request.headers.get("Content-Type", "")
        body = json.loads(raw) if raw and "json" in content_type else None
        call = parse(request.method, request.path, request.query, request.headers, body)
        self.calls.append(call)
        status = self.injected(call)
        if status is not None:
            call.status = status
            return web.json_response(status_body(status, "InjectedFault", "injected by the test"), status=status)
        headers: list[tuple[str, str]] = [(h, request.headers[h]) for h in PASSED_HEADERS if h in request.headers]
        if call.agent.startswith(RBAC_AGENTS):
            namespace, name = OPERATOR_ACCOUNT
            headers += [("Impersonate-User", f"system:serviceaccount:{namespace}:{name}"),
                        ("Impersonate-Group", "system:serviceaccounts"),
                        ("Impersonate-Group", f"system:serviceaccounts:{namespace}"),
                        ("Impersonate-Group", "system:authenticated")]  # fmt: skip
        assert self._session is not None
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=raw or None, headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        ) as answer:  # fmt: skip
            if call.verb == "watch" and answer.status == 200:
                return await self.stream(request, answer, call)
            data = await answer.read()
            call.status = answer.status
            self.note(call, data)
            return web.Response(status=answer.status, body=data,
                                content_type=answer.content_type or "application/json")  # fmt: skip

    def injected(self, call: Call) -> int | None:
        """The status a fault answers ``call`` with instead of the server, or None."""
        if call.resource is None:
            return None
        for fault in self.faults:
            if fault.times > 0 and call.method == fault.method and call.resource.plural == fault.plural:
                fault.times -= 1
                return fault.status
        return self.chaos.status_for(call) if self.chaos is not None else None

    async def stream(self, request: web.Request, answer: aiohttp.ClientResponse, call: Call) -> web.StreamResponse:
        out = web.StreamResponse(status=200, headers={"Content-Type": answer.headers.get("Content-Type", "")})
        await out.prepare(request)
        try:
            async for chunk in answer.content.iter_any():
                await out.write(chunk)
        except (ConnectionResetError, aiohttp.ClientError):
            pass  # the watcher went away, or the server ended the stream: either side's end
        call.status = 200
        return out

    def note(self, call: Call, data: bytes) -> None:
        """What the answer says about the operator's RBAC, a create, and a pod spec."""
        if call.resource is None:
            return
        if call.status == 403 and call.agent.startswith(RBAC_AGENTS):
            message = str(_json(data).get("message", ""))
            self.forbidden.append(Refused(call.agent, call.verb, call.resource.group, call.rbac_resource,
                                          call.namespace, call.name, message))  # fmt: skip
        if call.status is None or not 200 <= call.status < 300 or call.method not in ("POST", "PATCH", "PUT"):
            return
        obj = _json(data)
        if call.method == "POST" and call.subresource is None:
            self.created.append((call.resource.plural, str(obj.get("metadata", {}).get("name"))))
            if self.chaos is not None and self.chaos.blackout_after_create == call.resource.plural:
                self.chaos.blackout = True  # as if the operator died right after this create
        kind = KINDS_WITH_POD_SPECS.get(call.resource.plural)
        found = pod_spec_of(kind, obj) if kind else None
        if kind and found is not None:
            meta = obj.get("metadata", {})
            name = f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))
            for problem in kubelet_problems(kind, name, found[1]):
                if problem not in self.kubelet_problems:
                    self.kubelet_problems.append(problem)


def _json(data: bytes) -> dict[str, Any]:
    try:
        loaded = json.loads(data)
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}
