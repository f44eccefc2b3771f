"""`slogate up`: a cached profile is reused only for the same fingerprint; Ctrl-C drains, a second
stops at once; the llama-server it starts dies with it."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from ports import free_ports
from process_table import children_of, gone
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_calibration.runtime import LlamaServer


def up(server: LlamaServer, state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "slogate_cli.main", "up", "--once", "--no-progress",
            "--upstream", server.url, "--server-args", shlex.join(server.args[1:]),
            "--state-dir", str(state), "--slo-ttft", "10", "--classes", "interactive:1:1,batch",
            *extra,
        ],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def test_up_reuses_a_profile_with_the_same_fingerprint(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    cache = tmp_path / "profiles" / f"{calibrated_profile.fingerprint}.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(calibrated_profile.model_dump_json(by_alias=True))
    done = up(llama_server, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"using cached profile {calibrated_profile.id}" in done.stderr
    assert "calibrating" not in done.stderr
    thresholds = Thresholds.model_validate_json((tmp_path / "thresholds.json").read_text())
    assert thresholds.calibration_id == calibrated_profile.id
    assert [c.name for c in thresholds.classes] == ["interactive", "batch"]
    assert "class interactive" in done.stdout  # the table


def test_up_calibrates_when_the_cached_profile_is_for_other_settings(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    # A profile cached for this server, but claiming another fingerprint: never trusted.
    stale = calibrated_profile.model_copy(update={"fingerprint": "0" * 16, "id": "stale"})
    cache = tmp_path / "profiles" / f"{calibrated_profile.fingerprint}.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(stale.model_dump_json(by_alias=True))
    done = up(llama_server, tmp_path, "--budget-seconds", "300")
    assert done.returncode == 0, done.stderr
    assert "calibrating (fingerprint" in done.stderr
    fresh = CalibrationProfile.model_validate_json(cache.read_text())
    assert fresh.fingerprint == calibrated_profile.fingerprint
    assert fresh.id != "stale"
    thresholds = Thresholds.model_validate_json((tmp_path / "thresholds.json").read_text())
    assert thresholds.calibration_id == fresh.id


def served_up(server: LlamaServer, state: Path, profile: CalibrationProfile) -> tuple[subprocess.Popen[str], int]:
    """`slogate up` serving in front of ``server`` (its profile cached), once its gate listens."""
    cache = state / "profiles" / f"{profile.fingerprint}.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(profile.model_dump_json(by_alias=True))
    port, admin_port = free_ports(2)
    process = subprocess.Popen(
        [
            sys.executable, "-m", "slogate_cli.main", "up", "--no-progress", "--upstream", server.url,
            "--server-args", shlex.join(server.args[1:]), "--state-dir", str(state), "--slo-ttft", "10",
            "--port", str(port), "--admin-port", str(admin_port),
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    for line in process.stderr:
        if "slogate gate at" in line:
            return process, port
    raise AssertionError(f"up exited ({process.wait()}) before its gate listened")


def test_the_first_ctrl_c_drains_and_says_so_and_the_second_stops_at_once(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    process, port = served_up(llama_server, tmp_path, calibrated_profile)
    assert process.stderr is not None
    try:
        # A stream that outlasts the test's two signals: ~2,000 tokens at tens per second.
        body = {"prompt": "Count on and on:", "n_predict": 2000, "stream": True, "ignore_eos": True}
        stream = requests.post(f"http://127.0.0.1:{port}/completion", json=body, stream=True, timeout=120)
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept: a dropped iterator closes the connection, and the client leaves
        assert next(lines).startswith(b"data: ")  # it is decoding
        process.send_signal(signal.SIGINT)
        said = next(line for line in process.stderr if line.startswith("slogate up: "))  # past the banner's wrap
        assert said.startswith("slogate up: stopping: new requests get 429, 1 admitted stream(s) may finish")
        assert "Ctrl-C again stops at once" in said
        assert process.poll() is None  # draining: the stream goes on
        refused = requests.post(
            f"http://127.0.0.1:{port}/completion", json={"prompt": "hi", "n_predict": 4}, timeout=30
        )
        assert refused.status_code == 429
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert "slogate up: stopped at once" in process.stderr.read()
        lines.close()
        stream.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_llama_server_up_starts_dies_when_up_is_killed(tmp_path: Path) -> None:
    """kill -9 of `up` (or a closed terminal) leaves no llama-server behind: it dies with its parent."""
    port, admin_port = free_ports(2)
    process = subprocess.Popen(
        [
            sys.executable, "-m", "slogate_cli.main", "up", "--no-progress", "--state-dir", str(tmp_path),
            "--slo-ttft", "10", "--port", str(port), "--admin-port", str(admin_port),
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        server = None
        for _ in range(1200):  # its llama-server starts once the model file is found
            found = children_of(process.pid)
            if found:
                server = found[0]
                break
            assert process.poll() is None, "up exited before starting llama-server"
            time.sleep(0.05)
        assert server is not None, "up started no llama-server"
        process.send_signal(signal.SIGKILL)
        process.wait()
        for _ in range(600):
            if gone(server):
                break
            time.sleep(0.05)
        assert gone(server), f"llama-server {server} outlived `up`"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
