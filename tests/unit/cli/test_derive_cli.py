"""`slogate derive`: a profile + SLO -> thresholds JSON; bad input is one line, exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from canned_profiles import smollm2_profile
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
        "--profile", str(profile_file), "--slo-tpot", "0.02",
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


def test_an_slo_below_the_smallest_useful_prompt_is_refused_naming_the_smallest(profile_file: Path) -> None:
    done = derive("--profile", str(profile_file), "--slo-ttft", "0.01")
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    # T_prefill(32) = 0.02 + 0.0029 · 32 + 1e-7 · 32² = 0.1129 s on the test profile.
    assert "a 32-token prompt, the smallest useful one" in line
    assert line.endswith("the smallest TTFT SLO this calibration can meet is 0.113 s")
    assert derive("--profile", str(profile_file), "--slo-ttft", "0.113").returncode == 0


def test_an_slo_short_of_the_reference_prompt_derives_with_a_warning(profile_file: Path) -> None:
    done = derive("--profile", str(profile_file), "--slo-ttft", "1")
    assert done.returncode == 0
    Thresholds.model_validate_json(done.stdout)
    assert done.stderr.splitlines() == [
        "slogate derive: warning: class 'default': prompts over 334 tokens are never admitted within its 1 s "
        "TTFT budget (a 512-token prompt needs 1.53 s on the calibrated server)"
    ]
    assert derive("--profile", str(profile_file), "--slo-ttft", "2").stderr == ""


def test_a_bad_class_name_is_explained_not_a_regex(profile_file: Path) -> None:
    done = derive("--profile", str(profile_file), "--slo-ttft", "2", "--classes", "interactive=1")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "argument --classes: class name 'interactive=1': lowercase letters, digits and '-' only" in line
    assert "name:ttft[:reserved]" in line
    assert "^[a-z0-9]" not in line


def test_slo_ttft_is_the_slo_of_every_class_without_its_own(profile_file: Path) -> None:
    def class_slos(slo_ttft: str) -> dict[str, float]:
        done = derive("--profile", str(profile_file), "--slo-ttft", slo_ttft, "--classes", "interactive:1:1,batch")
        assert done.returncode == 0, done.stderr
        return {c.name: c.ttft_slo_seconds for c in Thresholds.model_validate_json(done.stdout).classes}

    assert class_slos("20") == {"interactive": 1.0, "batch": 20.0}
    assert class_slos("50") == {"interactive": 1.0, "batch": 50.0}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--slo-ttft", "2", "--classes", "interactive:1:1,batch:10"],
            "slogate derive: error: --slo-ttft 2 applies to no class: every class in --classes sets its own ttft "
            "(interactive:1, batch:10); drop --slo-ttft, or a class's ttft to give it --slo-ttft's",
        ),
        (
            ["--classes", "interactive:1:1,batch,bulk"],
            "slogate derive: error: give --slo-ttft: it is the TTFT SLO of the classes without a ttft of their own "
            "in --classes (batch, bulk)",
        ),
        (
            ["--slo-tpot", "0.05"],
            "slogate derive: error: give --slo-ttft (or --policy): it is the TTFT SLO of the one class, default",
        ),
    ],
)
def test_slo_ttft_is_refused_where_it_applies_to_no_class_and_required_where_one_lacks_its_own(
    profile_file: Path, args: list[str], line: str
) -> None:
    done = derive("--profile", str(profile_file), *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [line]


def test_the_help_states_what_slo_ttft_means() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", "derive", "--help"],
        capture_output=True, text=True, check=False, timeout=60, env={"COLUMNS": "400", "PATH": ""},
    )  # fmt: skip
    text = " ".join(done.stdout.split())
    assert "TTFT SLO, seconds, of every class in --classes without a ttft of its own" in text
    assert "required unless every class sets its own, refused if every class does" in text


def test_tenants_derive_with_a_measured_output_weight(profile_file: Path) -> None:
    done = derive("--profile", str(profile_file), "--slo-ttft", "2", "--tenant-weights", "acme:3,globex:1")
    assert done.returncode == 0, done.stderr
    printed = Thresholds.model_validate_json(done.stdout)
    assert printed.tenants is not None
    assert printed.tenants.weights == {"acme": 3, "globex": 1}
    assert printed.tenants.output_weight_measured
    # A decoded token costs R / (B · r_decode(B)) prompt tokens: 4 streams of 45 tok/s here.
    assert printed.tenants.output_weight == pytest.approx(printed.prefill_tokens_per_second / (4 * 45))
    plain = Thresholds.model_validate_json(derive("--profile", str(profile_file), "--slo-ttft", "2").stdout)
    assert plain.tenants is None
    defaults = Thresholds.model_validate_json(
        derive("--profile", str(profile_file), "--slo-ttft", "2", "--tenants").stdout
    )
    assert defaults.tenants is not None
    assert (defaults.tenants.header, defaults.tenants.weights) == ("X-Slogate-Tenant", {})


@pytest.mark.parametrize(
    ("weights", "fragment"),
    [
        ("acme", "expected name:weight"),
        ("acme:x", "expected name:weight"),
        ("acme:0", "greater than 0"),
        ("a b:1", "a b"),
    ],
)
def test_bad_tenant_weights_are_one_line(profile_file: Path, weights: str, fragment: str) -> None:
    done = derive("--profile", str(profile_file), "--slo-ttft", "2", "--tenant-weights", weights)
    assert done.returncode == 2
    assert fragment in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
