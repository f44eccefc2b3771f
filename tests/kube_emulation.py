"""kmock 0.8 made to behave like kube-apiserver where the operator's correctness depends on it.

kmock stores objects and streams watch events; a real API server also: authorizes every
request (RBAC), defaults objects on every write, separates spec from status for kinds with
a status subresource, filters lists and watches by label and field selectors, validates
pod specs (422), keeps uid/resourceVersion/generation, answers a no-op patch without a
new resourceVersion or a watch event, and prunes unknown fields of custom resources.
``ClusterEmulator`` does all that in front of kmock's store. What it cannot be, it records:
the probes a kubelet could never pass (``kubelet_problems``) and the refusals it answered
(``forbidden``).

Writes are serialized (``_writes``): the new object is computed from the stored one, then
handed to kmock as a whole-object replacement, so kmock's store, history and watch bus
stay the single source of truth. ``request.data`` of a served write holds what was stored
(a create) or that replacement (a patch); ``request.body`` keeps the client's own bytes.

Deliberate deviations: ``metadata.creationTimestamp`` stays patchable (tests age a Job
that way; kube-apiserver would keep the original); strategic-merge patches are plain
merge patches; PUT is not served; watches replay every current object as ADDED whatever
``resourceVersion`` they start from; custom resources are defaulted and pruned but not
validated against their schema (neither OpenAPI nor CEL rules).
"""

from __future__ import annotations

import asyncio
import copy
import random
import string
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
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
from kube_writes import (
    StatusError,
    apply_patch,
    generate_job_selector,
    invalid,
    now,
    object_errors,
    separated,
)
from slogate_operator import rbac

__all__ = ["RBAC_AGENTS", "ClusterEmulator", "Fault", "RandomFaults", "Refused", "StatusError", "now"]
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


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock with kube-apiserver's rules (see the module's docstring)."""

    revision: int = 0
    """The last resourceVersion handed out (one counter for every kind, as etcd's)."""
    faults: list[Fault] = attrs.field(factory=list)
    chaos: RandomFaults | None = None
    created: list[tuple[str, str]] = attrs.field(factory=list)
    """(plural, name) of every create the emulator served successfully, in order."""
    forbidden: list[Refused] = attrs.field(factory=list)
    kubelet_problems: list[KubeletProblem] = attrs.field(factory=list)
    authorize: Callable[[str, str, str], bool] = attrs.field(default=lambda *rule: rbac.allows(*rule))  # noqa: PLW0108
    """Whether the operator's Role grants (group, resource[/subresource], verb); read per request."""
    custom: dict[kmock.resource, dict[str, Any] | None] = attrs.field(factory=dict)
    """Custom resources and their openAPIV3Schema (None: no schema, nothing pruned)."""
    _writes: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)

    def declare_custom(self, path: str, info: kmock.ResourceInfo, schema: dict[str, Any] | None = None) -> None:
        """Serve a custom resource (``group/version/plural``) as its CRD would."""
        self.resources[path] = info
        self.custom[kmock.resource(path)] = schema

    # ------------------------------------------------------------------ dispatch

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None or resource.plural is None:
            return await super()._handle(request)
        try:
            self._authorize(request)
            self._inject_fault(request)
            if request.action == kmock.action.CREATE:
                async with self._writes:
                    return await self._create(request)
            if request.action == kmock.action.UPDATE and request.name:
                async with self._writes:
                    return await self._patch(request)
            if request.action == kmock.action.DELETE and request.name:
                async with self._writes:
                    self._mark_deleting(request)
                    return await super()._handle(request)
            if request.action in (kmock.action.LIST, kmock.action.WATCH):
                self._selectors(request)
        except StatusError as error:
            return error.response()
        return await super()._handle(request)

    def _authorize(self, request: kmock.Request) -> None:
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

    def _inject_fault(self, request: kmock.Request) -> None:
        assert request.resource is not None
        for fault in self.faults:
            if fault.times > 0 and request.method.value == fault.method and request.resource.plural == fault.plural:
                fault.times -= 1
                raise kmock.KubernetesError(status=fault.status, reason="InjectedFault", message="injected by the test")
        status = self.chaos.status_for(request) if self.chaos is not None else None
        if status is not None:
            raise kmock.KubernetesError(status=status, reason="InjectedFault", message="injected at random by the test")

    # ------------------------------------------------------------------ writes

    def _info(self, resource: kmock.resource) -> kmock.ResourceInfo:
        try:
            return self.resources[resource]
        except KeyError:
            return kmock.ResourceInfo()

    def _kind(self, resource: kmock.resource) -> str:
        return self._info(resource).kind or str(resource.plural).capitalize()

    def _stored(self, request: kmock.Request, name: str | None = None) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, name or request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _not_found(self, request: kmock.Request) -> StatusError:
        assert request.resource is not None
        group = request.resource.group or ""
        qualified = f"{request.resource.plural}.{group}" if group else str(request.resource.plural)
        details = {"name": request.name, "group": group, "kind": request.resource.plural}
        return StatusError(404, "NotFound", f'{qualified} "{request.name}" not found', details)

    def _next_version(self) -> str:
        self.revision += 1
        return str(self.revision)

    async def _create(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        assert resource is not None
        if not isinstance(request.data, dict):
            raise StatusError(400, "BadRequest", "the request body is not an object")
        obj = self._new_metadata(request, copy.deepcopy(request.data))
        obj = self._defaulted(resource, obj)
        kind = self._kind(resource)
        if "status" in self._info(resource).subresources:  # a create sets no status
            obj.pop("status", None)
            if kind in ("Deployment", "Job"):
                obj["status"] = {}
            elif kind == "Pod":
                obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj.get("spec") or {})}
        if kind == "Job":
            generate_job_selector(obj)
        self._validate(resource, obj, None)
        self._check_kubelet(kind, obj)
        object.__setattr__(request, "data", obj)
        response = await super()._handle(request)
        if response.status < 400:
            self.created.append((str(resource.plural), str(obj["metadata"]["name"])))
            if self.chaos is not None and self.chaos.blackout_after_create == resource.plural:
                self.chaos.blackout = True
        return response

    def _new_metadata(self, request: kmock.Request, obj: dict[str, Any]) -> dict[str, Any]:
        """Namespace from the URL, a name from generateName, uid, creationTimestamp (where
        absent), resourceVersion and generation; 409 if the name is taken."""
        resource = request.resource
        assert resource is not None
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
                f'{self._kind(resource)} "" is invalid: metadata.name: Required value: name or generateName is required'
            )
            raise StatusError(422, "Invalid", said)
        if self._stored(request, meta["name"]) is not None:
            group = resource.group or ""
            qualified = f"{resource.plural}.{group}" if group else str(resource.plural)
            details = {"name": meta["name"], "group": group, "kind": resource.plural}
            raise StatusError(409, "AlreadyExists", f'{qualified} "{meta["name"]}" already exists', details)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        meta["resourceVersion"] = self._next_version()
        if (resource.group or "", resource.plural) in NO_GENERATION:
            meta.pop("generation", None)
        else:
            meta["generation"] = 1
        return obj

    async def _patch(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        assert resource is not None
        old = self._stored(request)
        if old is None:
            raise self._not_found(request)
        sub = request.subresource
        has_status = "status" in self._info(resource).subresources
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
        new = self._defaulted(resource, separated(old, patched, sub, has_status))
        if new == old:  # a no-op: no new resourceVersion, no watch event
            return aiohttp.web.json_response(old)
        if sub is None:
            self._validate(resource, new, old)
            if "generation" in old["metadata"] and self._spec_changed(resource, old, new):
                new["metadata"]["generation"] = int(old["metadata"]["generation"]) + 1
            self._check_kubelet(self._kind(resource), new)
        new["metadata"]["resourceVersion"] = self._next_version()
        object.__setattr__(request, "data", [{"op": "replace", "path": "", "value": new}])
        return await super()._handle(request)

    def _mark_deleting(self, request: kmock.Request) -> None:
        """A delete that waits for finalizers is a write: new resourceVersion and generation."""
        old = self._stored(request)
        if old is None:
            raise self._not_found(request)
        meta = old["metadata"]
        if meta.get("finalizers") and not meta.get("deletionTimestamp"):
            meta["resourceVersion"] = self._next_version()
            if "generation" in meta:
                meta["generation"] = int(meta["generation"]) + 1
            self.objects[request.resource, request.namespace, request.name]["metadata"] = meta

    def _defaulted(self, resource: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        if resource in self.custom:
            schema = self.custom[resource]
            if schema is not None:
                apply_defaults(obj, schema)
                obj = prune(obj, schema, root=True)
            return obj
        default_builtin(obj, resource.group or "", str(resource.plural))
        return obj

    def _spec_changed(self, resource: kmock.resource, old: dict[str, Any], new: dict[str, Any]) -> bool:
        if resource in self.custom:  # a custom resource: anything but metadata and status
            rest = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
            return rest(old) != rest(new)
        return old.get("spec") != new.get("spec")

    def _validate(self, resource: kmock.resource, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        kind = self._kind(resource)
        errors = object_errors(kind, new, old)
        if errors:
            raise invalid(kind, resource.group or "", str(new["metadata"].get("name")), errors)

    def _check_kubelet(self, kind: str, obj: dict[str, Any]) -> None:
        where = pod_spec_of(kind, obj)
        meta = obj.get("metadata") or {}
        if where is None or (kind == "Pod" and any(r.get("controller") for r in meta.get("ownerReferences") or ())):
            return  # a controller's pod: its template was checked
        for problem in kubelet_problems(kind, f"{meta.get('namespace')}/{meta.get('name')}", where[1]):
            if problem not in self.kubelet_problems:
                self.kubelet_problems.append(problem)

    # ------------------------------------------------------------------ reads

    def _selectors(self, request: kmock.Request) -> tuple[Any, Any]:
        try:
            labels = parse_label_selector(request.params.get("labelSelector", ""))
            fields = parse_field_selector(request.params.get("fieldSelector", ""))
        except SelectorError as error:
            raise StatusError(400, "BadRequest", str(error)) from None
        return labels, fields

    def _visible(self, request: kmock.Request, obj: Mapping[str, Any], selectors: tuple[Any, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        if request.name is not None and meta.get("name") != request.name:
            return False
        return labels_match(selectors[0], meta.get("labels")) and fields_match(selectors[1], obj)

    def _current(self, request: kmock.Request, selectors: tuple[Any, Any]) -> list[dict[str, Any]]:
        found = [
            obj.raw for (resource, _, _), obj in self.objects.items()
            if resource == request.resource and not obj.deleted and self._visible(request, obj.raw, selectors)
        ]  # fmt: skip
        return sorted(found, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"].get("name") or ""))

    async def _serve_list(self, request: kmock.Request) -> dict[str, Any]:
        assert request.resource is not None
        if request.resource not in self._get_resources():
            raise kmock.KubernetesError(
                status=404, reason="NotFound", message="the server could not find the requested resource"
            )
        selectors = self._selectors(request)
        async with self._lock:
            items = copy.deepcopy(self._current(request, selectors))
        group, version = request.resource.group, request.resource.version
        return {
            "apiVersion": f"{group}/{version}" if group else str(version),
            "kind": f"{self._kind(request.resource)}List",
            "metadata": {"resourceVersion": str(self.revision)},
            "items": items,
        }

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """Selector-filtered, as kube-apiserver's watch cache: an object that stops matching is
        DELETED from this watcher's view, one that starts matching is ADDED."""
        yield b""
        assert request.resource is not None
        selectors = self._selectors(request)
        bus = self._buses[request.resource]
        marker = await bus.mark()  # before the snapshot: nothing falls between the two
        try:
            async with self._lock:
                initial = copy.deepcopy(self._current(request, selectors))
            seen: set[tuple[Any, Any]] = set()
            for obj in initial:
                seen.add((obj["metadata"].get("namespace"), obj["metadata"].get("name")))
                yield {"type": "ADDED", "object": obj}
            async for event in bus.stream(since=marker):
                obj = event.get("object") or {}
                key = ((obj.get("metadata") or {}).get("namespace"), (obj.get("metadata") or {}).get("name"))
                was, matches = key in seen, self._visible(request, obj, selectors)
                if event.get("type") == "DELETED" or not matches:
                    if was:
                        seen.discard(key)
                        yield {"type": "DELETED", "object": obj}
                    continue
                seen.add(key)
                yield event if was else {"type": "ADDED", "object": obj}
        finally:
            await bus.unmark(marker)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, StatusError):
            return exc.response()
        return await super()._render_error(exc)
