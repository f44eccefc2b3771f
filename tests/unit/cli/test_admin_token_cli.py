"""The admin token: `sidecar` warns once at start without one; `up` passes its own to the gate."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rich.console import Console

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from ports import free_ports
from sidecar_harness import thresholds_for
from slogate_cli import sidecar_command, up_command
from slogate_cli.main import build_parser, main
from slogate_sidecar.settings import SidecarSettings

WARNING = "the admin API refuses every threshold push (401) without --admin-token-file"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[SidecarSettings]:
    """`sidecar` runs up to serving, which returns at once with the settings recorded."""
    seen: list[SidecarSettings] = []

    async def serve_forever(settings: SidecarSettings) -> None:
        seen.append(settings)

    monkeypatch.setattr(sidecar_command, "serve_forever", serve_forever)
    return seen


@pytest.mark.parametrize("with_token", [False, True])
def test_the_sidecar_warns_once_at_start_without_a_token_file(
    with_token: bool, served: list[SidecarSettings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    caplog.set_level(logging.INFO)
    argv = ["sidecar", "--upstream", "http://127.0.0.1:9", "--port", "0", "--admin-port", "0"]
    assert main([*argv, "--admin-token-file", str(token)] if with_token else argv) == 0
    (settings,) = served
    assert settings.admin_token_file == (token if with_token else None)
    warnings = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ([] if with_token else [("slogate.sidecar", WARNING)])


def test_the_help_says_what_a_missing_token_file_means() -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("sidecar", "up"):
        text = " ".join(commands[name].format_help().split())
        assert "--admin-token-file" in text
        assert "401" in text, name
    assert WARNING.replace(" without --admin-token-file", "") in " ".join(commands["sidecar"].format_help().split())


def test_up_refuses_a_token_file_with_once_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("llama-server must not start")

    monkeypatch.setattr(up_command, "LlamaServer", never)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    argv = ["up", "--once", "--slo-ttft", "2", "--state-dir", str(tmp_path), "--admin-token-file", str(token)]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        "slogate up: error: --admin-token-file is for the gate `up` runs; --once runs none"
    ]


@pytest.mark.parametrize("with_token", [True, False])
async def test_ups_gate_takes_a_push_with_the_token_of_its_token_file(with_token: bool, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    port, admin_port = free_ports(2)
    argv = ["up", "--slo-ttft", "2", "--port", str(port), "--admin-port", str(admin_port)]
    args = build_parser().parse_args([*argv, "--admin-token-file", str(token)] if with_token else argv)
    thresholds = thresholds_for(smollm2_profile())
    pushed = thresholds_for(smollm2_profile(id="cal-pushed"))
    said = io.StringIO()
    async with fake_upstream() as fake, aiohttp.ClientSession() as session:
        gate = asyncio.create_task(up_command.serve_gate(fake.url, thresholds, args, Console(file=said, width=400)))
        try:
            admin = f"http://127.0.0.1:{admin_port}/slogate/v1"
            for _ in range(200):  # bounded: 10 s
                if "slogate gate at" in said.getvalue():
                    break
                await asyncio.sleep(0.05)
            body = pushed.model_dump_json(by_alias=True)
            async with session.put(admin + "/thresholds", data=body, headers={"Authorization": "Bearer s3cret"}) as r:
                assert r.status == (200 if with_token else 401)
            async with session.put(admin + "/thresholds", data=body, headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with session.get(admin + "/state") as r:
                assert (await r.json())["calibrationId"] == ("cal-pushed" if with_token else "cal-test")
        finally:
            gate.cancel()
            await asyncio.gather(gate, return_exceptions=True)
    line = " ".join(said.getvalue().split())
    if with_token:
        assert f"(threshold pushes with the bearer token in {token})" in line
    else:
        assert "(threshold pushes refused (401) without --admin-token-file)" in line
