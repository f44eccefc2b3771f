"""`slogate demo` (the README's main job), short: both scenarios run and are reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from slogate_admission.schema import CalibrationProfile


def test_demo_prints_both_scenarios(calibrated_profile: CalibrationProfile, tmp_path: Path) -> None:
    # The demo's own llama-server has the session server's settings: same fingerprint,
    # so the session's measured profile is reused instead of calibrating again.
    cache = tmp_path / "profiles" / f"{calibrated_profile.fingerprint}.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(calibrated_profile.model_dump_json(by_alias=True))
    done = subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", "demo", "--seconds", "6", "--state-dir", str(tmp_path),
         "--plot", str(tmp_path / "demo.png")],
        capture_output=True, text=True, check=False, timeout=600,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"using cached profile {calibrated_profile.id}" in done.stderr
    assert "llama-server alone" in done.stdout
    assert "through slogate" in done.stdout
    gated = next(line for line in done.stdout.splitlines() if "through slogate" in line)
    cells = [c.strip() for c in gated.split("│") if c.strip()]
    sent, within, rejected = int(cells[1]), int(cells[2]), int(cells[3])
    assert sent > 0
    assert rejected > 0  # 3x the capacity: the gate must refuse some
    assert within > 0
    assert (tmp_path / "demo.png").read_bytes().startswith(b"\x89PNG")
    assert f"plot: {tmp_path / 'demo.png'}" in done.stdout.replace("\n", "")
