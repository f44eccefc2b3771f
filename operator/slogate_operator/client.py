"""A small typed async Kubernetes client (aiohttp) with the credentials kopf logs in with.

Only what the operator calls: get, list, create, merge-patch, JSON-patch, delete.
A 429, a 5xx or a broken connection is retried with backoff; a 401 re-reads the
credentials once (service account tokens rotate); everything else becomes an
ApiError whose message carries the server's own words.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import kopf

log = logging.getLogger("slogate.operator.client")
TRANSIENT = frozenset({429, 500, 502, 503, 504})
USER_AGENT = "slogate-operator/0.1"


@dataclass(frozen=True, slots=True)
class Resource:
    """An API resource: group, version, plural."""

    group: str
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if subresource is not None:
            base += f"/{subresource}"
        return base


POLICIES = Resource("slogate.dev", "v1alpha1", "admissionpolicies")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
PODS = Resource("", "v1", "pods")
JOBS = Resource("batch", "v1", "jobs")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
SCALED_OBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects")
HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers")
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies")
WEBHOOK_CONFIGURATIONS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations")


class ApiError(RuntimeError):
    """The API server refused a call."""

    def __init__(self, status: int, reason: str, message: str, causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.causes = causes
        """The fields a 422 names (``details.causes``: "spec.replicas: Invalid value: ...")."""


class NotFoundError(ApiError):
    """404: the object (or its namespace) does not exist."""


class ConflictError(ApiError):
    """409, or 422 from a failed JSON-patch test: the object changed meanwhile."""


class AlreadyExistsError(ConflictError):
    """409 on create: an object of that name exists."""


CredentialsProvider = Callable[[], kopf.ConnectionInfo]


class KubeClient:
    """One aiohttp session to the API server; use inside ``async with``."""

    def __init__(self, credentials: CredentialsProvider, *, retries: int = 4, backoff_s: float = 0.2) -> None:
        self._credentials = credentials
        self._retries = retries
        self._backoff_s = backoff_s
        self._info: kopf.ConnectionInfo | None = None
        self._ssl: ssl.SSLContext | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeClient:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30, sock_connect=5))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _connect(self, refresh: bool = False) -> kopf.ConnectionInfo:
        if self._info is None or refresh:
            self._info = self._credentials()
            self._ssl = self._info.as_ssl_context() if self._info.server.startswith("https") else None
        return self._info

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """One call with retries; returns the decoded JSON answer."""
        if self._session is None:
            raise RuntimeError("KubeClient used outside `async with`")
        refreshed = False
        for attempt in range(1, self._retries + 1):
            info = self._connect()
            url = info.server.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
            headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **info.as_http_headers()}
            if body is not None:
                headers["Content-Type"] = content_type
            try:
                async with self._session.request(
                    method, url, json=body, headers=headers, ssl=self._ssl or True
                ) as response:
                    status = response.status
                    payload = _decoded(await response.read()) if status != 204 else None
            except (aiohttp.ClientConnectionError, TimeoutError) as error:
                if attempt == self._retries:
                    raise ApiError(0, "Unreachable", f"{method} {path}: {error!r}") from None
                await asyncio.sleep(self._backoff_s * 2 ** (attempt - 1))
                continue
            if status < 400:
                if isinstance(payload, _Text):
                    raise ApiError(status, "NotJSON", f"{method} {path}: the answer is not JSON: {payload[:200]!r}")
                return payload
            if status == 401 and not refreshed:
                refreshed = True
                self._connect(refresh=True)
                continue
            if status in TRANSIENT and attempt < self._retries:
                log.debug("%s %s answered %d; retrying", method, path, status)
                await asyncio.sleep(self._backoff_s * 2 ** (attempt - 1))
                continue
            raise _error(status, method, path, payload)
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    async def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None if it does not exist."""
        try:
            found: dict[str, Any] = await self.request("GET", resource.path(namespace, name))
        except NotFoundError:
            return None
        return found

    async def list(
        self, resource: Resource, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Items of a collection (callers filter again: some servers ignore the selector)."""
        query = {"labelSelector": label_selector} if label_selector else None
        answer = await self.request("GET", resource.path(namespace), query=query)
        return list((answer or {}).get("items") or [])

    async def create(self, resource: Resource, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create; AlreadyExistsError if the name is taken."""
        try:
            created: dict[str, Any] = await self.request("POST", resource.path(namespace), body=body)
        except ConflictError as conflict:
            raise AlreadyExistsError(conflict.status, conflict.reason, str(conflict)) from None
        return created

    async def merge_patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """RFC 7386 merge patch (lists are replaced whole)."""
        patched: dict[str, Any] = await self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            body=patch,
            content_type="application/merge-patch+json",
        )
        return patched

    async def json_patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        ops: Sequence[Mapping[str, Any]],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """RFC 6902 JSON patch; a failed ``test`` op raises ConflictError. The server answers
        both a failed test and an invalid result with 422 Invalid; only the invalid result names
        its fields (``details.causes``), and it is no conflict: retried, it fails the same."""
        try:
            patched: dict[str, Any] = await self.request(
                "PATCH",
                resource.path(namespace, name, subresource),
                body=list(ops),
                content_type="application/json-patch+json",
            )
        except ApiError as error:
            if error.status == 422 and not error.causes and any(op.get("op") == "test" for op in ops):
                raise ConflictError(error.status, error.reason, str(error)) from None
            raise
        return patched

    async def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete in the background (dependents follow); False if it was already gone."""
        try:
            await self.request(
                "DELETE",
                resource.path(namespace, name),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
            )
        except NotFoundError:
            return False
        return True


class _Text(str):
    """An answer's body that is not JSON."""


def _decoded(body: bytes) -> object:
    """The answer's JSON, or its text. kube-apiserver answers a path of an API group it does
    not serve (KEDA's, not installed) with a plain-text 404 ("404 page not found"): that is a
    NotFound, not an unreachable server."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return _Text(body.decode("utf-8", errors="replace").strip())


def _error(status: int, method: str, path: str, payload: object) -> ApiError:
    reason = message = ""
    causes: tuple[str, ...] = ()
    if isinstance(payload, Mapping):
        reason = str(payload.get("reason", ""))
        message = str(payload.get("message", ""))[:500]
        listed = (payload.get("details") or {}).get("causes") or []
        causes = tuple(f"{c.get('field', '')}: {c.get('message', '')}" for c in listed if isinstance(c, Mapping))
    elif isinstance(payload, _Text):
        message = payload[:500]
    message = f"{method} {path}: {message or 'no message'}"
    if status == 404:
        return NotFoundError(status, reason or "NotFound", message)
    if status == 409:
        return ConflictError(status, reason or "Conflict", message)
    return ApiError(status, reason or "Error", message, causes)
