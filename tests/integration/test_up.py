"""`slogate up`: a cached profile is reused only for the same fingerprint."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

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
