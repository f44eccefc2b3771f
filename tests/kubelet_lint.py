"""What a kubelet would meet in a pod spec the API server accepted: probes and HTTP lifecycle
hooks that no container of the pod could ever answer (nothing listens on that port beyond
loopback). The API server takes such a spec; the pod then never becomes ready, or its preStop
hook fails at every stop. The operator tests' proxy (tests/api_proxy.py) checks every pod
spec it sees written, so a test fails where the e2e suite's real kubelet would hang.
No I/O, no state.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HOOKS = ("postStart", "preStop")


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
