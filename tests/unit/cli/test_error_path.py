"""One error path: whatever goes wrong while a command runs is one line, `slogate X: error: ...`, exit 2.

(Mistakes in the flags themselves are the parser's: tests/unit/cli/test_main_cli.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from canned_profiles import smollm2_profile
from slogate_admission.schema import CalibrationProfile
from slogate_bench.runs import demo
from slogate_calibration.calibrate import BudgetExceededError, CalibrationError
from slogate_calibration.runtime import RuntimeNotFound
from slogate_cli import calibrate_command, simulate_command
from slogate_cli.main import main


def raising(error: BaseException) -> Any:
    def fail(*_args: Any, **_kwargs: Any) -> None:
        raise error

    return fail


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(smollm2_profile().model_dump_json(by_alias=True))
    return path


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    return line


def test_a_calibration_out_of_budget_exits_3_and_any_other_failure_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["calibrate", "--upstream", "http://127.0.0.1:9", "--no-progress"]
    monkeypatch.setattr(calibrate_command, "calibrate", raising(BudgetExceededError("prefill", 5.0)))
    assert main(argv) == 3
    assert one_line(capsys) == (
        "slogate calibrate: error: calibration exceeded its 5 s budget in stage 'prefill', before one timing of "
        "every point: the server answered slower than the budget allows (a busy or slow machine); give it more "
        "time (--budget-seconds, or the policy's calibration.budgetSeconds)"
    )
    monkeypatch.setattr(calibrate_command, "calibrate", raising(CalibrationError("http://127.0.0.1:9: unreachable")))
    assert main(argv) == 2
    assert one_line(capsys) == "slogate calibrate: error: http://127.0.0.1:9: unreachable"


def test_up_against_a_server_that_is_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["up", "--once", "--no-progress", "--upstream", "http://127.0.0.1:9", "--slo-ttft", "2",
                 "--state-dir", str(tmp_path)])  # fmt: skip
    assert code == 2
    assert one_line(capsys).startswith("slogate up: error: upstream http://127.0.0.1:9 unreachable (GET /props)")
    assert not (tmp_path / "thresholds.json").exists()


def test_the_demo_without_a_llama_server_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "locate", raising(RuntimeNotFound("no llama-server found: run `make llama`")))
    assert main(["demo", "--state-dir", str(tmp_path), "--no-progress"]) == 2
    assert one_line(capsys) == "slogate demo: error: no llama-server found: run `make llama`"


def test_what_if_flags_that_contradict_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["what-if", "--layers", "30"]) == 2
    assert one_line(capsys) == (
        "slogate what-if: error: --layers also needs --kv-heads, --head-dim, --kv-bytes-per-elem "
        "(or give --kv-bytes-per-token alone)"
    )


def invalid_profile() -> ValidationError:
    try:
        CalibrationProfile.model_validate({"fingerprint": "f"})
    except ValidationError as error:
        return error
    raise AssertionError("an empty profile validated")


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            PermissionError(13, "Permission denied", "/state/thresholds.json"),
            "/state/thresholds.json: Permission denied",
        ),
        (ValueError("first line\nsecond line"), "first line second line"),
        (invalid_profile(), "invalid input at id: Field required (and 6 more problems)"),
    ],
)
def test_whatever_the_error_it_is_one_line(
    error: Exception, line: str, monkeypatch: pytest.MonkeyPatch, profile_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setattr(simulate_command, "preview", raising(error))
    assert main(["simulate", "--profile", str(profile_file), "--slo-ttft", "2"]) == 2
    assert one_line(capsys) == f"slogate simulate: error: {line}"


def test_a_bug_is_not_a_mistake_it_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch, profile_file: Path) -> None:
    monkeypatch.setattr(simulate_command, "preview", raising(KeyError("runs")))
    with pytest.raises(KeyError, match="runs"):
        main(["simulate", "--profile", str(profile_file), "--slo-ttft", "2"])
