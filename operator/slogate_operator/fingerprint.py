"""The llama.cpp container of a pod template: what it runs, and its fingerprint.

A calibration describes one model + quantization + server settings + CPU. All of that
is visible in the container spec: the image (the llama.cpp build), llama-server's
settings (model path, threads, slots, context, batch, cache types: flags and
``LLAMA_ARG_*`` variables, read as llama-server reads them, see
``slogate_llama.flags``), the threading environment, the volumes holding
the model (and the init containers that fill them), and the CPU requests and limits.
A change to any of these is a new model, quantization or speed and triggers
calibration; a change elsewhere (a label, the replica count, another container, the
port, a flag's spelling or order) does not.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from slogate_llama.flags import ServerSettings, env_flags, flag_table, read_settings
from slogate_operator.names import ANNOTATION_RECALIBRATE, SIDECAR_CONTAINER

RELEVANT_ENV_PREFIXES = ("LLAMA_", "GGML_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
"""Environment that changes what llama-server loads or how fast it runs."""
SHELLS = frozenset({"sh", "bash", "ash", "dash", "zsh"})
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080

# llama-server settings that cannot change the model, its quantization or its speed:
# where and how it listens, which endpoints and UI it serves, who may call it, its
# connection timeouts, the names it gives the model, its logging, and the token it
# downloads with. They stay out of the fingerprint, so changing them recalibrates
# nothing. Everything else stays in, known or not: a needless recalibration (1-2
# minutes) is cheaper than a stale profile.
NOT_FINGERPRINTED = frozenset({
    "--host", "--port", "--reuse-port", "--path", "--api-prefix",  # listening
    "--metrics", "--props", "--slots", "--ui", "--ui-config", "--ui-config-file", "--ui-mcp-proxy",  # endpoints
    "--api-key", "--api-key-file", "--ssl-key-file", "--ssl-cert-file",  # authentication and TLS
    "--cors-origins", "--cors-methods", "--cors-headers", "--cors-credentials",  # CORS
    "--timeout", "--sse-ping-interval",  # connection timeouts
    "--alias", "--tags",  # the model's names in the API
    "--log-disable", "--log-file", "--log-jsonl", "--log-colors", "--verbose", "--verbosity",
    "--log-prefix", "--log-timestamps",  # logging
    "--hf-token",  # a credential; --hf-repo and --hf-file name the model
})  # fmt: skip

# $(VAR) in command, args and env values is expanded by Kubernetes; $$ is a literal $.
_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


class ContainerNotFoundError(ValueError):
    """The pod template has no container of that name (or none at all)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion; references it cannot resolve stay as written."""
    return _REFERENCE.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _describe(value_from: Mapping[str, Any]) -> str:
    kind = next(iter(value_from), "valueFrom")
    ref = value_from.get(kind)
    detail = ", ".join(f"{k}={v}" for k, v in sorted(ref.items())) if isinstance(ref, Mapping) else ""
    return f"{kind} ({detail})" if detail else kind


_FORCE = f" (the {ANNOTATION_RECALIBRATE} annotation on the policy forces one)"
_ASSUMED = {
    "--port": f"port {DEFAULT_PORT} is assumed",
    "--host": f"host {DEFAULT_HOST} is assumed",
    "--metrics": "/metrics is assumed off",
}


def _unreadable_note(variable: str, source: Mapping[str, Any], name: str | None) -> list[str]:
    """The note for a llama-server variable set by valueFrom (none if it cannot matter)."""
    what = f"{variable} comes from {_describe(source)}, which the operator cannot read"
    if name in _ASSUMED:
        return [f"{what}: {_ASSUMED[name]}"]
    if name in NOT_FINGERPRINTED:
        return []
    if "cpu" in str((source.get("resourceFieldRef") or {}).get("resource", "")):
        return [f"{what}: it follows the CPU requests and limits, which are fingerprinted"]
    if name == "--model":
        return [
            f"{what}: calibration asks llama-server for the model file, and changes do not trigger calibration{_FORCE}"
        ]
    return [
        f"{what}: llama-server's default for {name or variable} is assumed, and changes do not trigger "
        f"calibration{_FORCE}"
    ]


@dataclass(frozen=True, slots=True)
class LlamaContainer:
    """The llama.cpp container of a pod template and the facts the operator needs from it."""

    container: Mapping[str, Any]
    pod_spec: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.container["name"])

    def env_entries(self) -> dict[str, Mapping[str, Any]]:
        """The container's ``env`` by name; a repeated name's last entry wins, as in the kubelet."""
        return {str(e["name"]): e for e in self.container.get("env") or ()}

    def literal_env(self) -> dict[str, str]:
        """Variables with a literal value, ``$(VAR)`` expanded (valueFrom cannot be read from the spec)."""
        env: dict[str, str] = {}
        for name, entry in self.env_entries().items():
            if "valueFrom" not in entry:
                env[name] = expand(str(entry.get("value", "")), env)
        return env

    def unreadable_env(self) -> dict[str, Mapping[str, Any]]:
        """Variables whose value comes from valueFrom (a Secret, a ConfigMap, a field): name -> valueFrom."""
        return {name: e["valueFrom"] for name, e in self.env_entries().items() if "valueFrom" in e}

    def _words(self) -> tuple[list[str], list[str]]:
        """(the words that launch llama-server, ending with it; the words after it: its flags)."""
        env = self.literal_env()
        command = [expand(str(part), env) for part in self.container.get("command") or ()]
        args = [expand(str(part), env) for part in self.container.get("args") or ()]
        if not command:
            return [], args
        launch, words = [], command + args
        if os.path.basename(command[0]) in SHELLS and len(command) >= 3 and command[1] == "-c":
            launch, words = command[:2], shlex.split(command[2])
        for index, word in enumerate(words):
            if os.path.basename(word).startswith("llama-server"):
                return launch + words[: index + 1], words[index + 1 :]
        return launch + words[:1], words[1:]

    def launch(self) -> list[str]:
        """What runs llama-server, up to its executable (``taskset -c 0-1 llama-server``); [] for the entrypoint.

        In the fingerprint: another executable may be another build, and a wrapper may pin CPUs.
        """
        return self._words()[0]

    def executable(self) -> str | None:
        """The llama-server executable the command runs (None: the image's entrypoint)."""
        launch = self.launch()
        return launch[-1] if launch else None

    def command_line_flags(self) -> list[str]:
        """The flags after the llama-server executable in command + args.

        No command: the image's entrypoint is llama-server and args are its flags. A
        shell (``sh -c "exec llama-server ..."``): the script is split and read after the
        llama-server word. Otherwise command[0] is taken to be the server.
        """
        return self._words()[1]

    def settings(self) -> ServerSettings:
        """llama-server's settings: its literal variables, then the command line, folded."""
        return read_settings(self.literal_env(), self.command_line_flags())

    def server_args(self) -> list[str]:
        """llama-server's flags: those its literal variables imply, then the command line as written.

        The command line comes last because llama-server prefers a flag over its variable
        (and `slogate calibrate --server-args` lets the last occurrence win).
        """
        return env_flags(self.literal_env()) + self.command_line_flags()

    def host(self) -> str:
        """Where llama-server listens (``--host``/LLAMA_ARG_HOST, else 127.0.0.1); may be a list or a socket."""
        value = self.settings().get("--host")
        return value if isinstance(value, str) else DEFAULT_HOST

    def port(self) -> int:
        """llama-server's port (``--port``, else LLAMA_ARG_PORT, else 8080)."""
        value = self.settings().get("--port")
        try:
            return int(value) if isinstance(value, str) else DEFAULT_PORT
        except ValueError:
            return DEFAULT_PORT

    def model_path(self) -> str | None:
        """The GGUF path it loads (``-m``/``--model``/LLAMA_ARG_MODEL), if given as a path."""
        value = self.settings().get("--model")
        return value if isinstance(value, str) else None

    def has_metrics(self) -> bool:
        """Whether /metrics is enabled (calibration and live rates read it)."""
        return self.settings().get("--metrics") is True

    def notes(self) -> list[str]:
        """What the operator had to assume about llama-server's settings, one sentence each."""
        settings, table = self.settings(), flag_table()
        notes: list[str] = []
        for variable, source in self.unreadable_env().items():
            found = table.by_env(variable)
            name = found[0].name if found else None
            if variable.startswith("LLAMA_ARG_") and name not in settings.from_command_line:
                notes += _unreadable_note(variable, source, name)
        for source in self.container.get("envFrom") or ():
            prefix = str(source.get("prefix", ""))
            if not prefix or any(v.startswith(prefix) for v in table.variables):
                kind = "configMap" if "configMapRef" in source else "secret" if "secretRef" in source else "source"
                ref = source.get("configMapRef") or source.get("secretRef") or {}
                notes.append(
                    f"envFrom {kind} {ref.get('name', '?')!r} may set LLAMA_ARG_* variables, which the operator "
                    f"cannot read: none is assumed set, and changes to them do not trigger calibration{_FORCE}"
                )
        port = settings.get("--port")
        if port is None and "LLAMA_ARG_PORT" not in self.env_entries():
            notes.append(
                f"llama-server's port is not given (no --port, no LLAMA_ARG_PORT): {DEFAULT_PORT} is assumed, "
                "and an LLAMA_ARG_PORT baked into the image would not be seen"
            )
        elif isinstance(port, str) and not port.isdigit():
            notes.append(f"llama-server's port {port!r} is not a number: {DEFAULT_PORT} is assumed")
        if not self.has_metrics():
            notes.append(
                "llama-server runs without --metrics: the sidecar has no live prefill rate, and calibration "
                "enables /metrics for its own run only"
            )
        notes += [
            f"llama-server rejects {word!r} (invalid argument): pass the value as the next argument"
            for word in settings.joined
        ]
        if settings.unknown:
            notes.append(
                "llama-server arguments not in the operator's table of its flags are fingerprinted as written: "
                + shlex.join(settings.unknown)
            )
        return notes

    def mounted_volumes(self) -> list[dict[str, Any]]:
        """The pod's volumes this container mounts, in mount order."""
        return mounted_volumes(self.pod_spec, [self.container])

    def feeding_init_containers(self) -> list[dict[str, Any]]:
        """Init containers that mount one of its volumes: they may put the model there."""
        mine = {m["name"] for m in self.container.get("volumeMounts") or ()}
        return [
            dict(c)
            for c in self.pod_spec.get("initContainers") or ()
            if mine & {m["name"] for m in c.get("volumeMounts") or ()}
        ]


def mounted_volumes(pod_spec: Mapping[str, Any], containers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The pod's volumes that ``containers`` mount, each once, in mount order (copies)."""
    by_name = {v["name"]: v for v in pod_spec.get("volumes") or ()}
    wanted = [m["name"] for c in containers for m in c.get("volumeMounts") or ()]
    return [copy.deepcopy(dict(by_name[n])) for n in dict.fromkeys(wanted) if n in by_name]


def llama_container(pod_spec: Mapping[str, Any], name: str | None) -> LlamaContainer:
    """The named container, or the first one that is not the injected sidecar."""
    containers = [c for c in pod_spec.get("containers") or () if c.get("name") != SIDECAR_CONTAINER]
    if name is not None:
        for container in containers:
            if container.get("name") == name:
                return LlamaContainer(container, pod_spec)
        names = [c.get("name") for c in containers]
        raise ContainerNotFoundError(f"no container named {name!r} (the pod has {names})")
    if not containers:
        raise ContainerNotFoundError("the pod template has no container")
    return LlamaContainer(containers[0], pod_spec)


def cpu_millicores(quantity: object) -> str | None:
    """A CPU quantity in millicores: "2", 2, "2000m" and "2.0" are the same CPU."""
    if quantity is None:
        return None
    text = str(quantity).strip()
    try:
        value = Decimal(text[:-1]) if text.endswith("m") else Decimal(text) * 1000
    except InvalidOperation:
        return text
    return f"{value.normalize():f}m"


def _fingerprinted_env(llama: LlamaContainer) -> list[dict[str, Any]]:
    """Variables outside llama-server's settings that change its speed, and unreadable ones.

    A literal variable llama-server reads is in the settings already; one from valueFrom
    enters as its reference (its value cannot be read), unless its setting is excluded.
    """
    table, literal, entries = flag_table(), llama.literal_env(), []
    for name, entry in sorted(llama.env_entries().items()):
        found = table.by_env(name)
        if found is not None and (name in literal or found[0].name in NOT_FINGERPRINTED):
            continue
        if found is not None or name.startswith(RELEVANT_ENV_PREFIXES):
            entries.append(
                {"name": name, "valueFrom": entry["valueFrom"]}
                if name not in literal
                else {"name": name, "value": literal[name]}
            )
    return entries


def fingerprint_inputs(llama: LlamaContainer, recalibrate: str | None = None) -> dict[str, Any]:
    """Everything that changes the model, its quantization or its speed.

    llama-server's own settings enter normalised (``slogate_llama.flags``), so a flag's spelling,
    its order, or a variable in place of a flag changes nothing; the settings in
    ``NOT_FINGERPRINTED`` stay out.
    """
    container = llama.container
    resources = container.get("resources") or {}
    settings = llama.settings()
    mounts = sorted(
        (
            {"mountPath": m.get("mountPath"), "subPath": m.get("subPath", ""), "name": m["name"]}
            for m in container.get("volumeMounts") or ()
        ),
        key=lambda m: str(m["mountPath"]),
    )
    volumes = {v["name"]: {k: v[k] for k in sorted(v) if k != "name"} for v in llama.mounted_volumes()}
    feeders = [
        {key: c.get(key) for key in ("image", "command", "args", "env")} for c in llama.feeding_init_containers()
    ]
    inputs: dict[str, Any] = {
        "image": container.get("image"),
        "launch": llama.launch(),
        "server": {name: value for name, value in settings.values.items() if name not in NOT_FINGERPRINTED},
        # Unknown words keep their order: without the table, their meaning is unknown.
        "unknownArgs": list(settings.unknown),
        "env": _fingerprinted_env(llama),
        "envFrom": list(container.get("envFrom") or ()),
        "cpu": {
            "requests": cpu_millicores((resources.get("requests") or {}).get("cpu")),
            "limits": cpu_millicores((resources.get("limits") or {}).get("cpu")),
        },
        # The volume's source replaces its name: a renamed volume is the same model.
        "mounts": [
            {"mountPath": m["mountPath"], "subPath": m["subPath"], "source": volumes.get(m["name"])} for m in mounts
        ],
        "feeders": feeders,
    }
    if recalibrate:
        inputs["recalibrate"] = recalibrate
    return inputs


FINGERPRINT_VERSION = "2"
"""The algorithm of ``container_fingerprint``: bump it with any change to ``fingerprint_inputs``.
A calibration made under another version is kept if its ``container_digest`` still matches
(the container is as it was; only the way of hashing it changed), so an operator upgrade
recalibrates nothing unless a measured setting changed."""


DIGEST_LEAVES_OUT = ("ports", "lifecycle", "livenessProbe", "readinessProbe", "startupProbe")
"""What the sidecar's injection rewrites in the llama.cpp container (its port's name, the drain
hook, probes on that port), none of which changes the speed: the digest of a container is the
same injected or not, as its fingerprint is."""


def container_digest(llama: LlamaContainer) -> str:
    """16 hex digits of the sha256 of the container (but DIGEST_LEAVES_OUT), the volumes it
    mounts and the init containers that fill them, as the API server stores them: no other
    normalising, so it stays the same across versions of the fingerprint algorithm (and changes
    with any other edit of them, measured or not)."""
    container = {k: v for k, v in llama.container.items() if k not in DIGEST_LEAVES_OUT}
    raw = {"container": container, "volumes": list(llama.mounted_volumes()),
           "feeders": list(llama.feeding_init_containers())}  # fmt: skip
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def container_fingerprint(llama: LlamaContainer, recalibrate: str | None = None) -> str:
    """16 hex digits of the sha256 of the canonical JSON of ``fingerprint_inputs``."""
    canonical = json.dumps(fingerprint_inputs(llama, recalibrate), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def shell_join(args: Sequence[str]) -> str:
    """Arguments as one shell-quoted string (for `slogate calibrate --server-args`)."""
    return shlex.join(args)
