"""An API server that behaves like kube-apiserver where the operator's correctness depends on it,
served by kmock 0.8 through its public API only.

kmock's ``KubernetesScaffold`` answers discovery (the resources declared in ``resources``)
and unknown endpoints; one kmock reaction hands every resource request to ``ClusterEmulator``,
which answers it with ``kmock.Response`` objects. kmock's stateful ``KubernetesEmulator`` is
not used: it stores a write as the client sent it before any reaction runs, so a refused or
defaulted write could not be what the store and the watches see.

``ClusterEmulator`` does what a real API server does and kmock does not: authorizes every
request of the operator's agents (RBAC), defaults objects on every write, separates spec
from status for kinds with a status subresource, filters lists and watches by label and
field selectors, validates pod specs (422), keeps uid/resourceVersion/generation, answers a
no-op patch without a new resourceVersion or a watch event, prunes unknown fields of
custom resources, and answers 404 to every verb on an API it does not serve (a custom
resource whose CRD is not installed, KEDA's ScaledObject until ``declare_custom``). The objects live in tests/kube_store.py. What it cannot be, it records:
the probes a kubelet could never pass (``kubelet_problems``) and the refusals it answered
(``forbidden``). The request log is kmock's: iterate ``handler``.

Deliberate deviations: ``metadata.creationTimestamp`` stays patchable (tests age a Job
that way; kube-apiserver would keep the original); strategic-merge patches are plain
merge patches; PUT is not served; a create is answered 200, not 201; watches replay every
current object as ADDED whatever ``resourceVersion`` they start from; custom resources are
defaulted and pruned but not validated against their schema (neither OpenAPI nor CEL rules).
"""

from __future__ import annotations

import copy
import random
import string
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import kmock

from kube_defaults import apply_defaults, default_builtin, prune
from kube_faults import RBAC_AGENTS, Fault, RandomFaults
from kube_rules import (
    KubeletProblem,
    SelectorError,
    fields_match,
    forbidden_message,
    kubelet_problems,
    labels_match,
    parse_field_selector,
    parse_label_selector,
    pod_spec_of,
    qos_class,
    rbac_verb,
)
from kube_store import Key, ObjectStore
from kube_writes import StatusError, apply_patch, generate_job_selector, invalid, now, object_errors, separated
from slogate_operator import rbac

__all__ = ["ClusterEmulator", "Refused"]
NO_GENERATION = {("", "configmaps"), ("", "secrets"), ("", "events"), ("events.k8s.io", "events"),
                 ("", "serviceaccounts"), ("", "endpoints")}  # fmt: skip


@dataclass(frozen=True)
class Refused:
    """A request answered 403 because the operator's Role does not grant it."""

    agent: str
    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None
    message: str


def for_a_resource(request: kmock.Request) -> bool:
    """The requests ``ClusterEmulator`` answers: those on a resource (discovery is kmock's)."""
    return request.resource is not None and request.resource.plural is not None


def ok(obj: Mapping[str, Any] | AsyncIterator[Any]) -> kmock.Response:
    # Every answer carries its status: kmock 0.8 keeps the status of a returned Response on
    # the reaction, so an answer without one would go out with the previous answer's status.
    return kmock.Response(status=200, payload=obj)


@dataclass
class ClusterEmulator:
    """kube-apiserver's rules in front of an object store (see the module's docstring)."""

    faults: list[Fault] = field(default_factory=list)
    chaos: RandomFaults | None = None
    created: list[tuple[str, str]] = field(default_factory=list)
    """(plural, name) of every create the emulator served successfully, in order."""
    forbidden: list[Refused] = field(default_factory=list)
    kubelet_problems: list[KubeletProblem] = field(default_factory=list)
    authorize: Callable[[str, str, str], bool] = lambda *rule: rbac.allows(*rule)  # noqa: PLW0108
    """Whether the operator's Role grants (group, resource[/subresource], verb); read per request."""
    custom: dict[kmock.resource, dict[str, Any] | None] = field(default_factory=dict)
    """Custom resources and their openAPIV3Schema (None: no schema, nothing pruned)."""
    store: ObjectStore = field(default_factory=ObjectStore)
    handler: kmock.KubernetesScaffold = field(default_factory=kmock.KubernetesScaffold)
    """What kmock.Server serves; iterating it gives every request received, in order."""

    def __post_init__(self) -> None:
        self.handler[for_a_resource] << self.serve
        self.handler.resources.load_bundled()

    async def __aenter__(self) -> ClusterEmulator:
        await self.handler.__aenter__()
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.handler.__aexit__(None, None, None)

    def declare_custom(self, path: str, info: kmock.ResourceInfo, schema: dict[str, Any] | None = None) -> None:
        """Serve a custom resource (``group/version/plural``) as its CRD would."""
        self.handler.resources[path] = info
        self.custom[kmock.resource(path)] = schema

    # ------------------------------------------------------------------ dispatch

    def serve(self, request: kmock.Request) -> kmock.Response:
        try:
            self.check_authorized(request)
            self.inject_fault(request)
            return ok(self.answer(request))
        except StatusError as error:
            return error.response()

    def answer(self, request: kmock.Request) -> dict[str, Any] | AsyncIterator[Any]:
        if request.resource not in self.handler.resources:
            # An API the cluster does not serve (a CRD not installed, e.g. KEDA's): every verb is 404.
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        writes = {kmock.action.CREATE: self.create, kmock.action.UPDATE: self.patch, kmock.action.DELETE: self.delete}
        if request.action in writes:
            return writes[request.action](request)
        if request.action == kmock.action.FETCH:
            return self.stored(request)
        if request.action == kmock.action.LIST:
            return self.list_objects(request)
        if request.action == kmock.action.WATCH:
            return self.watch_objects(request, self.selectors(request))
        raise StatusError(404, "NotFound", "the server could not find the requested resource")

    def check_authorized(self, request: kmock.Request) -> None:
        agent = request.headers.get("User-Agent", "")
        if not agent.startswith(RBAC_AGENTS):
            return
        assert request.resource is not None
        verb = rbac_verb(request.method.value, request.name, request.params)
        group = request.resource.group or ""
        resource = str(request.resource.plural) + (f"/{request.subresource}" if request.subresource else "")
        if self.authorize(group, resource, verb):
            return
        message = forbidden_message(verb, group, resource, request.namespace, request.name)
        self.forbidden.append(Refused(agent, verb, group, resource, request.namespace, request.name, message))
        details = {"name": request.name or "", "group": group, "kind": request.resource.plural}
        raise StatusError(403, "Forbidden", message, details)

    def inject_fault(self, request: kmock.Request) -> None:
        assert request.resource is not None
        for fault in self.faults:
            if fault.times > 0 and request.method.value == fault.method and request.resource.plural == fault.plural:
                fault.times -= 1
                raise StatusError(fault.status, "InjectedFault", "injected by the test")
        status = self.chaos.status_for(request) if self.chaos is not None else None
        if status is not None:
            raise StatusError(status, "InjectedFault", "injected at random by the test")

    # ------------------------------------------------------------------ what is stored

    def info(self, resource: kmock.resource) -> kmock.ResourceInfo:
        try:
            return self.handler.resources[resource]
        except KeyError:
            return kmock.ResourceInfo()

    def kind(self, resource: kmock.resource) -> str:
        return self.info(resource).kind or str(resource.plural).capitalize()

    @staticmethod
    def key(request: kmock.Request, name: str | None = None) -> Key:
        assert request.resource is not None
        return request.resource, request.namespace, str(name or request.name)

    def not_found(self, request: kmock.Request) -> StatusError:
        assert request.resource is not None
        group = request.resource.group or ""
        qualified = f"{request.resource.plural}.{group}" if group else str(request.resource.plural)
        details = {"name": request.name, "group": group, "kind": request.resource.plural}
        return StatusError(404, "NotFound", f'{qualified} "{request.name}" not found', details)

    def stored(self, request: kmock.Request) -> dict[str, Any]:
        found = self.store.get(self.key(request))
        if found is None:
            raise self.not_found(request)
        return found

    # ------------------------------------------------------------------ writes

    def create(self, request: kmock.Request) -> dict[str, Any]:
        resource = request.resource
        assert resource is not None
        if not isinstance(request.data, dict):
            raise StatusError(400, "BadRequest", "the request body is not an object")
        obj = self.new_metadata(request, request.data)
        obj = self.defaulted(resource, obj)
        kind = self.kind(resource)
        if "status" in self.info(resource).subresources:  # a create sets no status
            obj.pop("status", None)
            if kind in ("Deployment", "Job"):
                obj["status"] = {}
            elif kind == "Pod":
                obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj.get("spec") or {})}
        if kind == "Job":
            generate_job_selector(obj)
        self.validate(resource, obj, None)
        self.check_kubelet(kind, obj)
        meta = obj["metadata"]
        self.store.put((resource, meta.get("namespace"), meta["name"]), obj)
        self.created.append((str(resource.plural), str(meta["name"])))
        if self.chaos is not None and self.chaos.blackout_after_create == resource.plural:
            self.chaos.blackout = True
        return obj

    def new_metadata(self, request: kmock.Request, body: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``body`` with the namespace from the URL, a name from generateName, uid,
        creationTimestamp (where absent), resourceVersion and generation; 409 if the name is taken."""
        resource = request.resource
        assert resource is not None
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if request.namespace:
            if meta.get("namespace") not in (None, "", request.namespace):
                said = "the namespace of the provided object does not match the namespace sent on the request"
                raise StatusError(400, "BadRequest", said)
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = f"{meta['generateName']}{suffix}"
        if not meta.get("name"):
            said = (
                f'{self.kind(resource)} "" is invalid: metadata.name: Required value: name or generateName is required'
            )
            raise StatusError(422, "Invalid", said)
        if self.store.get((resource, meta.get("namespace"), meta["name"])) is not None:
            group = resource.group or ""
            qualified = f"{resource.plural}.{group}" if group else str(resource.plural)
            details = {"name": meta["name"], "group": group, "kind": resource.plural}
            raise StatusError(409, "AlreadyExists", f'{qualified} "{meta["name"]}" already exists', details)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        meta["resourceVersion"] = self.store.next_version()
        if (resource.group or "", resource.plural) in NO_GENERATION:
            meta.pop("generation", None)
        else:
            meta["generation"] = 1
        return obj

    def patch(self, request: kmock.Request) -> dict[str, Any]:
        resource = request.resource
        assert resource is not None
        old = self.stored(request)
        sub = request.subresource
        has_status = "status" in self.info(resource).subresources
        if sub not in (None, "status") or (sub == "status" and not has_status):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        patched = apply_patch(old, request.data)
        version = (patched.get("metadata") or {}).get("resourceVersion")
        if version not in (None, old["metadata"]["resourceVersion"]):
            group = resource.group or ""
            qualified = f"{resource.plural}.{group}" if group else str(resource.plural)
            said = (f'Operation cannot be fulfilled on {qualified} "{request.name}": the object has been modified; '
                    "please apply your changes to the latest version and try again")  # fmt: skip
            raise StatusError(409, "Conflict", said)
        new = self.defaulted(resource, separated(old, patched, sub, has_status))
        if new == old:  # a no-op: no new resourceVersion, no watch event
            return old
        if sub is None:
            self.validate(resource, new, old)
            if "generation" in old["metadata"] and self.spec_changed(resource, old, new):
                new["metadata"]["generation"] = int(old["metadata"]["generation"]) + 1
            self.check_kubelet(self.kind(resource), new)
        new["metadata"]["resourceVersion"] = self.store.next_version()
        self.store.put(self.key(request), new)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):  # the last finalizer went
            self.store.remove(self.key(request))
        return new

    def delete(self, request: kmock.Request) -> dict[str, Any]:
        """Gone at once without finalizers; with some, marked (a write: new resourceVersion and
        generation) and gone when the last one is removed."""
        old = self.stored(request)
        meta = old["metadata"]
        if meta.get("deletionTimestamp"):
            return old
        if not meta.get("finalizers"):
            return self.store.remove(self.key(request))
        meta["deletionTimestamp"] = now()
        meta["resourceVersion"] = self.store.next_version()
        if "generation" in meta:
            meta["generation"] = int(meta["generation"]) + 1
        self.store.put(self.key(request), old)
        return old

    def defaulted(self, resource: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        if resource in self.custom:
            schema = self.custom[resource]
            if schema is not None:
                apply_defaults(obj, schema)
                obj = prune(obj, schema, root=True)
            return obj
        default_builtin(obj, resource.group or "", str(resource.plural))
        return obj

    def spec_changed(self, resource: kmock.resource, old: dict[str, Any], new: dict[str, Any]) -> bool:
        if resource in self.custom:  # a custom resource: anything but metadata and status
            rest = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
            return rest(old) != rest(new)
        return old.get("spec") != new.get("spec")

    def validate(self, resource: kmock.resource, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        kind = self.kind(resource)
        errors = object_errors(kind, new, old)
        if errors:
            raise invalid(kind, resource.group or "", str(new["metadata"].get("name")), errors)

    def check_kubelet(self, kind: str, obj: dict[str, Any]) -> None:
        where = pod_spec_of(kind, obj)
        meta = obj.get("metadata") or {}
        if where is None or (kind == "Pod" and any(r.get("controller") for r in meta.get("ownerReferences") or ())):
            return  # a controller's pod: its template was checked
        for problem in kubelet_problems(kind, f"{meta.get('namespace')}/{meta.get('name')}", where[1]):
            if problem not in self.kubelet_problems:
                self.kubelet_problems.append(problem)

    # ------------------------------------------------------------------ reads

    def selectors(self, request: kmock.Request) -> Callable[[Mapping[str, Any]], bool]:
        """What a list or watch lets through: its namespace and name, label and field selectors."""
        try:
            labels = parse_label_selector(request.params.get("labelSelector", ""))
            fields = parse_field_selector(request.params.get("fieldSelector", ""))
        except SelectorError as error:
            raise StatusError(400, "BadRequest", str(error)) from None

        def visible(obj: Mapping[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if request.namespace is not None and meta.get("namespace") != request.namespace:
                return False
            if request.name is not None and meta.get("name") != request.name:
                return False
            return labels_match(labels, meta.get("labels")) and fields_match(fields, obj)

        return visible

    def list_objects(self, request: kmock.Request) -> dict[str, Any]:
        resource = request.resource
        assert resource is not None
        if resource not in self.handler.resources and not self.store.has(resource):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        visible = self.selectors(request)
        items = self.store.current(resource, visible)
        group, version = resource.group, resource.version
        return {
            "apiVersion": f"{group}/{version}" if group else str(version),
            "kind": f"{self.kind(resource)}List",
            "metadata": {"resourceVersion": str(self.store.revision)},
            "items": items,
        }

    async def watch_objects(
        self, request: kmock.Request, visible: Callable[[Mapping[str, Any]], bool]
    ) -> AsyncIterator[Any]:
        """Selector-filtered, as kube-apiserver's watch cache (see ObjectStore.watch)."""
        assert request.resource is not None
        yield b""  # the headers go out at once, even if nothing ever happens
        async for event in self.store.watch(request.resource, visible):
            yield event
