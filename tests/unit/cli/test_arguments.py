"""The CLI's value types and parser: a mistake is refused at parse time, naming the flag."""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ports import listening_port
from slogate_cli.arguments import (
    OneLineParser,
    check_ports_free,
    existing_file,
    http_url,
    output_file,
    port,
    positive_float,
    shell_words,
    state_dir,
)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something is listening on."""
    with listening_port() as port:
        yield port


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("https://llama.example", "https://llama.example"),
        ("http://[::1]:8080", "http://[::1]:8080"),
    ],
)
def test_a_base_url_is_accepted_without_its_trailing_slash(text: str, url: str) -> None:
    assert http_url(text) == url


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("localhost:8080", "needs http:// or https://"),  # parses as scheme "localhost"
        ("127.0.0.1:8080", "needs http:// or https://"),
        ("ftp://host", "needs http:// or https://"),
        ("http://:8080", "names no host"),
        ("http://host:99999", "not a URL"),
        ("http://host:80/v1", "no path"),
        ("http://host:80/?x=1", "no path or query"),
    ],
)
def test_a_url_that_is_not_a_servers_base_is_refused(text: str, fragment: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("e.g. http://127.0.0.1:8080")) as refused:
        http_url(text)
    assert fragment in str(refused.value)


def test_ports() -> None:
    assert port("0") == 0
    assert port("65535") == 65535
    for bad in ("65536", "-1", "http"):
        with pytest.raises(argparse.ArgumentTypeError):
            port(bad)


def test_files_that_must_exist(tmp_path: Path) -> None:
    present = tmp_path / "present.json"
    present.write_text("{}")
    assert existing_file(str(present)) == present
    with pytest.raises(argparse.ArgumentTypeError, match="no such file"):
        existing_file(str(tmp_path / "absent.json"))
    with pytest.raises(argparse.ArgumentTypeError, match="it is a directory"):
        existing_file(str(tmp_path))


def test_outputs_and_state_dirs_must_be_creatable(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert output_file(str(tmp_path / "new" / "deeper" / "out.json")) == tmp_path / "new" / "deeper" / "out.json"
    assert state_dir(str(tmp_path / "state")) == tmp_path / "state"
    assert state_dir(str(tmp_path)) == tmp_path
    with pytest.raises(argparse.ArgumentTypeError, match="it is a directory"):
        output_file(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="is not a directory"):
        output_file(str(a_file / "out.json"))
    with pytest.raises(argparse.ArgumentTypeError, match="cannot use"):
        state_dir(str(a_file))
    with pytest.raises(argparse.ArgumentTypeError, match="is not a directory"):
        state_dir(str(a_file / "state"))


def test_a_taken_port_is_named_by_its_flag(taken_port: int) -> None:
    with pytest.raises(ValueError, match=f"--admin-port {taken_port}: cannot listen on 127.0.0.1:{taken_port}"):
        check_ports_free("127.0.0.1", {"--port": 0, "--admin-port": taken_port})


def test_two_flags_on_one_port_are_refused() -> None:
    with pytest.raises(ValueError, match="--port and --admin-port are both 18081"):
        check_ports_free("127.0.0.1", {"--port": 18081, "--admin-port": 18081})


def test_free_ports_pass() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    check_ports_free("127.0.0.1", {"--port": free, "--admin-port": 0})


def parser() -> OneLineParser:
    p = OneLineParser(prog="slogate test")
    p.add_argument("--load", type=positive_float, default=3.0, help="a multiple")
    p.add_argument("--mode", choices=["estimate", "tokenize"], default="tokenize", help="how")
    p.add_argument("--name", help="no default to show")
    p.add_argument("--flag", action="store_true", help="off by default")
    return p


@pytest.mark.parametrize("value", ["-1x", "-inf", "-2", "-.5"])
def test_a_value_starting_with_a_minus_reaches_the_flags_type(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["--load", value])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "argument --load:" in line
    assert "expected one argument" not in line


def test_an_unknown_choice_suggests_the_close_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--mode", "tokenise"])
    (line,) = capsys.readouterr().err.splitlines()
    assert "did you mean tokenize?" in line
    assert "choose from estimate, tokenize" in line
    assert line.endswith("(see slogate test --help)")


def test_help_shows_real_defaults_only() -> None:
    text = " ".join(parser().format_help().split())
    assert "a multiple (default: 3.0)" in text
    assert "how (default: tokenize)" in text
    assert "(default: None)" not in text
    assert "(default: False)" not in text


def test_server_args_are_split_like_a_shell() -> None:
    assert shell_words("-m '/models/my model.gguf' -t 2") == ("-m", "/models/my model.gguf", "-t", "2")
    assert shell_words("") == ()
    with pytest.raises(argparse.ArgumentTypeError, match="no closing quotation"):
        shell_words('-m "unclosed')
