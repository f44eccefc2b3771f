"""The sidecar under injected upstream faults, bad input and missing thresholds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from sidecar_harness import sidecar_in_front_of, thresholds_for

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
