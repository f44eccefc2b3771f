"""The sidecar under injected upstream faults, bad input and missing thresholds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from ports import listening_port
from sidecar_harness import sidecar_in_front_of, thresholds_for
from slogate_sidecar.app import build_sidecar, running
from slogate_sidecar.settings import SidecarSettings
from slogate_sidecar.state import Sidecar

BODY = {"prompt": [1, 2, 3], "n_predict": 4}


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded, 5 s) for an asynchronous consequence; the caller asserts it."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0.05)


async def test_upstream_crash_mid_stream_gives_a_clean_error_and_no_leak(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile())) as gate,
    ):
        fake.mode = "crash"
        async with gate.session.post(gate.url + "/completion", json={**BODY, "stream": True}) as r:
            assert r.status == 200  # headers were already sent
            text = await r.text()
        assert '"error"' in text.splitlines()[-2] or '"error"' in text
        async with gate.session.post(gate.url + "/completion", json=BODY) as r:
            assert r.status == 502
            assert (await r.json())["error"]["code"] == "upstream_error"
        assert await gate.wait_idle()


async def test_upstream_stall_times_out_with_504(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile()), upstream_read_timeout_s=0.3) as gate,
    ):
        fake.mode = "stall"
        async with gate.session.post(gate.url + "/completion", json=BODY) as r:
            assert r.status == 504
            assert (await r.json())["error"]["code"] == "upstream_timeout"
        assert await gate.wait_idle()
        await until(lambda: fake.aborted == 1)
        assert fake.aborted == 1  # the stalled upstream request was closed, not left hanging


async def test_upstream_500_maps_to_502(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile())) as gate,
    ):
        fake.mode = "error500"
        async with gate.session.post(
            gate.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        ) as r:
            assert r.status == 502
        assert await gate.wait_idle()


async def test_upstream_down_gives_503_fast_and_not_ready(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile())) as gate,
    ):
        fake.healthy = False
        await until(lambda: not gate.sidecar.upstream_up)
        async with gate.session.get(gate.url + "/readyz") as r:
            assert r.status == 503
        async with gate.session.post(gate.url + "/completion", json=BODY) as r:
            assert r.status == 503
        assert fake.started == 0  # refused without trying the upstream
        fake.healthy = True  # it comes back: the sidecar recovers by itself
        await until(lambda: gate.sidecar.upstream_up)
        async with gate.session.post(gate.url + "/completion", json=BODY) as r:
            assert r.status == 200
        assert await gate.wait_idle()


async def test_client_disconnect_aborts_the_upstream_request(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile())) as gate,
    ):
        fake.mode = "stall"
        request = asyncio.create_task(gate.session.post(gate.url + "/completion", json={**BODY, "stream": True}))
        await until(lambda: fake.started == 1)
        await asyncio.sleep(0.1)
        request.cancel()
        try:
            response = await request
            response.close()
        except asyncio.CancelledError:
            pass
        await until(lambda: fake.aborted == 1)
        assert fake.aborted == 1
        assert await gate.wait_idle()


async def test_no_thresholds_means_not_ready(tmp_path: Path) -> None:
    async with fake_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, None) as gate:
        async with gate.session.get(gate.url + "/readyz") as r:
            assert r.status == 503
        async with gate.session.post(gate.url + "/completion", json=BODY) as r:
            assert r.status == 503
        assert fake.started == 0


async def test_corrupt_thresholds_file_at_boot_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    async with fake_upstream() as fake:
        corrupt = tmp_path / "bad" / "thresholds.json"
        corrupt.write_text('{"calibrationId": 3')
        async with sidecar_in_front_of(fake.url, tmp_path, None, thresholds_file=corrupt) as gate:
            assert not gate.sidecar.gate.ready
            async with gate.session.get(gate.url + "/readyz") as r:
                assert r.status == 503


async def test_bad_input_is_a_deliberate_4xx(tmp_path: Path) -> None:
    async with (
        fake_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile()), max_body_bytes=4096) as gate,
    ):
        cases = [
            (b"{not json", 400),
            (b"[]", 400),
            (json.dumps({"messages": []}).encode(), 400),
            (
                json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}).encode(),
                400,
            ),
            (
                json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}).encode(),
                400,
            ),
            (json.dumps({"messages": [{"role": "user", "content": "x" * 10000}]}).encode(), 413),
            (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), 400),
        ]
        for body, status in cases:
            async with gate.session.post(
                gate.url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == status, body[:60]
                assert "error" in await r.json()
        async with gate.session.post(gate.url + "/completion", json={"prompt": ["a", "b"]}) as r:
            assert r.status == 400  # a batch would take two slots for one ticket
            assert (await r.json())["error"]["code"] == "slogate_one_generation_per_request"
        assert fake.started == 0
        assert await gate.wait_idle()


def upstream_errors(sidecar: Sidecar, kind: str) -> float | None:
    """``slogate_upstream_errors_total{kind=...}`` as the sidecar would export it."""
    return sidecar.metrics.registry.get_sample_value("slogate_upstream_errors_total", {"kind": kind})


@pytest.mark.parametrize("path", ["/health", "/v1/models"])
async def test_a_passthrough_to_a_refused_upstream_marks_it_down_and_is_counted(tmp_path: Path, path: str) -> None:
    """A request forwarded undecided meets a dead llama-server as a generation would: 503,
    the upstream marked down at once (readiness follows) and the failure counted."""
    async with contextlib.AsyncExitStack() as upstream:
        fake = await upstream.enter_async_context(fake_upstream())
        # One poll, at start: from then on only the failed connection can tell the sidecar.
        async with sidecar_in_front_of(fake.url, tmp_path, thresholds_for(smollm2_profile()),
                                       poll_interval_s=3600) as gate:  # fmt: skip
            assert gate.sidecar.upstream_up
            await upstream.aclose()  # llama-server is gone: its port refuses connections
            async with gate.session.get(gate.url + path) as r:
                assert r.status == 503
                assert r.headers["Retry-After"] == "1"
                assert (await r.json())["error"]["code"] == "slogate_unavailable"
            assert not gate.sidecar.upstream_up
            async with gate.session.get(gate.url + "/readyz") as r:
                assert r.status == 503
            assert upstream_errors(gate.sidecar, "unreachable") == 1


async def test_a_passthrough_to_a_silent_upstream_is_a_504_and_is_counted() -> None:
    with listening_port() as silent:  # connections are accepted (the backlog), nothing is answered
        settings = SidecarSettings(
            upstream=f"http://127.0.0.1:{silent}", port=0, admin_port=0, upstream_read_timeout_s=0.3
        )
        sidecar = build_sidecar(settings)
        async with (
            running(sidecar) as (port, _),
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/v1/models") as r,
        ):
            assert r.status == 504
            assert (await r.json())["error"]["code"] == "upstream_timeout"
        assert upstream_errors(sidecar, "timeout") == 1
        assert upstream_errors(sidecar, "unreachable") == 0


async def test_a_passthrough_the_upstream_cuts_is_a_502_and_is_counted() -> None:
    """A connection the upstream closes without an answer is a failed exchange (502), as for a generation."""

    async def hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    async with server:
        upstream = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        sidecar = build_sidecar(SidecarSettings(upstream=upstream, port=0, admin_port=0))
        async with (
            running(sidecar) as (port, _),
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/v1/models") as r,
        ):
            assert r.status == 502
            assert (await r.json())["error"]["code"] == "upstream_error"
        assert upstream_errors(sidecar, "aborted") == 1
