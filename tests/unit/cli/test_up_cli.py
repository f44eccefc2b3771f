"""`slogate up` and `slogate sidecar`: mistakes are found before anything starts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from canned_profiles import NOW, smollm2_profile
from ports import listening_port
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_calibration import profile_cache
from slogate_cli import up_command
from slogate_cli.main import main


class NeverStarted:
    """Stands in for llama-server: records a start, which these mistakes must prevent."""

    starts = 0

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        self.url, self.args = "http://127.0.0.1:9", ("llama-server",)

    def start(self) -> NeverStarted:
        NeverStarted.starts += 1
        return self

    def stop(self) -> None:
        pass


@pytest.fixture
def no_llama_server(monkeypatch: pytest.MonkeyPatch) -> type[NeverStarted]:
    NeverStarted.starts = 0
    monkeypatch.setattr(up_command, "LlamaServer", NeverStarted)
    monkeypatch.setattr(up_command, "locate", lambda: None)
    return NeverStarted


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something is listening on."""
    with listening_port() as port:
        yield port


def up(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(["up", "--no-progress", "--slo-ttft", "2", *argv])
    return code, capsys.readouterr().err.splitlines()


def test_a_taken_port_is_refused_before_llama_server_starts(
    no_llama_server: type[NeverStarted], taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = up(capsys, "--port", str(taken_port), "--admin-port", "0", "--state-dir", str(tmp_path))
    assert code == 2
    assert lines == [f"slogate up: error: --port {taken_port}: cannot listen on 127.0.0.1:{taken_port}: "
                     "Address already in use"]  # fmt: skip
    assert no_llama_server.starts == 0
    assert not (tmp_path / "llama-server.log").exists()


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--upstream", "http://127.0.0.1:9", "--threads", "8"], "--threads: for the llama-server `up` starts"),
        (["--server-args", "-t 2"], "--server-args describes an --upstream server"),
        (["--port", "18181", "--admin-port", "18181"], "--port and --admin-port are both 18181"),
        (["--classes", "a:1,a:2"], "class names must be unique"),
        (["--classes", "interactive:1:1,batch:10"], "--slo-ttft 2 applies to no class: every class in --classes"),
    ],
)
def test_flags_that_cannot_work_together_are_refused_before_anything_starts(
    no_llama_server: type[NeverStarted], argv: list[str], fragment: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    code, lines = up(capsys, "--state-dir", str(tmp_path), *argv)
    assert code == 2
    assert len(lines) == 1
    assert fragment in lines[0]
    assert no_llama_server.starts == 0


def test_a_class_without_its_own_ttft_needs_slo_ttft_before_anything_starts(
    no_llama_server: type[NeverStarted], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["up", "--no-progress", "--state-dir", str(tmp_path), "--classes", "interactive:1:1,batch"])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "slogate up: error: give --slo-ttft: it is the TTFT SLO of the classes without a ttft of their own "
        "in --classes (batch)"
    ]
    assert no_llama_server.starts == 0


def test_up_takes_the_policy_a_user_applies_and_refuses_a_broken_one_before_anything_starts(
    no_llama_server: type[NeverStarted], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = Path(__file__).parents[3] / "examples"
    policy = str(examples / "policy-minimal.yaml")
    code, lines = up(capsys, "--state-dir", str(tmp_path), "--policy", policy)  # with --slo-ttft 2
    assert code == 2
    assert lines == ["slogate up: error: give --policy or --slo-ttft, not both: the policy file says all of it"]
    broken = tmp_path / "policy.yaml"
    broken.write_text((examples / "policy-minimal.yaml").read_text().replace("ttftSeconds", "ttftSecs"))
    code = main(["up", "--no-progress", "--state-dir", str(tmp_path), "--policy", str(broken)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err == [f"slogate up: error: {broken}: invalid input at slo.ttftSecs: Extra inputs are not permitted"]
    assert no_llama_server.starts == 0


def test_the_sidecar_names_the_flag_of_a_taken_port(taken_port: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", "sidecar", "--upstream", "http://127.0.0.1:9",
         "--port", "0", "--admin-port", str(taken_port)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"slogate sidecar: error: --admin-port {taken_port}: cannot listen on 127.0.0.1:{taken_port}: "
        "Address already in use"
    ]


def test_the_thresholds_table_shows_each_class_and_the_deferral_rule() -> None:
    """Issue 28.2: no queue length from a reference request; each request's own bound, in words."""
    policy = Policy.model_validate(
        {
            "concurrency": {"max": 4},
            "classes": [
                {"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1},
                {"name": "batch", "ttftSeconds": 10},
            ],
        }
    )
    t = derive_thresholds(policy, smollm2_profile(), derived_at=NOW)
    console = Console(width=220, record=True)
    console.print(up_command.thresholds_table(smollm2_profile(), t))
    text = console.export_text()
    assert "L_max" not in text
    row = next(line for line in text.splitlines() if "│ class batch " in line)
    assert "cap 3" in row
    assert "own SLO 10 s" in row
    row = next(line for line in text.splitlines() if "│ deferral " in line)
    assert "its SLO less its own prefill (no cap)" in row


def test_up_uses_a_cached_profile_only_for_the_servers_fingerprint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up`, `demo`, the benchmarks and the soak share one cache lookup (slogate_calibration.profile_cache)."""
    fingerprint, calibrations = "f" * 16, []

    async def identify_server(_settings: object) -> object:
        return type("Identity", (), {"fingerprint": fingerprint})()

    async def calibrate(_settings: object, _hooks: object) -> CalibrationProfile:
        calibrations.append(1)
        return smollm2_profile(id="cal-fresh", durationS=61)

    monkeypatch.setattr(profile_cache, "identify_server", identify_server)
    monkeypatch.setattr(profile_cache, "calibrate", calibrate)
    cache = tmp_path / "profiles" / f"{fingerprint}.json"
    cache.parent.mkdir()
    cache.write_text(smollm2_profile(id="cal-other-server", fingerprint="0" * 16).model_dump_json(by_alias=True))
    argv = ["--once", "--upstream", "http://127.0.0.1:9", "--state-dir", str(tmp_path)]
    code, lines = up(capsys, *argv)
    assert code == 0
    said = " ".join(" ".join(lines).split())  # rich wraps long lines at the terminal's width
    assert f"calibrating (fingerprint {fingerprint}, budget 90 s): no usable profile for it in {cache.parent}" in said
    assert f"calibrated cal-fresh in 61 s, cached at {cache}" in said
    assert Thresholds.model_validate_json((tmp_path / "thresholds.json").read_text()).calibration_id == "cal-fresh"
    code, lines = up(capsys, *argv)
    assert (code, calibrations) == (0, [1])
    assert f"using cached profile cal-fresh (fingerprint {fingerprint})" in " ".join(" ".join(lines).split())
