"""`slogate llama-server`: the server `up` starts, in the foreground, exec'd.

The command line is checked against the one `up` builds; the exec itself (printed first,
the exit code passed through, SIGTERM reaching the server) against a stand-in binary
named by $SLOGATE_LLAMA_SERVER, so no model is loaded here (tests/integration/
test_walkthrough.py runs the real one)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ports import free_ports, listening_port
from slogate_calibration.runtime import ENV_LLAMA_SERVER, ENV_MODEL, LlamaRuntime, LlamaServerError
from slogate_cli import llama_server_command, up_command
from slogate_cli.main import build_parser, main

RUNTIME = LlamaRuntime(
    server=Path("/opt/llama/llama-server"), model=Path("/opt/models/m.gguf"), tools_dir=Path("/opt/llama")
)


class Execed(Exception):  # noqa: N818 - what happened, not a failure
    """Raised by the stand-in for os.execv, carrying what would have been run."""

    def __init__(self, path: str, argv: tuple[str, ...]) -> None:
        super().__init__(path)
        self.path, self.argv = path, argv


def fake_execv(path: str, argv: Any) -> None:
    raise Execed(path, tuple(argv))


@pytest.fixture
def located(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_server_command, "locate", lambda: RUNTIME)
    monkeypatch.setattr(up_command, "locate", lambda: RUNTIME)
    monkeypatch.setattr(os, "execv", fake_execv)


@pytest.fixture
def free_port() -> int:
    (port,) = free_ports()
    return port


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something is listening on."""
    with listening_port() as port:
        yield port


def up_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *argv: str) -> tuple[str, ...]:
    """The llama-server command line `up` starts with these flags (the start is stopped)."""
    seen: list[tuple[str, ...]] = []

    class Recording(up_command.LlamaServer):
        def start(self, *_args: Any, **_kwargs: Any) -> Recording:
            seen.append(self.args)
            raise LlamaServerError("stopped by the test")

    monkeypatch.setattr(up_command, "LlamaServer", Recording)
    code = main(["up", "--once", "--no-progress", "--slo-ttft", "2", "--state-dir", str(tmp_path), *argv])
    assert code == 2
    (args,) = seen
    return args


def without_port(argv: tuple[str, ...]) -> tuple[str, ...]:
    at = argv.index("--port")
    return argv[:at] + argv[at + 2 :]


@pytest.mark.usefixtures("located")
@pytest.mark.parametrize("flags", [[], ["--threads", "1", "--parallel", "2", "--ctx", "4096"]])
def test_it_runs_the_command_up_runs_and_prints_it_first(
    flags: list[str], free_port: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    with pytest.raises(Execed) as execed:
        main(["llama-server", "--port", str(free_port), *flags])
    argv = execed.value.argv
    assert execed.value.path == argv[0] == str(RUNTIME.server)
    assert capsys.readouterr().out.splitlines() == [shlex.join(argv)]
    assert argv[argv.index("--port") + 1] == str(free_port)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    # The very command `up` starts, but for the port (up picks a free one).
    assert without_port(argv) == without_port(up_command_line(monkeypatch, tmp_path, *flags))


def test_the_defaults_are_ups_and_the_port_the_other_commands_assume() -> None:
    args = build_parser().parse_args(["llama-server"])
    assert args.port == 8080
    assert (args.threads, args.parallel, args.ctx) == (up_command.THREADS, up_command.PARALLEL, up_command.CTX)


@pytest.mark.usefixtures("located")
def test_a_taken_port_or_port_0_is_one_line_and_nothing_runs(
    taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["llama-server", "--port", str(taken_port)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"slogate llama-server: error: --port {taken_port}: cannot listen on 127.0.0.1:{taken_port}: "
        "Address already in use"
    ]
    assert main(["llama-server", "--port", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "slogate llama-server: error: --port 0: give the port the next commands will use as --upstream"
    ]


def test_without_a_runtime_it_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, free_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_LLAMA_SERVER, str(tmp_path / "nowhere"))
    assert main(["llama-server", "--port", str(free_port)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("slogate llama-server: error: $SLOGATE_LLAMA_SERVER not found")
    assert line.endswith("run `make llama`")


@pytest.fixture
def stand_in(tmp_path: Path) -> dict[str, str]:
    """An environment whose "llama-server" is a shell script: prints its pid, waits for SIGTERM."""
    script = tmp_path / "llama-server"
    script.write_text(
        '#!/bin/sh\ntrap \'echo "terminated"; exit 7\' TERM\necho "pid $$"\nwhile :; do sleep 0.05; done\n'
    )
    script.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    return {**os.environ, ENV_LLAMA_SERVER: str(script), ENV_MODEL: str(model)}


def test_it_becomes_the_server_so_sigterm_stops_it_and_its_code_is_returned(
    stand_in: dict[str, str], free_port: int
) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "slogate_cli.main", "llama-server", "--port", str(free_port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=stand_in,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        command = proc.stdout.readline().rstrip("\n")
        assert shlex.split(command)[0] == stand_in[ENV_LLAMA_SERVER]
        assert shlex.split(command)[shlex.split(command).index("--model") + 1] == stand_in[ENV_MODEL]
        # exec, not a child: the process started is the server, and nothing is left behind.
        assert proc.stdout.readline() == f"pid {proc.pid}\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7
    assert out == "terminated\n"
    assert err == ""
