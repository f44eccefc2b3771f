"""Pure rules of a real Kubernetes control plane that the emulator (tests/kube_emulation.py)
applies and kmock does not: label and field selectors, pod spec validation, the kubelet's
view of probes and lifecycle hooks, RBAC verbs and kube-apiserver's refusal wording. No
I/O, no state.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# ------------------------------------------------------------------------------ selectors


class SelectorError(ValueError):
    """A selector kube-apiserver would answer 400 BadRequest."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One clause of a label selector: ``key op values``."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=" and "notin" match an absent key


_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQUALITY = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


def _clauses(text: str) -> Iterator[str]:
    """Split on the commas outside parentheses."""
    depth, start = 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            yield text[start:index]
            start = index + 1
    yield text[start:]


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """A label selector's string form (``a=b,c!=d,e in (f,g),!h,i``) as requirements."""
    if not text.strip():
        return ()
    found: list[Requirement] = []
    for clause in _clauses(text):
        if m := _SET.match(clause):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            found.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQUALITY.match(clause):
            found.append(Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", (m.group(3),)))
        elif m := _EXISTS.match(clause):
            found.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {clause.strip()!r} in label selector {text!r}")
    return tuple(found)


def label_selector_object(selector: Mapping[str, Any]) -> tuple[Requirement, ...]:
    """A LabelSelector object (matchLabels, matchExpressions) as requirements."""
    found = [Requirement(k, "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for term in selector.get("matchExpressions") or ():
        found.append(Requirement(term["key"], ops[term["operator"]], tuple(term.get("values") or ())))
    return tuple(found)


def labels_match(requirements: Sequence[Requirement], labels: Mapping[str, str] | None) -> bool:
    return all(r.matches(labels or {}) for r in requirements)


FIELDS = {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace")}


def parse_field_selector(text: str) -> tuple[tuple[tuple[str, str], bool, str], ...]:
    """``metadata.name=x,metadata.namespace!=y`` as (path, equal, value); other fields: 400."""
    found = []
    for clause in _clauses(text) if text.strip() else ():
        m = re.match(r"^\s*([\w.]+)\s*(==|=|!=)\s*(.*?)\s*$", clause)
        if m is None:
            raise SelectorError(f"invalid field selector: {clause!r}")
        if m.group(1) not in FIELDS:
            raise SelectorError(f"field label not supported: {m.group(1)}")
        found.append((FIELDS[m.group(1)], m.group(2) != "!=", m.group(3)))
    return tuple(found)


def fields_match(selector: Sequence[tuple[tuple[str, str], bool, str]], obj: Mapping[str, Any]) -> bool:
    return all(((obj.get(a) or {}).get(b) == value) == equal for (a, b), equal, value in selector)


# ------------------------------------------------------------------------------ pod specs


def pod_spec_path(kind: str) -> tuple[str, tuple[str, ...]] | None:
    """Where a kind keeps its pod spec: (field path for messages, keys to walk)."""
    return {
        "Pod": ("spec", ("spec",)),
        "Deployment": ("spec.template.spec", ("spec", "template", "spec")),
        "Job": ("spec.template.spec", ("spec", "template", "spec")),
    }.get(kind)


def pod_spec_of(kind: str, obj: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(field path, pod spec) of an object of ``kind``, or None if it has none."""
    where = pod_spec_path(kind)
    if where is None:
        return None
    node: Any = obj
    for key in where[1]:
        node = (node or {}).get(key)
    return (where[0], node) if isinstance(node, dict) else None


PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HOOKS = ("postStart", "preStop")
HOOK_HANDLERS = ("exec", "httpGet", "sleep")
"""A lifecycle handler's kinds; ``tcpSocket`` is deprecated and not validated (it fails at run time)."""
IANA_SVC_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*$")
DEFAULT_GRACE_SECONDS = 30


def pod_spec_errors(path: str, spec: Mapping[str, Any], kind: str) -> list[tuple[str, str, str]]:
    """kube-apiserver's validation of a pod spec, the part that matters here:
    (field, reason, detail) like ``("spec.containers[0].volumeMounts[0].name", "FieldValueNotFound",
    'Not found: "model"')``."""
    errors: list[tuple[str, str, str]] = []
    volumes: set[str] = set()
    for index, volume in enumerate(spec.get("volumes") or ()):
        if volume.get("name") in volumes:
            errors.append(
                (f"{path}.volumes[{index}].name", "FieldValueDuplicate", f'Duplicate value: "{volume["name"]}"')
            )
        volumes.add(volume.get("name"))
    if not spec.get("containers"):
        errors.append((f"{path}.containers", "FieldValueRequired", "Required value"))
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or ()):
            where = f"{path}.{group}[{index}]"
            name = container.get("name")
            if name in names:
                errors.append((f"{where}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
            names.add(name)
            for m, mount in enumerate(container.get("volumeMounts") or ()):
                if mount.get("name") not in volumes:
                    errors.append(
                        (f"{where}.volumeMounts[{m}].name", "FieldValueNotFound", f'Not found: "{mount.get("name")}"')
                    )
            errors += lifecycle_errors(where, container.get("lifecycle"), _grace(spec))
            if group == "initContainers" and container.get("restartPolicy") != "Always":
                errors += [(f"{where}.{probe}", "FieldValueForbidden",
                            "Forbidden: may not be set for init containers without restartPolicy=Always")
                           for probe in PROBES if probe in container]  # fmt: skip
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or grace < 0):
        errors.append((f"{path}.terminationGracePeriodSeconds", "FieldValueInvalid",
                       f"Invalid value: {json.dumps(grace)}: must be greater than or equal to 0"))  # fmt: skip
    if kind == "Job" and spec.get("restartPolicy") not in ("OnFailure", "Never"):
        errors.append((f"{path}.restartPolicy", "FieldValueNotSupported",
                       f'Unsupported value: "{spec.get("restartPolicy")}": supported values: "OnFailure", "Never"'))  # fmt: skip
    return errors


def _grace(spec: Mapping[str, Any]) -> int:
    grace = spec.get("terminationGracePeriodSeconds")
    return grace if isinstance(grace, int) else DEFAULT_GRACE_SECONDS


def lifecycle_errors(where: str, lifecycle: object, grace: int) -> list[tuple[str, str, str]]:
    """validateLifecycle: each hook has exactly one handler, and that handler is valid."""
    if not isinstance(lifecycle, Mapping):
        return []
    errors: list[tuple[str, str, str]] = []
    for hook in HOOKS:
        handler = lifecycle.get(hook)
        if handler is None:
            continue
        at = f"{where}.lifecycle.{hook}"
        kinds = [kind for kind in HOOK_HANDLERS if handler.get(kind) is not None]
        if not kinds:
            errors.append((at, "FieldValueRequired", "Required value: must specify a handler type"))
        errors += [(f"{at}.{kind}", "FieldValueForbidden", "Forbidden: may not specify more than 1 handler type")
                   for kind in kinds[1:]]  # fmt: skip
        if kinds:
            errors += _handler_errors(f"{at}.{kinds[0]}", kinds[0], handler[kinds[0]], grace)
    return errors


def _handler_errors(at: str, kind: str, action: Mapping[str, Any], grace: int) -> list[tuple[str, str, str]]:
    if kind == "exec":
        return [] if action.get("command") else [(f"{at}.command", "FieldValueRequired", "Required value")]
    if kind == "sleep":
        seconds = action.get("seconds")
        if isinstance(seconds, int) and 0 <= seconds <= grace:
            return []
        return [(f"{at}.seconds", "FieldValueInvalid", f"Invalid value: {json.dumps(seconds)}: must be non-negative "
                 f"and less than terminationGracePeriodSeconds ({grace})")]  # fmt: skip
    errors = [] if action.get("path") else [(f"{at}.path", "FieldValueRequired", "Required value")]
    port = action.get("port")
    valid_port = (isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535) or (
        isinstance(port, str) and IANA_SVC_NAME.match(port) is not None
    )
    if not valid_port:
        errors.append((f"{at}.port", "FieldValueInvalid",
                       f"Invalid value: {json.dumps(port)}: must be a port number (1-65535) or an IANA_SVC_NAME"))  # fmt: skip
    if action.get("scheme", "HTTP") not in ("HTTP", "HTTPS"):
        errors.append((f"{at}.scheme", "FieldValueNotSupported",
                       f'Unsupported value: "{action.get("scheme")}": supported values: "HTTP", "HTTPS"'))  # fmt: skip
    return errors


# ------------------------------------------------------------------------------ the kubelet's probes and hooks


@dataclass(frozen=True, slots=True)
class Listener:
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class KubeletProblem:
    """A probe the kubelet could never pass (the API server accepts it, the pod never gets ready),
    or an HTTP lifecycle hook that could never reach anything (it fails at every stop)."""

    kind: str
    name: str
    container: str
    probe: str
    why: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: container {self.container!r} {self.probe}: {self.why}"


def _flag(argv: Sequence[str], flag: str) -> str | None:
    """The last value of ``--flag X`` or ``--flag=X`` (the last occurrence wins)."""
    found = None
    for index, word in enumerate(argv):
        if word == flag and index + 1 < len(argv):
            found = argv[index + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


def _env(container: Mapping[str, Any], name: str) -> str | None:
    for var in container.get("env") or ():
        if var.get("name") == name and "value" in var:
            return str(var["value"])
    return None


def _argv(container: Mapping[str, Any]) -> list[str]:
    """What the container runs; ``sh -c "..."`` is split as the shell would."""
    argv = [str(w) for w in [*(container.get("command") or ()), *(container.get("args") or ())]]
    if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in ("sh", "bash") and argv[1] == "-c":
        try:
            words = shlex.split(argv[2])
        except ValueError:
            return argv
        starts = [i for i, word in enumerate(words) if word.rsplit("/", 1)[-1].startswith("llama-server")]
        if starts:
            words = words[starts[0] :]
            ends = [i for i, word in enumerate(words) if word in ("&&", "||", ";", "|", "&")]
            return words[: ends[0]] if ends else words
    return argv


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def listeners(container: Mapping[str, Any]) -> list[Listener]:
    """Where a container listens. llama-server: --host/LLAMA_ARG_HOST (default 127.0.0.1!) and
    --port/LLAMA_ARG_PORT (default 8080), flags over variables; `slogate sidecar`: --host
    (default 127.0.0.1) at --port and --admin-port (8081, 8082); anything else: every
    declared containerPort on all interfaces."""
    argv = _argv(container)
    command = container.get("command") or ()
    runs_llama = bool(argv) and argv[0].rsplit("/", 1)[-1].startswith("llama-server")
    if runs_llama or (not command and "llama.cpp" in str(container.get("image", ""))):
        flags = argv[1:] if runs_llama else argv
        host = _flag(flags, "--host") or _env(container, "LLAMA_ARG_HOST") or "127.0.0.1"
        port = _int(_flag(flags, "--port") or _env(container, "LLAMA_ARG_PORT"), 8080)
        return [Listener(host, port)]
    if argv[:2] == ["slogate", "sidecar"] or (argv and argv[0].endswith("/slogate") and argv[1:2] == ["sidecar"]):
        host = _flag(argv, "--host") or "127.0.0.1"
        return [
            Listener(host, _int(_flag(argv, "--port"), 8081)),
            Listener(host, _int(_flag(argv, "--admin-port"), 8082)),
        ]
    return [Listener("0.0.0.0", int(p["containerPort"])) for p in container.get("ports") or () if "containerPort" in p]


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _probe_port(container: Mapping[str, Any], port: object) -> tuple[int | None, str]:
    if isinstance(port, int):
        return port, ""
    for declared in container.get("ports") or ():
        if declared.get("name") == port:
            return int(declared["containerPort"]), ""
    return None, f"no port named {port!r} in the container's ports"


def _actions(container: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(where, action) of each probe and HTTP lifecycle hook the kubelet sends to the pod."""
    for probe_name in PROBES:
        probe = container.get(probe_name) or {}
        action = probe.get("httpGet") or probe.get("tcpSocket") or probe.get("grpc")
        if action:
            yield probe_name, action
    lifecycle = container.get("lifecycle") or {}
    for hook in HOOKS:
        action = (lifecycle.get(hook) or {}).get("httpGet")
        if action:
            yield f"lifecycle.{hook}", action


def kubelet_problems(kind: str, name: str, spec: Mapping[str, Any]) -> list[KubeletProblem]:
    """Probes and HTTP hooks sent to the pod IP (no ``host``) that no container of the pod can
    answer: nothing listens on that port beyond loopback. A named port is looked up among
    the probed or hooked container's own ports, as the kubelet does."""
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    listening = [listener for c in containers for listener in listeners(c)]
    found = []
    for container in containers:
        for probe_name, action in _actions(container):
            if action.get("host"):
                continue
            port, why = _probe_port(container, action.get("port"))
            if port is not None:
                on_port = [listener for listener in listening if listener.port == port]
                if not on_port:
                    why = f"nothing in the pod listens on port {port}"
                elif all(loopback(listener.host) for listener in on_port):
                    hosts = ", ".join(sorted({listener.host for listener in on_port}))
                    why = f"port {port} listens on {hosts} only; the kubelet probes the pod IP"
            if why:
                found.append(KubeletProblem(kind, name, str(container.get("name")), probe_name, why))
    return found


# ------------------------------------------------------------------------------ RBAC

SERVICE_ACCOUNT = "system:serviceaccount:slogate:slogate"


def rbac_verb(method: str, name: str | None, params: Mapping[str, str]) -> str:
    """The RBAC verb of a request, as kube-apiserver's RequestInfoFactory derives it."""
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    if method == "DELETE" and not name:
        return "deletecollection"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())


def forbidden_message(verb: str, group: str, resource: str, namespace: str | None, name: str | None) -> str:
    """kube-apiserver's wording, e.g. 'deployments.apps "x" is forbidden: User "..." cannot get
    resource "deployments" in API group "apps" in the namespace "llm"'."""
    plural = resource.split("/", 1)[0]
    qualified = f"{plural}.{group}" if group else plural
    subject = f'{qualified} "{name}"' if name else qualified
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    return (f'{subject} is forbidden: User "{SERVICE_ACCOUNT}" cannot {verb} resource "{resource}" '
            f'in API group "{group}" {scope}')  # fmt: skip


def status_body(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ``Status`` object as kube-apiserver answers errors."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}  # fmt: skip
    if details:
        body["details"] = dict(details)
    return body


def qos_class(spec: Mapping[str, Any]) -> str:
    """The pod's QoS class (status.qosClass) from its containers' requests and limits."""
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed: Callable[[Mapping[str, Any]], bool] = lambda r: all(  # noqa: E731
        (r.get("limits") or {}).get(k) is not None
        and (r.get("requests") or {}).get(k, (r.get("limits") or {}).get(k)) == (r.get("limits") or {}).get(k)
        for k in ("cpu", "memory")
    )
    return "Guaranteed" if all(guaranteed(r) for r in resources) else "Burstable"
