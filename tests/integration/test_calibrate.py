"""`slogate calibrate` against the real llama-server, and its failure modes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from slogate_admission.schema import CalibrationProfile
from slogate_calibration.measure import DECODE_MIN_ROUNDS, DECODE_RULE, PREFILL_RULE, TOLERANCE, prefill_min_timings
from slogate_calibration.output import TERMINATION_MESSAGE_LIMIT, compact_json, summary_line
from slogate_calibration.runtime import LlamaServer
from slogate_llama.counters import LlamaCounters


def calibrate(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", "calibrate", "--no-progress", *args],
        capture_output=True, text=True, check=False, timeout=timeout,
    )  # fmt: skip


def test_profile_of_the_bundled_model(calibrated_profile: CalibrationProfile) -> None:
    p = calibrated_profile
    assert p.model.quantization == "Q4_1"
    assert (p.model.n_layers, p.model.n_kv_heads, p.model.head_dim) == (30, 3, 64)
    assert p.kv.bytes_per_token == 23_040  # 2 x 30 x 3 x 64 x 2 B, f16 cache
    assert p.kv.capacity_tokens == 4 * 2048
    assert p.kv.per_request_max_tokens == 2048
    assert (p.server.slots, p.server.threads, p.server.cache_type_k) == (4, 2, "f16")
    # Prefill measured from short prompts up to the per-slot context.
    lengths = sorted({pt.prompt_tokens for pt in p.prefill.points})
    assert lengths[0] <= 32
    assert lengths[-1] >= 2000
    # Decode measured at B = 1 .. slots; four streams share the bandwidth of one.
    assert [d.streams for d in p.decode] == [1, 2, 3, 4]
    assert p.decode[3].tokens_per_second < p.decode[0].tokens_per_second
    assert p.tokens_per_char is not None
    assert p.tokens_per_char.mean <= p.tokens_per_char.p95 <= p.tokens_per_char.max
    assert p.fingerprint_inputs["threads"] == "2"
    assert p.fingerprint_inputs["quantization"] == "Q4_1"


def test_every_point_says_how_often_it_was_timed_and_how_well(calibrated_profile: CalibrationProfile) -> None:
    p = calibrated_profile
    for point in p.prefill.points:
        assert point.timings is not None
        assert point.spread is not None
        assert prefill_min_timings(point.prompt_tokens) <= point.timings <= PREFILL_RULE.max_timings
    for d in p.decode:
        assert d.timings is not None
        assert d.spread is not None
        assert DECODE_MIN_ROUNDS <= d.timings <= DECODE_RULE.max_timings
    c = p.confidence
    assert c is not None
    assert (c.prefill_reference_tokens, c.decode_streams, c.tolerance) == (512, 4, TOLERANCE)
    # A point is listed as unsettled exactly when its stated uncertainty is above the tolerance.
    assert (c.prefill_uncertainty > c.tolerance) == (512 in c.unsettled_prefill_tokens)
    assert (c.decode_uncertainty > c.tolerance) == (4 in c.unsettled_decode_streams)
    assert set(c.unsettled_prefill_tokens) <= {pt.prompt_tokens for pt in p.prefill.points}
    assert "± " in summary_line(p)


def test_stdout_is_one_compact_json_line_under_4_kib(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    # The compact form of the real profile is what a Job's termination message carries.
    line = compact_json(calibrated_profile)
    assert "\n" not in line
    assert len(line.encode()) < TERMINATION_MESSAGE_LIMIT
    restored = CalibrationProfile.model_validate_json(line)
    assert restored.prefill.linear_s == calibrated_profile.prefill.linear_s
    assert restored.fingerprint == calibrated_profile.fingerprint
    assert restored.confidence == calibrated_profile.confidence


def test_unreachable_upstream_exit_2_and_no_file(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    done = calibrate("--upstream", "http://127.0.0.1:9", "--out", str(out), timeout=60)
    assert done.returncode == 2
    assert "unreachable" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temp file left either


def test_not_llama_server_exit_2(tmp_path: Path) -> None:
    # A plain static HTTP server: reachable, but no /props.
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert web.stdout is not None
        port = web.stdout.readline().split("port ")[1].split()[0]
        out = tmp_path / "profile.json"
        done = calibrate("--upstream", f"http://127.0.0.1:{port}", "--out", str(out), timeout=60)
        assert done.returncode == 2
        assert "llama-server" in done.stderr
        assert not out.exists()
    finally:
        web.terminate()
        web.wait()


@pytest.fixture
def busy_server(llama_server: LlamaServer) -> Iterator[LlamaServer]:
    """The session server with one long completion in flight."""
    body = json.dumps({"prompt": "Count slowly:", "n_predict": 400, "ignore_eos": True}).encode()
    request = urllib.request.Request(
        llama_server.url + "/completion", data=body, headers={"Content-Type": "application/json"}
    )
    worker = threading.Thread(target=lambda: urllib.request.urlopen(request, timeout=300).read())
    worker.start()
    for _ in range(200):
        with urllib.request.urlopen(llama_server.url + "/metrics") as response:
            if LlamaCounters.from_text(response.read().decode()).requests_processing > 0:
                break
        time.sleep(0.05)
    yield llama_server
    worker.join()  # leave the server idle for the next test


def test_busy_upstream_refused_without_force(busy_server: LlamaServer, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    done = calibrate("--upstream", busy_server.url, "--out", str(out), timeout=60)
    assert done.returncode == 2
    assert "--force" in done.stderr
    assert not out.exists()


def test_budget_exceeded_names_the_stage_and_writes_nothing(llama_server: LlamaServer, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    # Reading the GGUF header alone takes longer than 0.2 s: the budget must run out.
    done = calibrate("--upstream", llama_server.url, "--out", str(out), "--budget-seconds", "0.2")
    assert done.returncode == 3
    assert "budget" in done.stderr
    assert "in stage '" in done.stderr
    assert not out.exists()
