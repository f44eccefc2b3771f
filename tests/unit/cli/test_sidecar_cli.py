"""`slogate sidecar`: the access log (on by default, off with --no-access-log) and a
client-port 404 for an admin path that says where that path is."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from builders import smollm2_profile
from fake_upstream import fake_upstream
from sidecar_harness import sidecar_in_front_of, thresholds_for
from slogate_cli.main import build_parser
from slogate_cli.sidecar_command import settings_from

ACCESS = "slogate.sidecar.access"


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
