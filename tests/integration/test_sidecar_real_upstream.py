"""The sidecar in front of the real llama-server: proxying, gating, accounting, admin."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar_harness import TOKEN, RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_admission.schema import CalibrationProfile
from slogate_calibration.runtime import LlamaServer
from slogate_llama.counters import LlamaCounters

CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture
async def gate(llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with sidecar_in_front_of(llama_server.url, tmp_path, thresholds_for(calibrated_profile)) as running:
        yield running


async def upstream_processing(server: LlamaServer) -> float:
    async with aiohttp.ClientSession() as s, s.get(server.url + "/metrics") as r:
        return LlamaCounters.from_text(await r.text()).requests_processing


async def test_non_streaming_chat_is_reassembled(gate: RunningSidecar) -> None:
    async with gate.session.post(gate.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 8}) as r:
        assert r.status == 200
        body = await r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert body["usage"]["completion_tokens"] <= 8
    assert await gate.wait_idle()


async def test_streaming_chat_is_relayed_chunk_by_chunk(gate: RunningSidecar) -> None:
    events: list[str] = []
    async with gate.session.post(
        gate.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 12, "stream": True}
    ) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        async for line in r.content:
            if line.startswith(b"data: "):
                events.append(line[6:].decode().strip())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len(chunks) >= 3  # role, content..., finish: relayed as separate events
    assert await gate.wait_idle()


@pytest.mark.parametrize("stream", [False, True])
async def test_native_completion(gate: RunningSidecar, stream: bool) -> None:
    async with gate.session.post(
        gate.url + "/completion", json={"prompt": "The sky is", "n_predict": 6, "stream": stream}
    ) as r:
        assert r.status == 200
        text = await r.text()
    if stream:
        assert '"stop":true' in text.replace(" ", "")
    else:
        body = json.loads(text)
        assert body["stop"] is True
        assert body["tokens_predicted"] <= 6
    assert await gate.wait_idle()


async def test_models_and_health_pass_through_and_admin_endpoints_do_not(
    gate: RunningSidecar,
) -> None:
    async with gate.session.get(gate.url + "/v1/models") as r:
        assert r.status == 200
        assert "data" in await r.json()
    async with gate.session.get(gate.url + "/slots") as r:
        assert r.status == 404
    async with gate.session.post(gate.url + "/props", json={}) as r:
        assert r.status in (404, 405)
    async with gate.session.get(gate.url + "/readyz") as r:
        assert r.status == 200


async def test_overload_burst_admitted_meet_slo_rejections_are_instant(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    slo = 3.0
    thresholds = thresholds_for(calibrated_profile, slo={"ttftSeconds": slo}, deferral={"maxWaitSeconds": 0})
    rng = random.Random(3)
    async with sidecar_in_front_of(llama_server.url, tmp_path, thresholds) as gate:

        async def one() -> dict[str, Any]:
            start = rng.randrange(1000, 30000)
            body = {"prompt": list(range(start, start + 300)), "n_predict": 24, "stream": True}
            sent = time.monotonic()
            async with gate.session.post(gate.url + "/completion", json=body) as r:
                if r.status != 200:
                    return {"status": r.status, "retry_after": r.headers.get("Retry-After"),
                            "body": await r.json(), "latency": time.monotonic() - sent}  # fmt: skip
                first = None
                async for line in r.content:
                    if first is None and line.startswith(b"data: ") and json.loads(line[6:]).get("content"):
                        first = time.monotonic() - sent
                return {"status": 200, "ttft": first}

        results = await asyncio.gather(*(one() for _ in range(24)))
        admitted = [r for r in results if r["status"] == 200]
        rejected = [r for r in results if r["status"] == 429]
        assert len(admitted) + len(rejected) == 24, [(r["status"], r.get("body")) for r in results][:3]
        assert admitted  # the gate serves what fits ...
        assert rejected  # ... and refuses the overload (24 x 300 tokens is far over a 3 s budget)
        # Whether admitted requests met the SLO in seconds is a benchmark number (docs/benchmarks.md):
        # on a shared machine a test may only assert counts and orderings.
        print(f"admitted {len(admitted)}, rejected {len(rejected)}, "
              f"TTFTs {sorted(round(r['ttft'], 2) for r in admitted)} (SLO {slo} s)")  # fmt: skip
        assert all(r["ttft"] is not None for r in admitted)
        for r in rejected:
            assert 1 <= int(r["retry_after"]) <= 60
            assert r["body"]["error"]["code"] == "slogate_rejected"
            assert "ttft" in r["body"]["slogate"]["reasons"] or "concurrency" in r["body"]["slogate"]["reasons"]
        # Rejections never touch the upstream: every one is answered before any admitted first token.
        assert max(r["latency"] for r in rejected) < min(r["ttft"] for r in admitted)
        assert await gate.wait_idle()


async def test_kv_gate(llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path) -> None:
    thresholds = thresholds_for(calibrated_profile, deferral={"maxWaitSeconds": 0})
    async with sidecar_in_front_of(llama_server.url, tmp_path, thresholds) as gate:
        # Beyond one slot's context: no wait would help -> 400, with the numbers.
        async with gate.session.post(gate.url + "/completion", json={"prompt": "hi", "n_predict": 4000}) as r:
            assert r.status == 400
            body = await r.json()
        assert body["error"]["code"] == "slogate_request_too_large"
        assert body["slogate"]["reasons"] == ["kv"]
        assert body["slogate"]["neverFits"] == ["kv"]
        # Shrink the KV budget at runtime, hold 2,000 tokens, then ask for 1,500 more.
        small = thresholds.model_copy(update={"kv_capacity_tokens": 3000})
        assert (await gate.push(small.model_dump_json(by_alias=True))).status == 200
        hold = asyncio.create_task(
            gate.session.post(
                gate.url + "/completion",
                json={"prompt": "Count:", "n_predict": 1990, "ignore_eos": True},
            )
        )
        for _ in range(100):
            if gate.sidecar.gate.ledger.reserved_kv_tokens:
                break
            await asyncio.sleep(0.02)
        async with gate.session.post(gate.url + "/completion", json={"prompt": "Hello", "n_predict": 1500}) as r:
            assert r.status == 429
            assert (await r.json())["slogate"]["reasons"] == ["kv"]
        hold.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hold
        assert await gate.wait_idle()


async def test_disconnect_storm_leaks_nothing_and_aborts_upstream(
    gate: RunningSidecar, llama_server: LlamaServer
) -> None:
    rng = random.Random(9)

    async def abandon() -> None:
        body = {"messages": CHAT, "max_tokens": 200, "stream": rng.random() < 0.5}
        try:
            async with asyncio.timeout(rng.uniform(0.01, 1.5)):
                async with gate.session.post(gate.url + "/v1/chat/completions", json=body) as r:
                    await r.read()
        except TimeoutError:
            pass  # the client gave up mid-request: that is the point

    await asyncio.gather(*(abandon() for _ in range(40)))
    assert await gate.wait_idle()
    ledger = gate.sidecar.gate.ledger
    assert (
        ledger.queued_prefill_tokens,
        ledger.streams,
        ledger.reserved_kv_tokens,
        gate.sidecar.gate.deferred,
    ) == (0, 0, 0, 0)
    for _ in range(100):  # llama-server notices closed connections within a decode step or two
        if await upstream_processing(llama_server) == 0:
            break
        await asyncio.sleep(0.1)
    assert await upstream_processing(llama_server) == 0


async def test_admin_api(gate: RunningSidecar, calibrated_profile: CalibrationProfile) -> None:
    before = (await gate.state())["calibrationId"]
    new = thresholds_for(calibrated_profile).model_copy(update={"calibration_id": "pushed-1"})
    wire = new.model_dump_json(by_alias=True)
    assert (await gate.push(wire, token=None)).status == 401
    assert (await gate.push(wire, token="wrong")).status == 401
    assert (await gate.push(wire, token=TOKEN + "x")).status == 401  # other length
    bad = json.loads(wire)
    bad["classes"][0]["tokenBudget"] = -1
    assert (await gate.push(json.dumps(bad))).status == 422
    assert (await gate.push("{not json")).status == 422
    assert (await gate.state())["calibrationId"] == before  # nothing changed
    assert (await gate.push(wire)).status == 200
    state = await gate.state()
    assert state["calibrationId"] == "pushed-1"
    assert state["live"] == {
        "queuedPrefillTokens": 0,
        "streams": 0,
        "reservedKvTokens": 0,
        "deferred": 0,
    }
    async with gate.session.get(gate.admin_url + "/metrics") as r:
        text = await r.text()
    assert 'slogate_thresholds_info{calibration_id="pushed-1"' in text


async def test_degradation_clamps_max_tokens_and_says_so(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    thresholds = thresholds_for(calibrated_profile, degradation={"clampMaxTokens": True})
    async with sidecar_in_front_of(llama_server.url, tmp_path, thresholds) as gate:
        body = {"prompt": "Once upon a time", "n_predict": 5000}  # beyond one slot's 2,048 cells
        async with gate.session.post(gate.url + "/completion", json=body) as r:
            assert r.status == 200
            clamp = int(r.headers["X-Slogate-Degraded"].split("=")[1])
            answer = await r.json()
        assert clamp < 2048
        assert answer["tokens_predicted"] <= clamp
        assert await gate.wait_idle()


async def test_class_from_header_or_api_key(
    llama_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path
) -> None:
    thresholds = thresholds_for(
        calibrated_profile, classes=[{"name": "interactive", "reservedSlots": 1}, {"name": "batch"}]
    )
    async with sidecar_in_front_of(
        llama_server.url, tmp_path, thresholds, api_key_classes={"key-a": "interactive"}
    ) as gate:
        body = {"prompt": "Hi", "n_predict": 2}
        cases = [
            ({"X-Slogate-Class": "interactive"}, "interactive"),
            ({"Authorization": "Bearer key-a"}, "interactive"),
            ({"Authorization": "Bearer unknown"}, "batch"),
            ({"X-Slogate-Class": "no-such-class"}, "batch"),  # unknown: the default, never an error
            ({}, "batch"),
        ]
        for headers, expected in cases:
            async with gate.session.post(gate.url + "/completion", json=body, headers=headers) as r:
                assert r.status == 200
                assert r.headers["X-Slogate-Class"] == expected
        assert await gate.wait_idle()
