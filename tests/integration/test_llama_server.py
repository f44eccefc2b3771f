"""The facts about the real llama-server that calibration and the gate rely on.

Each test pins one assumption: the slot layout `/props` and `/slots` report, the counters
`/metrics` exposes, that those counters advance by what a request's own `timings` report,
and that `/tokenize` counts exactly the tokens a prompt costs. Only relationships between
numbers are asserted, never durations: the machine is shared and noisy.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from slogate_calibration import runtime as runtime_module
from slogate_calibration.runtime import (
    ENV_LLAMA_SERVER,
    ENV_MODEL,
    LlamaRuntime,
    LlamaServer,
    LlamaServerError,
    RuntimeNotFound,
    locate,
)
from slogate_llama.counters import LlamaCounters, parse_unlabelled

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_PROMPT = "The capital of France is"
_N_PREDICT = 8


def _get(server: LlamaServer, path: str) -> tuple[str, str]:
    with _OPENER.open(server.url + path, timeout=60) as response:
        return response.headers.get("Content-Type", ""), response.read().decode()


def _get_json(server: LlamaServer, path: str) -> Any:
    return json.loads(_get(server, path)[1])


def _post_json(server: LlamaServer, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with _OPENER.open(request, timeout=120) as response:
        return json.loads(response.read())


def _counters(server: LlamaServer) -> LlamaCounters:
    return LlamaCounters.from_text(_get(server, "/metrics")[1])


def _complete(server: LlamaServer, prompt: str) -> dict[str, Any]:
    result: dict[str, Any] = _post_json(
        server,
        "/completion",
        # cache_prompt false: every prompt token is processed (and counted) again.
        {"prompt": prompt, "n_predict": _N_PREDICT, "temperature": 0, "cache_prompt": False},
    )
    return result


def test_props_report_four_slots_of_2048_cells(llama_server: LlamaServer) -> None:
    props = _get_json(llama_server, "/props")

    assert props["total_slots"] == 4
    # -c 8192 split over 4 slots (KV cache not unified): each slot holds 2,048 cells.
    assert props["default_generation_settings"]["n_ctx"] == 2048
    assert props["total_slots"] * props["default_generation_settings"]["n_ctx"] == 8192
    assert props["endpoint_metrics"] is True


def test_slots_endpoint_lists_every_slot_with_its_context(llama_server: LlamaServer) -> None:
    slots = _get_json(llama_server, "/slots")

    assert [slot["id"] for slot in slots] == [0, 1, 2, 3]
    assert {slot["n_ctx"] for slot in slots} == {2048}


def test_metrics_parse_into_llama_counters(llama_server: LlamaServer) -> None:
    content_type, body = _get(llama_server, "/metrics")
    samples = parse_unlabelled(body)
    counters = LlamaCounters.from_samples(samples)

    assert content_type.startswith("text/plain")
    assert all(name.startswith("llamacpp:") for name in samples)
    # Counters declared without `_total` keep their printed name (see slogate_llama.counters).
    assert "llamacpp:n_tokens_max" in samples
    assert "llamacpp:n_tokens_max_total" not in samples
    # The session server is idle between tests: nothing runs, nothing waits.
    assert counters.requests_processing == 0
    assert counters.requests_deferred == 0
    assert counters.prompt_tokens_cached_total is not None
    for value in (
        counters.prompt_tokens_total,
        counters.prompt_seconds_total,
        counters.tokens_predicted_total,
        counters.tokens_predicted_seconds_total,
        counters.n_decode_total,
    ):
        assert value >= 0


def test_completion_advances_counters_by_its_own_timings(llama_server: LlamaServer) -> None:
    before = _counters(llama_server)
    result = _complete(llama_server, _PROMPT)
    after = _counters(llama_server)
    timings = result["timings"]

    assert isinstance(result["content"], str)
    assert result["content"].strip()
    assert timings["prompt_n"] > 0
    assert 0 < timings["predicted_n"] <= _N_PREDICT
    assert after.prompt_tokens_total - before.prompt_tokens_total >= timings["prompt_n"]
    assert after.tokens_predicted_total - before.tokens_predicted_total >= timings["predicted_n"]
    # One decode call per generated token at most, at least one for the prompt.
    assert after.n_decode_total > before.n_decode_total
    assert after.prompt_seconds_total > before.prompt_seconds_total
    assert after.tokens_predicted_seconds_total > before.tokens_predicted_seconds_total
    assert after.requests_processing == 0


def test_tokenize_counts_the_tokens_a_prompt_costs(llama_server: LlamaServer) -> None:
    short = _post_json(llama_server, "/tokenize", {"content": "hello world"})["tokens"]
    longer = _post_json(llama_server, "/tokenize", {"content": "hello world " * 10})["tokens"]
    with_special = _post_json(llama_server, "/tokenize", {"content": _PROMPT, "add_special": True})["tokens"]
    result = _complete(llama_server, _PROMPT)

    assert short
    assert all(isinstance(token, int) for token in short)
    assert len(longer) > len(short)
    # The gate predicts prefill cost with /tokenize: it must match what the server
    # then actually processes for the same prompt (no cache).
    assert result["timings"]["prompt_n"] == len(with_special)
    assert _post_json(llama_server, "/detokenize", {"tokens": short})["content"] == "hello world"


def test_locate_finds_the_bundled_runtime(llama_runtime: LlamaRuntime) -> None:
    assert llama_runtime.server.name == "llama-server"
    assert llama_runtime.server.parent == llama_runtime.tools_dir
    assert llama_runtime.model.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert llama_runtime.model.stat().st_size > 50_000_000
    assert llama_runtime.tool("llama-quantize").parent == llama_runtime.tools_dir
    with pytest.raises(RuntimeNotFound, match="make llama"):
        llama_runtime.tool("llama-no-such-tool")


def test_env_overrides_take_precedence(
    llama_runtime: LlamaRuntime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model_copy = tmp_path / "other.gguf"
    model_copy.symlink_to(llama_runtime.model)
    monkeypatch.setenv(ENV_MODEL, str(model_copy))
    monkeypatch.setenv(ENV_LLAMA_SERVER, str(llama_runtime.server))

    runtime = locate()

    assert runtime.model == model_copy.resolve()
    assert runtime.server == llama_runtime.server.resolve()


@pytest.mark.parametrize(("variable", "missing_piece"), [(ENV_MODEL, "model file"), (ENV_LLAMA_SERVER, "not found")])
def test_broken_override_names_the_missing_piece(
    variable: str, missing_piece: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(variable, str(tmp_path / "absent"))

    with pytest.raises(RuntimeNotFound, match="make llama") as caught:
        locate()

    assert missing_piece in str(caught.value)
    assert str(tmp_path / "absent") in str(caught.value)


def test_start_failure_reports_the_log_and_reaps(llama_runtime: LlamaRuntime, tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not GGUF")
    server = LlamaServer(llama_runtime, bogus, parallel=1, ctx=512, log_path=tmp_path / "log")

    with pytest.raises(LlamaServerError, match="exited with code") as caught:
        server.start(timeout=60.0)

    assert str(bogus) in str(caught.value)  # the command line is in the message
    assert server.log_tail() in str(caught.value)
    assert server.log_tail() != "<empty log>"
    assert not server.running
    assert server.pid is None


def test_context_manager_serves_then_stops_and_reaps(llama_runtime: LlamaRuntime, tmp_path: Path) -> None:
    server = LlamaServer(llama_runtime, parallel=1, ctx=512, log_path=tmp_path / "log")
    assert "--metrics" in server.args
    assert server.args[server.args.index("--parallel") + 1] == "1"

    with server as running:
        pid = running.pid
        assert running.running
        assert _get_json(running, "/props")["total_slots"] == 1
        assert _get_json(running, "/health") == {"status": "ok"}

    assert pid is not None
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie: the pid no longer exists
    with pytest.raises(urllib.error.URLError):
        _get(server, "/health")


def test_explicit_port_in_use_fails_with_the_bind_error(llama_runtime: LlamaRuntime, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = LlamaServer(llama_runtime, port=port, parallel=1, ctx=512, log_path=tmp_path / "log")

        with pytest.raises(LlamaServerError, match="couldn't bind"):
            server.start(timeout=60.0)

    assert server.port == port  # an explicit port is never silently changed
    assert not server.running


def test_auto_port_taken_in_the_meantime_is_retried(
    llama_runtime: LlamaRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        stolen = taken.getsockname()[1]
        real_free_port = runtime_module._free_port
        picks = iter([stolen])
        monkeypatch.setattr(runtime_module, "_free_port", lambda host: next(picks, None) or real_free_port(host))
        server = LlamaServer(llama_runtime, parallel=1, ctx=512, log_path=tmp_path / "log")
        assert server.port == stolen

        with server:
            assert server.port != stolen
            assert _get_json(server, "/health") == {"status": "ok"}

    assert "couldn't bind" in (tmp_path / "log").read_text()


def test_stop_without_grace_kills_and_reaps(llama_runtime: LlamaRuntime, tmp_path: Path) -> None:
    server = LlamaServer(llama_runtime, parallel=1, ctx=512, log_path=tmp_path / "log")
    server.start(timeout=60.0)
    pid = server.pid

    server.stop(grace=0.0)  # no time for SIGTERM to finish: SIGKILL follows at once
    server.stop()  # idempotent

    assert pid is not None
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
