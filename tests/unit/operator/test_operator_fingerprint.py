"""The llama.cpp container's fingerprint: what changes the model, quantization or speed
changes it; nothing else does (a flag's spelling, its order, a variable in place of a
flag, the port, /metrics). And what the operator must assume about llama-server's settings."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from manifests import llama_deployment
from slogate_calibration.server_args import SPEED_SETTINGS, speed_settings
from slogate_llama.flags import flag_table, read_settings
from slogate_operator.fingerprint import (
    NOT_FINGERPRINTED,
    ContainerNotFoundError,
    LlamaContainer,
    container_fingerprint,
    cpu_millicores,
    fingerprint_inputs,
    llama_container,
)
from slogate_operator.injection import injected_template
from slogate_operator.sidecar import SidecarConfig

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
    "CPU pinning before the server": lambda t: llama(t).update(command=["taskset", "-c", "0", "llama-server"]),
    "threads by variable (the flag removed)": lambda t: _move_to_env(t, "-t", "LLAMA_ARG_THREADS", "1"),
    "cache type by variable": lambda t: (
        llama(t).setdefault("env", []).append({"name": "LLAMA_ARG_CACHE_TYPE_V", "value": "q8_0"})
    ),
    "continuous batching off": lambda t: llama(t)["args"].append("-nocb"),
    "unified KV cache off by variable": lambda t: (
        llama(t).setdefault("env", []).append({"name": "LLAMA_ARG_NO_KV_UNIFIED", "value": "1"})
    ),
    "a flag unknown to the table": lambda t: llama(t)["args"].extend(["--from-the-future", "3"]),
    "a variable unknown to the table": lambda t: (
        llama(t)
        .setdefault("env", [])
        .append(
            {"name": "LLAMA_ARG_THREADS_BATCH", "value": "1"}  # not one llama-server reads, but kept
        )
    ),
    "a variable the command line refers to": lambda t: _threads_by_reference(t, "1"),
    "threads from a ConfigMap": lambda t: _move_to_env(t, "-t", "LLAMA_ARG_THREADS", None),
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
    "the port": set_arg("--port", "9000"),
    "the host": set_arg("--host", "127.0.0.1"),
    "/metrics off": lambda t: llama(t)["args"].remove("--metrics"),
    "the port by variable": lambda t: _move_to_env(t, "--port", "LLAMA_ARG_PORT", "8080"),
    "an API key from a Secret": lambda t: (
        llama(t)
        .setdefault("env", [])
        .append({"name": "LLAMA_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "key"}}})
    ),
    "logging and aliases": lambda t: llama(t)["args"].extend(["-lv", "4", "--log-timestamps", "-a", "smol"]),
    "the slots endpoint off": lambda t: llama(t)["args"].append("--no-slots"),
    "a timeout": lambda t: llama(t).setdefault("env", []).append({"name": "LLAMA_ARG_TIMEOUT", "value": "60"}),
    "an underscore in a long flag": lambda t: _respell(t, "-c", "--ctx_size"),
}
SIDECAR = SidecarConfig(policy="p", image="slogate", port=8081, admin_port=8082, upstream_port=8080,
                        prompt_counting="tokenize", token_secret="s")  # fmt: skip


def _move_to_env(template: dict[str, Any], flag: str, variable: str, value: str | None) -> None:
    """Drop ``flag`` and its value from the args; set ``variable`` (None: from a ConfigMap)."""
    args = llama(template)["args"]
    del args[args.index(flag) : args.index(flag) + 2]
    entry = {"name": variable, "value": value} if value is not None else {
        "name": variable, "valueFrom": {"configMapKeyRef": {"name": "llama", "key": variable}}}  # fmt: skip
    llama(template).setdefault("env", []).append(entry)


def _threads_by_reference(template: dict[str, Any], value: str) -> None:
    """``-t $(THREADS)``: Kubernetes expands it from the container's env."""
    set_arg("-t", "$(THREADS)")(template)
    llama(template).setdefault("env", []).append({"name": "THREADS", "value": value})


def _respell(template: dict[str, Any], flag: str, spelling: str) -> None:
    args = llama(template)["args"]
    args[args.index(flag)] = spelling


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


# -- one fingerprint for every spelling of the same settings ----------------------------------------

MODEL = ["-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port", "8080"]
REORDERED = ["--metrics", "-c", "8192", "--port", "8080", "-np", "4", "--host", "0.0.0.0", "-t", "2",
             "-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf"]  # fmt: skip
SAME_SETTINGS: dict[str, dict[str, Any]] = {
    "-t 2": {"args": [*MODEL, "-t", "2", "-np", "4", "-c", "8192", "--metrics"]},
    "--threads 2": {"args": [*MODEL, "--threads", "2", "-np", "4", "-c", "8192", "--metrics"]},
    "--threads=2": {"args": [*MODEL, "--threads=2", "-np", "4", "-c", "8192", "--metrics"]},
    "-t=2": {"args": [*MODEL, "-t=2", "-np", "4", "-c", "8192", "--metrics"]},
    "LLAMA_ARG_THREADS=2": {
        "args": [*MODEL, "-np", "4", "-c", "8192", "--metrics"],
        "env": [{"name": "LLAMA_ARG_THREADS", "value": "2"}],
    },
    "reordered": {"args": REORDERED},
    "long spellings, variables for the rest": {
        "args": ["--model", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--threads", "2"],
        "env": [
            {"name": "LLAMA_ARG_N_PARALLEL", "value": "4"},
            {"name": "LLAMA_ARG_CTX_SIZE", "value": "8192"},
            {"name": "LLAMA_ARG_HOST", "value": "0.0.0.0"},
            {"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "1"},
        ],
    },
    "a flag beats its variable": {
        "args": [*MODEL, "-t", "2", "-np", "4", "-c", "8192", "--metrics"],
        "env": [{"name": "LLAMA_ARG_THREADS", "value": "8"}],
    },
    "the last occurrence wins": {"args": [*MODEL, "-t", "8", "-np", "4", "-c", "8192", "--metrics", "--threads", "2"]},
}


def _with(fields: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = llama_deployment()["spec"]["template"]
    llama(template).update(copy.deepcopy(fields))
    return template


@pytest.mark.parametrize("spelling", sorted(SAME_SETTINGS))
def test_every_spelling_of_the_same_settings_has_one_fingerprint(spelling: str) -> None:
    original = llama_deployment()["spec"]["template"]
    assert fingerprint_of(_with(SAME_SETTINGS[spelling])) == fingerprint_of(original)


def test_a_shell_form_reads_the_same_settings() -> None:
    script = "exec llama-server " + " ".join(SAME_SETTINGS["-t 2"]["args"])
    shell = llama_container(_with({"command": ["sh", "-c", script], "args": []})["spec"], None)
    plain = llama_container(llama_deployment()["spec"]["template"]["spec"], None)
    assert shell.settings() == plain.settings()
    assert (shell.port(), shell.host(), shell.model_path(), shell.has_metrics()) == (
        8080, "0.0.0.0", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", True)  # fmt: skip
    # What launches it is named now (it may be another build than the entrypoint): that alone differs.
    inputs, shell_inputs = fingerprint_inputs(plain), fingerprint_inputs(shell)
    assert (shell.executable(), plain.executable()) == ("llama-server", None)
    assert shell_inputs.pop("launch") == ["sh", "-c", "exec", "llama-server"]
    assert inputs.pop("launch") == []
    assert shell_inputs == inputs


def test_switches_and_their_negations_fold() -> None:
    off = [
        read_settings({}, ["-nocb"]),
        read_settings({}, ["--no-cont-batching"]),
        read_settings({"LLAMA_ARG_CONT_BATCHING": "false"}, []),
        read_settings({"LLAMA_ARG_NO_CONT_BATCHING": "anything"}, []),
        read_settings({"LLAMA_ARG_CONT_BATCHING": "1", "LLAMA_ARG_NO_CONT_BATCHING": "1"}, []),
        read_settings({"LLAMA_ARG_CONT_BATCHING": "on"}, ["-cb", "--no-cont-batching"]),
    ]
    assert {tuple(s.values.items()) for s in off} == {(("--cont-batching", False),)}
    on = [read_settings({}, ["-cb"]), read_settings({"LLAMA_ARG_CONT_BATCHING": "enabled"}, [])]
    assert {tuple(s.values.items()) for s in on} == {(("--cont-batching", True),)}
    # A plain switch's variable counts only when truthy, as in llama-server.
    assert read_settings({"LLAMA_ARG_ENDPOINT_METRICS": "0"}, []).values == {}
    assert read_settings({"LLAMA_ARG_ENDPOINT_METRICS": "true"}, []).values == {"--metrics": True}


def test_settings_of_values_aliases_and_unknown_words() -> None:
    settings = read_settings(
        {"LLAMA_ARG_PORT": "9000", "LLAMA_ARG_THREADS": "8", "TZ": "UTC"},
        ["-ngl", "0", "--ctx_size", "512", "--control-vector-layer-range", "1", "5", "--shiny", "x", "-t"],
    )
    assert settings.values == {
        "--control-vector-layer-range": "1 5", "--ctx-size": "512", "--gpu-layers": "0", "--port": "9000",
        "--threads": "8",
    }  # fmt: skip
    assert settings.from_command_line == {"--control-vector-layer-range", "--ctx-size", "--gpu-layers"}
    assert settings.unknown == ("--shiny", "x", "-t")  # -t without its value is not a setting
    assert read_settings({}, ["--metrics=1", "--threads=3"]).values == {"--threads": "3"}


def test_port_host_model_and_metrics_read_the_normalised_settings() -> None:
    default = _container(args=["-m", "/m.gguf"])
    assert (default.port(), default.host(), default.model_path(), default.has_metrics()) == (
        8080, "127.0.0.1", "/m.gguf", False)  # fmt: skip
    env = _container(env=[{"name": "LLAMA_ARG_PORT", "value": "9000"}, {"name": "LLAMA_ARG_HOST", "value": "::"},
                          {"name": "LLAMA_ARG_MODEL", "value": "/e.gguf"}])  # fmt: skip
    assert (env.port(), env.host(), env.model_path()) == (9000, "::", "/e.gguf")
    flags = _container(args=["--model", "/f.gguf", "--host", "0.0.0.0", "--port", "7000", "--metrics"],
                       env=[{"name": "LLAMA_ARG_PORT", "value": "9000"}])  # fmt: skip
    assert (flags.port(), flags.host(), flags.model_path(), flags.has_metrics()) == (7000, "0.0.0.0", "/f.gguf", True)
    referenced = _container(
        args=["--port", "$(PORT)", "--model", "$$(literal)"], env=[{"name": "PORT", "value": "9100"}]
    )
    assert (referenced.port(), referenced.model_path()) == (9100, "$(literal)")


def test_server_args_spell_variables_as_calibration_reads_them() -> None:
    """`slogate calibrate --server-args` reads flags only (speed_settings): variables become flags."""
    env = _container(
        args=["-t", "2"],
        env=[
            {"name": "LLAMA_ARG_THREADS", "value": "8"}, {"name": "LLAMA_ARG_N_GPU_LAYERS", "value": "0"},
            {"name": "LLAMA_ARG_BATCH", "value": "256"}, {"name": "LLAMA_ARG_UBATCH", "value": "128"},
            {"name": "LLAMA_ARG_CTX_SIZE", "value": "4096"}, {"name": "LLAMA_ARG_N_PARALLEL", "value": "2"},
            {"name": "LLAMA_ARG_CACHE_TYPE_K", "value": "q8_0"}, {"name": "LLAMA_ARG_CACHE_TYPE_V", "value": "q8_0"},
            {"name": "LLAMA_ARG_FLASH_ATTN", "value": "on"}, {"name": "LLAMA_ARG_NO_KV_UNIFIED", "value": "1"},
            {"name": "LLAMA_ARG_CONT_BATCHING", "value": "false"},
        ],
    )  # fmt: skip
    assert speed_settings(env.server_args()) == {
        "threads": "2", "gpu_layers": "0", "batch_size": "256", "ubatch_size": "128", "ctx_size": "4096",
        "parallel": "2", "cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on",
        "kv_unified": "false", "cont_batching": "false",
    }  # fmt: skip


def test_every_option_calibration_reads_is_in_the_table() -> None:
    table = flag_table()
    for name in SPEED_SETTINGS:
        assert table.option(name).name == name


def test_the_exclusions_name_real_options() -> None:
    """A flag renamed in a new llama.cpp must not silently leave an exclusion behind."""
    table = flag_table()
    for name in NOT_FINGERPRINTED:
        assert table.option(name).name == name
    assert "--threads" not in NOT_FINGERPRINTED


def test_the_table_is_consistent() -> None:
    table = flag_table()
    spellings = [s for o in table.options for s in (*o.flags, *o.negations)]
    assert len(spellings) == len(set(spellings))
    variables = [v for o in table.options for v in (o.env, o.negated_env) if v is not None]
    assert len(variables) == len(set(variables)) == len(table.variables)
    assert table.option("--parallel").flags == ("-np", "--parallel")
    assert table.option("--parallel").env == "LLAMA_ARG_N_PARALLEL"
    assert table.option("--kv-unified").negated_env == "LLAMA_ARG_NO_KV_UNIFIED"
    assert table.option("--metrics").values == 0
    assert len(table.options) > 200


# -- notes: what the operator had to assume ----------------------------------------------------------


def test_a_complete_spec_needs_no_notes() -> None:
    assert llama_container(llama_deployment()["spec"]["template"]["spec"], None).notes() == []


def test_notes_for_values_from_elsewhere() -> None:
    ref = {"configMapKeyRef": {"name": "llama", "key": "k"}}
    container = _container(
        args=["--port", "8080", "--metrics", "-np", "4"],
        env=[
            {"name": "LLAMA_ARG_THREADS", "valueFrom": ref},
            {"name": "LLAMA_ARG_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "LLAMA_ARG_MODEL", "valueFrom": ref},
            {"name": "LLAMA_ARG_N_PARALLEL", "valueFrom": ref},  # -np beats it: no note
            {"name": "LLAMA_ARG_THREADS_BATCH", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "LLAMA_API_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},  # not needed
        ],
        envFrom=[{"configMapRef": {"name": "llama-env"}}, {"prefix": "APP_", "secretRef": {"name": "app"}}],
    )
    notes = container.notes()
    assert len(notes) == 5, notes
    threads, host, model, threads_batch, env_from = notes
    assert threads.startswith("LLAMA_ARG_THREADS comes from configMapKeyRef (key=k, name=llama)")
    assert "default for --threads is assumed" in threads
    assert "recalibrate" in threads
    assert host.endswith("host 127.0.0.1 is assumed")
    assert "calibration asks llama-server for the model file" in model
    assert "follows the CPU requests and limits" in threads_batch
    assert env_from.startswith("envFrom configMap 'llama-env' may set LLAMA_ARG_* variables")  # APP_ cannot
    assert all(note.count(". ") == 0 and not note.endswith(".") for note in notes)  # one sentence each
    port = _container(args=["--metrics"], env=[{"name": "LLAMA_ARG_PORT", "valueFrom": ref}]).notes()
    assert port == ["LLAMA_ARG_PORT comes from configMapKeyRef (key=k, name=llama), which the operator cannot "
                    "read: port 8080 is assumed"]  # fmt: skip


def test_notes_for_a_missing_port_and_missing_metrics() -> None:
    port, metrics = _container(args=["-m", "/m.gguf"]).notes()
    assert "port is not given" in port
    assert "8080 is assumed" in port
    assert "baked into the image" in port
    assert "without --metrics" in metrics
    assert "calibration enables /metrics for its own run only" in metrics
    assert _container(args=["--metrics"], env=[{"name": "LLAMA_ARG_PORT", "value": "8080"}]).notes() == []
    assert _container(args=["--port", "8080"], env=[{"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "1"}]).notes() == []


def test_notes_for_what_llama_server_would_not_accept_or_the_table_does_not_know() -> None:
    notes = _container(args=["--port", "$(PORT)", "--metrics", "--threads=2", "--shiny", "1"]).notes()
    assert notes == [
        "llama-server's port '$(PORT)' is not a number: 8080 is assumed",
        "llama-server rejects '--threads=2' (invalid argument): pass the value as the next argument",
        "llama-server arguments not in the operator's table of its flags are fingerprinted as written: --shiny 1",
    ]
