"""Thresholds that are missing or corrupt: at boot, in a real `slogate sidecar` process, and pushed at runtime.

At boot the sidecar must stay alive but not ready, and say in one log line which file
and what is wrong with it; it becomes ready by itself once good thresholds are pushed.
A corrupt push at runtime is refused and the last good thresholds keep gating.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from sidecar_harness import TOKEN, thresholds_for

GOOD = thresholds_for(smollm2_profile())
HANG_GUARD_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def sidecar_process(upstream: str, thresholds: Path, tmp_path: Path) -> AsyncIterator[tuple[str, str, Path]]:
    """`slogate sidecar` as its own process; yields its URLs and its log file once alive."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    port, admin_port = free_port(), free_port()
    log = tmp_path / "sidecar.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "slogate_cli.main", "sidecar", "--upstream", upstream, "--thresholds", str(thresholds),
             "--port", str(port), "--admin-port", str(admin_port), "--admin-token-file", str(token)],
            stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(int(HANG_GUARD_S / 0.1)):
                try:
                    async with session.get(url + "/healthz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                assert process.poll() is None, log.read_text()
                await asyncio.sleep(0.1)
        yield url, admin_url, log
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()  # a clean stop, even never ready


async def until_ready(session: aiohttp.ClientSession, url: str) -> int:
    status = 0
    for _ in range(int(HANG_GUARD_S / 0.1)):
        async with session.get(url + "/readyz") as response:
            status = response.status
        if status == 200:
            break
        await asyncio.sleep(0.1)
    return status


BROKEN = {
    "missing": (None, "No such file or directory"),
    "not JSON": ('{"calibrationId": 3', "(document): Invalid JSON"),
    "empty": ("", "(document): Invalid JSON"),
    "wrong type": (GOOD.model_dump_json(by_alias=True).replace('"lMax":', '"lMax":"many","x":'), "lMax:"),
    "missing field": (
        json.dumps({k: v for k, v in json.loads(GOOD.model_dump_json(by_alias=True)).items() if k != "classes"}),
        "classes: Field required",
    ),
    "inconsistent": (
        GOOD.model_dump_json(by_alias=True).replace('"defaultClass":"default"', '"defaultClass":"gold"'),
        "defaultClass 'gold' is not one of",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
async def test_broken_thresholds_at_boot_not_ready_with_a_clear_log_line_until_a_push(
    tmp_path: Path, case: str, record_property: Callable[[str, object], None]
) -> None:
    content, reason = BROKEN[case]
    path = tmp_path / "thresholds.json"
    if content is not None:
        path.write_text(content)
    async with (
        fake_upstream() as upstream,
        sidecar_process(upstream.url, path, tmp_path) as (url, admin_url, log),
        aiohttp.ClientSession() as session,
    ):
        async with session.get(url + "/readyz") as response:
            assert response.status == 503
            assert "no thresholds" in (await response.json())["error"]["message"]
        async with session.post(url + "/completion", json={"prompt": [1, 2], "n_predict": 2}) as response:
            assert response.status == 503
        assert upstream.started == 0
        lines = [line for line in log.read_text().splitlines() if "unusable" in line]
        assert len(lines) == 1, log.read_text()
        assert f"thresholds file {path} unusable, not ready until thresholds are pushed: " in lines[0]
        assert reason in lines[0], lines[0]
        record_property("log_line", lines[0].split(" ERROR ", 1)[-1])

        # The operator's push makes it ready; nothing else is needed.
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.put(admin_url + "/slogate/v1/thresholds", data=GOOD.model_dump_json(by_alias=True),
                               headers=headers) as response:  # fmt: skip
            assert response.status == 200
        assert await until_ready(session, url) == 200
        async with session.post(url + "/completion", json={"prompt": [1, 2], "n_predict": 2}) as response:
            assert response.status == 200
        assert upstream.started == 1


async def test_a_corrupt_push_at_runtime_is_refused_and_the_last_good_thresholds_keep_gating(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    path = tmp_path / "thresholds.json"
    path.write_text(GOOD.model_dump_json(by_alias=True))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    pushes = [content for content, _ in BROKEN.values() if content is not None]
    async with (
        fake_upstream() as upstream,
        sidecar_process(upstream.url, path, tmp_path) as (url, admin_url, log),
        aiohttp.ClientSession() as session,
    ):
        assert await until_ready(session, url) == 200
        async with session.get(admin_url + "/slogate/v1/state") as response:
            before = (await response.json())["thresholds"]
        for content in pushes:
            async with session.put(admin_url + "/slogate/v1/thresholds", data=content, headers=headers) as response:
                assert response.status == 422, content[:80]
                assert (await response.json())["error"]["message"].startswith("invalid thresholds: ")
        async with session.get(admin_url + "/slogate/v1/state") as response:
            state = await response.json()
        assert state["thresholds"] == before
        assert state["ready"] is True
        async with session.get(admin_url + "/metrics") as response:
            metrics = await response.text()
        assert f'slogate_threshold_updates_total{{result="rejected"}} {float(len(pushes))}' in metrics
        async with session.post(url + "/completion", json={"prompt": [1, 2], "n_predict": 2}) as response:
            assert response.status == 200
        assert sum("rejected thresholds push" in line for line in log.read_text().splitlines()) == len(pushes)
        record_property("requests", len(pushes) + 1)
        record_property("faults", f"{len(pushes)} corrupt pushes")
