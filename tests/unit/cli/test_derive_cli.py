"""`slogate derive`: a profile + SLO -> thresholds JSON; bad input is one line, exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders import smollm2_profile
from slogate_admission.schema import Thresholds
from slogate_cli.derive_command import parse_classes


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(smollm2_profile().model_dump_json(by_alias=True))
    return path


def derive(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", "derive", *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def test_derive_prints_thresholds(profile_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "thresholds.json"
    done = derive(
        "--profile", str(profile_file), "--slo-ttft", "2", "--slo-tpot", "0.02",
        "--classes", "interactive:1.0:1,batch:10", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = Thresholds.model_validate_json(done.stdout)
    assert Thresholds.model_validate_json(out.read_text()) == printed
    assert [c.name for c in printed.classes] == ["interactive", "batch"]
    assert printed.concurrency_cap == 3  # 45 tok/s at B=4 misses 20 ms/token
    assert printed.classes[1].concurrency_cap == 2
    assert printed.calibration_id == "cal-test"


def test_derive_from_a_policy_file(profile_file: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"slo": {"ttftSeconds": 3}, "concurrency": {"max": 2}}))
    done = derive("--profile", str(profile_file), "--policy", str(policy))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["concurrencyCap"] == 2


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--slo-ttft", "2"], "cannot read"),  # profile missing (path given below)
        (["--slo-tpot", "0.05"], "give --slo-ttft"),
        (["--slo-ttft", "2", "--classes", "a:x"], "ttft must be a number"),
        (["--slo-ttft", "2", "--classes", "a:1,a:2"], "unique"),
        (["--slo-ttft", "2", "--slo-tpot", "0.0001"], "per-token SLO"),
        (["--slo-ttft", "-1"], "must be > 0"),
    ],
)
def test_bad_input(profile_file: Path, args: list[str], fragment: str) -> None:
    profile = str(profile_file.with_name("absent.json")) if fragment == "cannot read" else str(profile_file)
    done = derive("--profile", profile, *args)
    assert done.returncode == 2
    assert fragment in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_corrupt_profile_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "profile.json"
    bad.write_text('{"id": "x"}')
    done = derive("--profile", str(bad), "--slo-ttft", "2")
    assert done.returncode == 2
    assert "invalid input at" in done.stderr


def test_parse_classes() -> None:
    assert parse_classes("interactive:1.0:1, batch:10,bulk") == [
        {"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1},
        {"name": "batch", "ttftSeconds": 10.0},
        {"name": "bulk"},
    ]
