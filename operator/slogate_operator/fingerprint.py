"""The llama.cpp container of a pod template: what it runs, and its fingerprint.

A calibration describes one model + quantization + server settings + CPU. All of that
is visible in the container spec: the image (the llama.cpp build), command and args
(model path, threads, slots, context, batch, cache types), the ``LLAMA_ARG_*`` and
threading environment, the volumes holding the model (and the init containers that
fill them), and the CPU requests and limits. A change to any of these is a new model,
quantization or speed and triggers calibration; a change elsewhere (a label, the
replica count, another container) does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from slogate_operator.names import SIDECAR_CONTAINER

RELEVANT_ENV_PREFIXES = ("LLAMA_", "GGML_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
"""Environment that changes what llama-server loads or how fast it runs."""
SHELLS = frozenset({"sh", "bash", "ash", "dash", "zsh"})
DEFAULT_PORT = 8080

# llama-server reads these variables when the matching flag is absent.
ENV_FLAGS: Mapping[str, str] = {
    "LLAMA_ARG_MODEL": "--model",
    "LLAMA_ARG_PORT": "--port",
    "LLAMA_ARG_THREADS": "--threads",
    "LLAMA_ARG_THREADS_BATCH": "--threads-batch",
    "LLAMA_ARG_BATCH": "--batch-size",
    "LLAMA_ARG_UBATCH": "--ubatch-size",
    "LLAMA_ARG_CTX_SIZE": "--ctx-size",
    "LLAMA_ARG_N_PARALLEL": "--parallel",
    "LLAMA_ARG_CACHE_TYPE_K": "--cache-type-k",
    "LLAMA_ARG_CACHE_TYPE_V": "--cache-type-v",
    "LLAMA_ARG_FLASH_ATTN": "--flash-attn",
    "LLAMA_ARG_N_GPU_LAYERS": "--n-gpu-layers",
}
ENV_SWITCHES: Mapping[str, tuple[str, str]] = {
    "LLAMA_ARG_ENDPOINT_METRICS": ("--metrics", ""),
    "LLAMA_ARG_KV_UNIFIED": ("--kv-unified", "--no-kv-unified"),
    "LLAMA_ARG_CONT_BATCHING": ("--cont-batching", "--no-cont-batching"),
}
_TRUE = frozenset({"1", "true", "yes", "on", "enabled"})


class ContainerNotFoundError(ValueError):
    """The pod template has no container of that name (or none at all)."""


@dataclass(frozen=True, slots=True)
class LlamaContainer:
    """The llama.cpp container of a pod template and the facts the operator needs from it."""

    container: Mapping[str, Any]
    pod_spec: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.container["name"])

    def literal_env(self) -> dict[str, str]:
        """Variables with a literal value (valueFrom cannot be read from the spec)."""
        return {e["name"]: str(e.get("value", "")) for e in self.container.get("env") or () if "valueFrom" not in e}

    def server_args(self) -> list[str]:
        """llama-server's flags: those its LLAMA_ARG_* environment implies, then the command line.

        The command line comes last because llama-server prefers a flag over its variable
        (and `slogate calibrate --server-args` lets the last occurrence win).
        """
        env = self.literal_env()
        implied: list[str] = []
        for variable, flag in ENV_FLAGS.items():
            if variable in env:
                implied += [flag, env[variable]]
        for variable, (on, off) in ENV_SWITCHES.items():
            if variable in env:
                chosen = on if env[variable].strip().lower() in _TRUE else off
                implied += [chosen] if chosen else []
        return implied + self.command_line_flags()

    def command_line_flags(self) -> list[str]:
        """The flags after the llama-server executable in command + args.

        No command: the image's entrypoint is llama-server and args are its flags. A
        shell (``sh -c "exec llama-server ..."``): the script is split and read after the
        llama-server word. Otherwise command[0] is taken to be the server.
        """
        command = [str(part) for part in self.container.get("command") or ()]
        args = [str(part) for part in self.container.get("args") or ()]
        if not command:
            return args
        words = command + args
        if os.path.basename(command[0]) in SHELLS and len(command) >= 3 and command[1] == "-c":
            words = shlex.split(command[2])
        for index, word in enumerate(words):
            if os.path.basename(word).startswith("llama-server"):
                return words[index + 1 :]
        return words[1:]

    def flag_value(self, *names: str) -> str | None:
        """The last value given to any of ``names`` (``--flag value`` or ``--flag=value``)."""
        found = None
        flags = self.server_args()
        for index, word in enumerate(flags):
            flag, eq, inline = word.partition("=")
            if flag in names:
                if eq:
                    found = inline
                elif index + 1 < len(flags):
                    found = flags[index + 1]
        return found

    def port(self) -> int:
        """llama-server's port (``--port``, else LLAMA_ARG_PORT, else 8080)."""
        value = self.flag_value("--port")
        try:
            return int(value) if value is not None else DEFAULT_PORT
        except ValueError:
            return DEFAULT_PORT

    def model_path(self) -> str | None:
        """The GGUF path it loads (``-m``/``--model``/LLAMA_ARG_MODEL), if given as a path."""
        return self.flag_value("-m", "--model")

    def has_metrics(self) -> bool:
        """Whether /metrics is enabled (calibration and live rates read it)."""
        return "--metrics" in self.server_args()

    def mounted_volumes(self) -> list[dict[str, Any]]:
        """The pod's volumes this container mounts, in mount order."""
        by_name = {v["name"]: v for v in self.pod_spec.get("volumes") or ()}
        names = [m["name"] for m in self.container.get("volumeMounts") or ()]
        return [dict(by_name[n]) for n in dict.fromkeys(names) if n in by_name]

    def feeding_init_containers(self) -> list[dict[str, Any]]:
        """Init containers that mount one of its volumes: they may put the model there."""
        mine = {m["name"] for m in self.container.get("volumeMounts") or ()}
        return [
            dict(c)
            for c in self.pod_spec.get("initContainers") or ()
            if mine & {m["name"] for m in c.get("volumeMounts") or ()}
        ]


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


def fingerprint_inputs(llama: LlamaContainer, recalibrate: str | None = None) -> dict[str, Any]:
    """Everything that changes the model, its quantization or its speed."""
    container = llama.container
    resources = container.get("resources") or {}
    env = sorted(
        (e for e in container.get("env") or () if str(e.get("name", "")).startswith(RELEVANT_ENV_PREFIXES)),
        key=lambda e: str(e["name"]),
    )
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
        "command": list(container.get("command") or ()),
        "args": list(container.get("args") or ()),
        "env": env,
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


def container_fingerprint(llama: LlamaContainer, recalibrate: str | None = None) -> str:
    """16 hex digits of the sha256 of the canonical JSON of ``fingerprint_inputs``."""
    canonical = json.dumps(fingerprint_inputs(llama, recalibrate), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def shell_join(args: Sequence[str]) -> str:
    """Arguments as one shell-quoted string (for `slogate calibrate --server-args`)."""
    return shlex.join(args)
