"""The llama.cpp container's fingerprint: what changes the model, quantization or speed
changes it; nothing else does."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from operator_harness import llama_deployment
from slogate_calibration.server_args import speed_settings
from slogate_operator.fingerprint import (
    ContainerNotFoundError,
    LlamaContainer,
    container_fingerprint,
    cpu_millicores,
    llama_container,
)
from slogate_operator.injection import SidecarConfig, injected_template

Change = Callable[[dict[str, Any]], None]


def fingerprint_of(template: dict[str, Any]) -> str:
    return container_fingerprint(llama_container(template["spec"], None))


def llama(template: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = template["spec"]["containers"][0]
    return container


def set_arg(flag: str, value: str) -> Change:
    def change(t: dict[str, Any]) -> None:
        args = llama(t)["args"]
        args[args.index(flag) + 1] = value

    return change


RELEVANT: dict[str, Change] = {
    "threads": set_arg("-t", "1"),
    "slots": set_arg("-np", "2"),
    "context": set_arg("-c", "4096"),
    "another model file (quantization)": set_arg("-m", "/model/SmolLM2-135M-Instruct.Q8_0.gguf"),
    "llama.cpp build": lambda t: llama(t).update(image="ghcr.io/ggml-org/llama.cpp:server-b6000"),
    "cache type flag": lambda t: llama(t)["args"].extend(["-ctk", "q8_0"]),
    "LLAMA_ARG env": lambda t: llama(t).setdefault("env", []).append({"name": "LLAMA_ARG_BATCH", "value": "256"}),
    "OpenMP env": lambda t: llama(t).setdefault("env", []).append({"name": "OMP_NUM_THREADS", "value": "1"}),
    "CPU request": lambda t: llama(t)["resources"]["requests"].update(cpu="1"),
    "CPU limit": lambda t: llama(t)["resources"]["limits"].update(cpu="4"),
    "model volume source": lambda t: t["spec"]["volumes"][0].update(
        emptyDir=None, persistentVolumeClaim={"claimName": "m"}
    ),
    "model image of the init container": lambda t: t["spec"]["initContainers"][0].update(image="models:q8"),
    "command": lambda t: llama(t).update(command=["/app/llama-server"]),
}
IRRELEVANT: dict[str, Change] = {
    "a pod label": lambda t: t["metadata"]["labels"].update(team="ml"),
    "an annotation": lambda t: t["metadata"].setdefault("annotations", {}).update(note="x"),
    "memory": lambda t: llama(t)["resources"]["limits"].update(memory="4Gi"),
    "unrelated env": lambda t: llama(t).setdefault("env", []).append({"name": "TZ", "value": "UTC"}),
    "another container": lambda t: t["spec"]["containers"].append({"name": "log", "image": "busybox"}),
    "CPU spelled differently": lambda t: llama(t)["resources"]["requests"].update(cpu="2000m"),
    "a volume renamed": lambda t: _rename_volume(t, "weights"),
    "a probe": lambda t: llama(t).update(readinessProbe={"httpGet": {"path": "/health", "port": 8080}}),
    "the injected sidecar": lambda t: t.update(injected_template(t, SIDECAR)),
}
SIDECAR = SidecarConfig(policy="p", image="slogate", port=8081, admin_port=8082, upstream_port=8080,
                        prompt_counting="tokenize", token_secret="s")  # fmt: skip


def _rename_volume(template: dict[str, Any], name: str) -> None:
    template["spec"]["volumes"][0]["name"] = name
    for container in (*template["spec"]["containers"], *template["spec"]["initContainers"]):
        for mount in container.get("volumeMounts", []):
            mount["name"] = name


@pytest.mark.parametrize("what", sorted(RELEVANT))
def test_relevant_changes_change_the_fingerprint(what: str) -> None:
    template = llama_deployment()["spec"]["template"]
    changed = copy.deepcopy(template)
    RELEVANT[what](changed)
    assert fingerprint_of(changed) != fingerprint_of(template)


@pytest.mark.parametrize("what", sorted(IRRELEVANT))
def test_irrelevant_changes_keep_the_fingerprint(what: str) -> None:
    template = llama_deployment()["spec"]["template"]
    changed = copy.deepcopy(template)
    IRRELEVANT[what](changed)
    assert changed != template
    assert fingerprint_of(changed) == fingerprint_of(template)


def test_the_recalibrate_annotation_is_folded_in() -> None:
    container = llama_container(llama_deployment()["spec"]["template"]["spec"], None)
    assert container_fingerprint(container, "2026-12-01") != container_fingerprint(container)
    assert container_fingerprint(container, "2026-12-01") == container_fingerprint(container, "2026-12-01")


def test_container_is_found_by_name_or_first_and_never_the_sidecar() -> None:
    template = llama_deployment()["spec"]["template"]
    template["spec"]["containers"].insert(0, {"name": "slogate-sidecar", "image": "slogate"})
    assert llama_container(template["spec"], None).name == "llama"
    assert llama_container(template["spec"], "llama").name == "llama"
    with pytest.raises(ContainerNotFoundError, match="server"):
        llama_container(template["spec"], "server")
    with pytest.raises(ContainerNotFoundError, match="no container"):
        llama_container({"containers": []}, None)


def _container(**fields: Any) -> LlamaContainer:
    return LlamaContainer({"name": "llama", "image": "x", **fields}, {})


def test_server_args_from_args_shell_command_and_environment() -> None:
    plain = _container(args=["-m", "/m.gguf", "--port", "9000", "-t", "4"])
    assert plain.server_args() == ["-m", "/m.gguf", "--port", "9000", "-t", "4"]
    assert (plain.port(), plain.model_path(), plain.has_metrics()) == (9000, "/m.gguf", False)
    shell = _container(command=["sh", "-c", "exec /app/llama-server -m '/my models/m.gguf' --metrics -np 2"])
    assert shell.server_args() == ["-m", "/my models/m.gguf", "--metrics", "-np", "2"]
    assert shell.has_metrics()
    assert shell.port() == 8080
    explicit = _container(command=["/app/llama-server", "--threads=3"], args=["--port=7000"])
    assert explicit.server_args() == ["--threads=3", "--port=7000"]
    assert explicit.port() == 7000
    env = _container(
        args=["-t", "2"],
        env=[
            {"name": "LLAMA_ARG_THREADS", "value": "8"},
            {"name": "LLAMA_ARG_MODEL", "value": "/e.gguf"},
            {"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "1"},
            {"name": "LLAMA_ARG_PORT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        ],
    )
    # The command line wins over the environment, as in llama-server.
    assert speed_settings(env.server_args())["threads"] == "2"
    assert (env.model_path(), env.has_metrics(), env.port()) == ("/e.gguf", True, 8080)


def test_cpu_quantities_are_compared_as_millicores() -> None:
    assert cpu_millicores("2") == cpu_millicores(2) == cpu_millicores("2000m") == cpu_millicores("2.0") == "2000m"
    assert cpu_millicores("500m") == cpu_millicores("0.5") == "500m"
    assert cpu_millicores(None) is None
