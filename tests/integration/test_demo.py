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
    lines = done.stdout.splitlines()
    header = [c.strip() for c in next(line for line in lines if "served late" in line).split("┃")[1:-1]]
    outcomes = ("within SLO", "served late", "rejected", "refused", "timed out", "errors")
    for name in ("llama-server alone", "through slogate"):
        row = dict(zip(header, [c.strip() for c in next(x for x in lines if name in x).split("│")[1:-1]], strict=True))
        assert sum(int(row[c]) for c in outcomes) == int(row["sent"]) > 0, row  # every request accounted for
    assert int(row["rejected"]) > 0  # through slogate at 3x the capacity: the gate must refuse some
    assert int(row["within SLO"]) > 0
    assert (tmp_path / "demo.png").read_bytes().startswith(b"\x89PNG")
    assert f"plot: {tmp_path / 'demo.png'}" in done.stdout.replace("\n", "")
