"""`slogate sidecar`: one flag per setting, defaulting to SidecarSettings' own (and the
docs' flags table generated from them); the access log (on by default, off with
--no-access-log) and a client-port 404 for an admin path that says where that path is."""

from __future__ import annotations

import dataclasses
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from sidecar_harness import sidecar_in_front_of, thresholds_for
from slogate_cli.main import build_parser
from slogate_cli.sidecar_command import markdown_table, settings_from
from slogate_sidecar.settings import PromptCounting, SidecarSettings

ACCESS = "slogate.sidecar.access"
BASE = ["sidecar", "--upstream", "http://127.0.0.1:8080"]
DOCS = Path(__file__).resolve().parents[3] / "docs" / "sidecar.md"

# flag and value -> the SidecarSettings field it sets and what it holds then (not its default).
FLAGS: list[tuple[list[str], str, Any]] = [
    (["--host", "0.0.0.0"], "host", "0.0.0.0"),
    (["--port", "9001"], "port", 9001),
    (["--admin-port", "9002"], "admin_port", 9002),
    (["--thresholds", "/etc/t.json"], "thresholds_file", Path("/etc/t.json")),
    (["--class-header", "X-Tier"], "class_header", "X-Tier"),
    (["--prompt-counting", "estimate"], "prompt_counting", PromptCounting.ESTIMATE),
    (["--max-body-bytes", "4096"], "max_body_bytes", 4096),
    (["--max-output-tokens", "8192"], "max_output_tokens", 8192),
    (["--upstream-connect-timeout", "0.5"], "upstream_connect_timeout_s", 0.5),
    (["--upstream-read-timeout", "300"], "upstream_read_timeout_s", 300.0),
    (["--client-read-timeout", "90"], "client_read_timeout_s", 90.0),
    (["--poll-interval", "0.25"], "poll_interval_s", 0.25),
    (["--rate-max-age", "120"], "rate_max_age_s", 120.0),
    (["--expose-upstream-admin"], "expose_upstream_admin", True),
    (["--no-access-log"], "access_log", False),
    (["--drain-deadline", "10"], "drain_deadline_s", 10.0),
    (["--overload-status", "529"], "overload_status", 529),
]
DEFAULTS = SidecarSettings(upstream="http://127.0.0.1:8080")


def sidecar_parser() -> Any:
    return build_parser()._subparsers._group_actions[0].choices["sidecar"]  # type: ignore[union-attr]


def test_without_flags_the_settings_are_the_dataclass_defaults() -> None:
    assert settings_from(build_parser().parse_args(BASE)) == DEFAULTS


@pytest.mark.parametrize(("flag", "field", "expected"), FLAGS, ids=[f[0][0] for f in FLAGS])
def test_each_flag_sets_its_field(flag: list[str], field: str, expected: Any) -> None:
    assert getattr(DEFAULTS, field) != expected
    assert getattr(settings_from(build_parser().parse_args([*BASE, *flag])), field) == expected


def test_every_setting_has_a_flag(tmp_path: Path) -> None:
    token, classes, tenants = tmp_path / "token", tmp_path / "classes.json", tmp_path / "tenants.json"
    token.write_text("t")
    classes.write_text('{"k": "batch"}')
    tenants.write_text('{"k": "team-a"}')
    argv = [*BASE, "--admin-token-file", str(token), "--api-key-classes", str(classes)]
    argv += ["--api-key-tenants", str(tenants)]
    files = settings_from(build_parser().parse_args(argv))
    assert (files.admin_token_file, files.api_key_classes) == (token, {"k": "batch"})
    assert files.api_key_tenants == {"k": "team-a"}
    covered = {"upstream", "admin_token_file", "api_key_classes", "api_key_tenants"} | {field for _, field, _ in FLAGS}
    assert covered == {f.name for f in dataclasses.fields(SidecarSettings)}


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--class-header", "X Tier", "not an HTTP header name: 'X Tier'"),
        ("--class-header", "X-Tier:", "not an HTTP header name"),
        ("--poll-interval", "0", "must be > 0, got 0"),
        ("--rate-max-age", "-5", "must be > 0, got -5"),
        ("--client-read-timeout", "soon", "not a number: 'soon'"),
        ("--upstream-connect-timeout", "inf", "not a finite number"),
        ("--max-output-tokens", "0", "must be >= 1, got 0"),
    ],
)
def test_a_bad_value_is_one_line_on_stderr(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*BASE, flag, value])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert flag in line
    assert says in line


def test_the_docs_flags_table_is_the_parsers() -> None:
    table = markdown_table(sidecar_parser())
    assert table in DOCS.read_text()
    row = next(line for line in table.splitlines() if line.startswith("| `--rate-max-age` |"))
    assert row.endswith(f"(default: {DEFAULTS.rate_max_age_s}) |")  # the dataclass's default
    assert "| `--upstream` | llama-server base URL (same pod: http://127.0.0.1:8080) (required) |" in table


def test_the_access_log_is_on_by_default_and_off_with_the_flag() -> None:
    parser = build_parser()
    base = ["sidecar", "--upstream", "http://127.0.0.1:8080/"]
    assert settings_from(parser.parse_args(base)).access_log is True
    assert settings_from(parser.parse_args([*base, "--no-access-log"])).access_log is False
    assert settings_from(parser.parse_args(base)).upstream == "http://127.0.0.1:8080"


async def test_one_access_line_per_request_with_class_and_outcome(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS)
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile())) as gate,
    ):
        async with gate.session.post(gate.url + "/completion", json={"prompt": [1, 2, 3], "n_predict": 4}) as r:
            assert r.status == 200
            await r.read()
        # 3,000 prompt tokens never fit a 2,048-token slot: the sidecar's own 400.
        async with gate.session.post(gate.url + "/completion", json={"prompt": [1] * 3000, "n_predict": 4}) as r:
            assert r.status == 400
        async with gate.session.get(gate.url + "/healthz") as r:
            assert r.status == 200
    lines = [record.getMessage() for record in caplog.records if record.name == ACCESS]
    assert len(lines) == 3, lines
    admitted, too_large, health = (line.rsplit(" ", 1) for line in lines)
    assert admitted[0] == "POST /completion 200 class=default outcome=admit"
    assert too_large[0] == "POST /completion 400 class=default outcome=reject"
    assert health[0] == "GET /healthz 200 class=- outcome=-"
    assert all(duration.endswith("ms") for _, duration in (admitted, too_large, health))


async def test_no_access_lines_when_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS)
    thresholds = thresholds_for(smollm2_profile())
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds, access_log=False) as gate,
        gate.session.post(gate.url + "/completion", json={"prompt": [1, 2, 3], "n_predict": 4}) as r,
    ):
        assert r.status == 200
        await r.read()
    assert [record for record in caplog.records if record.name == ACCESS] == []


async def test_an_admin_path_on_the_client_port_names_the_admin_port(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        admin_port = probe.getsockname()[1]
    thresholds = thresholds_for(smollm2_profile())
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds, admin_port=admin_port) as gate,
    ):
        for path in ("/slogate/v1/state", "/metrics"):
            async with gate.session.get(gate.url + path) as r:
                assert r.status == 404
                message = (await r.json())["error"]["message"]
            assert (
                message
                == f"Not Found: GET {path} is served on the sidecar's admin port ({admin_port}), not on this client port"
            )
        async with gate.session.get(gate.url + "/slots") as r:
            assert "is not an endpoint of the slogate sidecar" in (await r.json())["error"]["message"]
        async with gate.session.get(gate.admin_url + "/slogate/v1/state") as r:
            assert r.status == 200
