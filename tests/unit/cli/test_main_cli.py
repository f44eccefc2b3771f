"""The `slogate` dispatcher: --version, typos, --help with defaults, one-line errors."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from slogate_cli.arguments import HelpFormatter
from slogate_cli.demo_command import plot_path
from slogate_cli.main import build_parser, main


def slogate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", *args], capture_output=True, text=True, check=False, timeout=60
    )


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line `slogate argv` writes before exiting 2 (run in-process: no subprocess each)."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_version_is_the_distributions() -> None:
    done = slogate("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"slogate {importlib.metadata.version('slogate')}"


def test_an_unknown_command_names_the_close_one_and_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "derve", "--profile", "x")
    assert "unknown choice 'derve' (did you mean derive?)" in line
    assert "what-if, calibrate, derive, up, llama-server, sidecar, demo, simulate, operator" in line


def test_an_unknown_flag_is_reported_by_its_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "what-if", "--prefil-tps", "3")
    assert line.startswith("slogate what-if: error: unrecognized arguments: --prefil-tps 3")
    assert "did you mean --prefill-tps?" in line
    assert line.endswith("(see slogate what-if --help)")


def test_a_negative_load_reaches_the_load_parser(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "simulate", "--profile", __file__, "--load", "-1x")
    assert "load '-1x': must be a finite number > 0" in line


@pytest.mark.parametrize("command", ["calibrate", "up", "sidecar"])
def test_an_upstream_without_a_scheme_is_refused_at_once(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, command, "--upstream", "localhost:8080", "--slo-ttft", "2")
    assert "argument --upstream: 'localhost:8080' needs http:// or https://" in line


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["derive", "--profile", "/absent/profile.json", "--slo-ttft", "2"], "argument --profile: cannot read"),
        (["calibrate", "--upstream", "http://127.0.0.1:9", "--model", "/absent.gguf"], "argument --model: cannot read"),
        (["sidecar", "--upstream", "http://127.0.0.1:9", "--admin-token-file", "/absent"], "--admin-token-file"),
        (["sidecar", "--upstream", "http://127.0.0.1:9", "--port", "70000"], "argument --port: not a TCP port"),
        (["up", "--state-dir", __file__, "--slo-ttft", "2"], "argument --state-dir: cannot use"),
        (["demo", "--state-dir", __file__], "argument --state-dir: cannot use"),
        (["derive", "--profile", __file__, "--slo-ttft", "2", "--out", f"{__file__}/x.json"], "argument --out"),
        (["operator", "--metrics-port", "99999"], "argument --metrics-port: not a TCP port"),
        (["calibrate", "--upstream", "http://127.0.0.1:9", "--server-args", '-m "x'], "no closing quotation"),
    ],
)
def test_paths_ports_and_arguments_are_checked_at_parse_time(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fragment in refused(capsys, *argv)


def test_every_flag_with_a_default_shows_it_and_every_flag_has_help() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert isinstance(commands.choices, dict)
    for name, sub in commands.choices.items():
        formatter = HelpFormatter(sub.prog)
        for action in sub._actions:
            if not action.option_strings or action.dest in ("help", "version"):
                continue
            flag = f"slogate {name} {action.option_strings[0]}"
            assert action.help, f"{flag} has no help"
            if action.default not in (None, False, ""):  # "" and None both mean "not given"
                assert "default" in (formatter._get_help_string(action) or ""), f"{flag} hides its default"
        assert "(default: None)" not in " ".join(sub.format_help().split())
    sidecar = " ".join(commands.choices["sidecar"].format_help().split())
    assert "(default: 8081)" in sidecar
    assert "(default: tokenize)" in sidecar
    assert "larger request bodies get 413 (default: 1048576)" in sidecar
    simulate = " ".join(commands.choices["simulate"].format_help().split())
    assert "(default: 0.5x,1x,2x,4x)" in simulate


def test_the_demo_plot_goes_to_the_state_dir_unless_given(tmp_path: Path) -> None:
    parser = build_parser()
    assert plot_path(parser.parse_args(["demo", "--state-dir", str(tmp_path)])) == tmp_path / "demo.png"
    chosen = tmp_path / "elsewhere.png"
    assert plot_path(parser.parse_args(["demo", "--state-dir", str(tmp_path), "--plot", str(chosen)])) == chosen
