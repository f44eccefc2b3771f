"""The real llama-server killed (SIGKILL) or frozen (SIGSTOP) under load, behind a real sidecar.

Each test starts its own llama-server (the session's is never touched), puts the gate
in front, loads it with streaming and non-streaming generations, injects the fault
while tokens are flowing, and checks what every client saw, what the gate still holds,
and that everything recovers by itself once llama-server is back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from sidecar_harness import RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_admission.schema import CalibrationProfile
from slogate_calibration.runtime import LlamaRuntime, LlamaServer
from slogate_llama.counters import LlamaCounters

HANG_GUARD_S = 90.0
"""Not a performance bound: a client still waiting after this long is hung."""
LONG = 400
"""Output tokens per request: several seconds of decoding, so the fault lands mid-stream."""


@pytest.fixture
def own_server(llama_runtime: LlamaRuntime, tmp_path: Path) -> Iterator[LlamaServer]:
    """A llama-server for this test alone (same configuration as the session's)."""
    server = LlamaServer(llama_runtime, threads=2, parallel=4, ctx=8192, log_path=tmp_path / "llama-server.log")
    server.start(timeout=180.0)
    try:
        yield server
    finally:
        if server.pid is not None:
            os.killpg(server.pid, signal.SIGCONT)  # never leave a stopped process behind
        server.stop()


@dataclass
class Outcome:
    """What one client saw."""

    status: int
    streamed_tokens: int = 0
    ended_with_error_event: bool = False
    ended_with_done: bool = False
    error_code: str | None = None


async def generate(session: aiohttp.ClientSession, url: str, first: int, *, stream: bool,
                   on_token: Callable[[], None] = lambda: None, text: bool = False) -> Outcome:  # fmt: skip
    """One native completion of a distinct 64-token prompt (or a text one, which the gate
    counts with llama-server's /tokenize first); record how it ended."""
    prompt: object = f"Request {first}: count slowly." if text else list(range(first, first + 64))
    body = {"prompt": prompt, "n_predict": LONG, "ignore_eos": True, "stream": stream, "cache_prompt": False}
    async with asyncio.timeout(HANG_GUARD_S), session.post(url + "/completion", json=body) as response:
        if response.status != 200 or not stream:
            payload = await response.read()
            code = json.loads(payload).get("error", {}).get("code") if response.status != 200 else None
            return Outcome(response.status, error_code=code)
        outcome = Outcome(200)
        async for line in response.content:
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                outcome.ended_with_error_event = True
            elif chunk.get("content"):
                outcome.streamed_tokens += 1
                on_token()
            if chunk.get("stop") is True:
                outcome.ended_with_done = True
        return outcome


async def until(condition: Callable[[], bool], limit_s: float = 60.0) -> bool:
    """Wait (bounded) for an asynchronous consequence; the caller asserts it."""
    for _ in range(int(limit_s / 0.05)):
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


async def metric(gate: RunningSidecar, series: str) -> float:
    """One exported series' value, e.g. ``slogate_upstream_errors_total{kind="timeout"}``."""
    async with gate.session.get(gate.admin_url + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not exported")


async def upstream_idle(server: LlamaServer) -> bool:
    """llama-server itself has nothing processing or deferred (bounded wait)."""
    async with aiohttp.ClientSession() as session:
        for _ in range(240):
            async with session.get(server.url + "/metrics") as response:
                counters = LlamaCounters.from_text(await response.text())
            if counters.requests_processing == 0 and counters.requests_deferred == 0:
                return True
            await asyncio.sleep(0.25)
    return False


async def load(gate: RunningSidecar, n_stream: int, n_plain: int) -> tuple[list[asyncio.Task[Outcome]], asyncio.Event]:
    """Start the generations; the event is set once some stream is mid-generation."""
    flowing = asyncio.Event()
    tasks = [
        asyncio.create_task(generate(gate.session, gate.url, 1000 + 100 * i, stream=i < n_stream, on_token=flowing.set))
        for i in range(n_stream + n_plain)
    ]
    return tasks, flowing


async def test_sigkill_mid_stream_clean_errors_release_503_and_recovery(
    own_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:  # fmt: skip
    thresholds = thresholds_for(calibrated_profile, deferral={"maxWaitSeconds": 0})
    async with sidecar_in_front_of(own_server.url, tmp_path, thresholds) as gate:
        tasks, flowing = await load(gate, n_stream=3, n_plain=3)
        async with asyncio.timeout(HANG_GUARD_S):
            await flowing.wait()
        await asyncio.sleep(0.3)  # a few more tokens: well inside the streams
        assert own_server.pid is not None
        inside = gate.sidecar.gate.ledger.streams
        os.killpg(own_server.pid, signal.SIGKILL)
        outcomes = await asyncio.gather(*tasks)

        streamed = [o for o in outcomes if o.status == 200]
        plain_failed = [o for o in outcomes if o.status in (502, 503)]
        assert inside >= 2, outcomes
        assert any(o.streamed_tokens for o in streamed), outcomes
        # Every stream cut mid-generation ends with an error event a client can parse, not silence.
        assert all(o.ended_with_error_event and not o.ended_with_done for o in streamed), outcomes
        # Every non-streamed generation in flight got a clean 5xx naming the cause.
        assert all(o.error_code in ("upstream_error", "slogate_unavailable") for o in plain_failed), outcomes
        assert len(streamed) + len(plain_failed) + sum(o.status == 429 for o in outcomes) == len(outcomes), outcomes
        # Promptly: the dead connection was noticed as such, never by waiting out a read timeout.
        assert await metric(gate, 'slogate_upstream_errors_total{kind="timeout"}') == 0
        assert await metric(gate, 'slogate_upstream_errors_total{kind="aborted"}') >= len(plain_failed) + 1
        assert await gate.wait_idle(), gate.sidecar.gate.ledger  # every reservation released

        # Down: readiness goes false, new arrivals get 503 at once.
        assert await until(lambda: not gate.sidecar.upstream_up)
        async with gate.session.get(gate.url + "/readyz") as r:
            assert r.status == 503
        refused = [await generate(gate.session, gate.url, 9000 + i, stream=i % 2 == 0) for i in range(4)]
        assert [(o.status, o.error_code) for o in refused] == [(503, "slogate_unavailable")] * 4

        # llama-server comes back (same port): the sidecar recovers by itself.
        own_server.stop()
        own_server.start(timeout=180.0)
        assert await until(lambda: gate.sidecar.upstream_up)
        async with gate.session.get(gate.url + "/readyz") as r:
            assert r.status == 200
        after = await generate(gate.session, gate.url, 20000, stream=True)
        assert (after.status, after.ended_with_done, after.ended_with_error_event) == (200, True, False)
        assert await gate.wait_idle()
        record_property("requests", len(outcomes) + len(refused) + 1)
        record_property("faults", "1 SIGKILL with 6 generations in flight")
        record_property("in_flight_at_kill", inside)
        record_property("clean_stream_errors", len(streamed))
        record_property("counters_after", json.dumps((await gate.state())["live"]))


async def test_sigstop_gives_504_no_leak_and_recovery_on_sigcont(
    own_server: LlamaServer, calibrated_profile: CalibrationProfile, tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:  # fmt: skip
    thresholds = thresholds_for(calibrated_profile, deferral={"maxWaitSeconds": 0})
    async with sidecar_in_front_of(own_server.url, tmp_path, thresholds, upstream_read_timeout_s=2.0) as gate:
        tasks, flowing = await load(gate, n_stream=2, n_plain=2)
        async with asyncio.timeout(HANG_GUARD_S):
            await flowing.wait()
        assert own_server.pid is not None
        os.killpg(own_server.pid, signal.SIGSTOP)
        try:
            outcomes = await asyncio.gather(*tasks)
            # Arrivals while it is frozen: 504 (it accepts connections, answers nothing) until
            # the poller has seen enough silent polls, then 503 without trying. Text prompts
            # too: the gate's own /tokenize call must time out like any other.
            during = [await generate(gate.session, gate.url, 30000 + 100 * i, stream=False, text=i % 2 == 0)
                      for i in range(4)]  # fmt: skip
            assert await until(lambda: not gate.sidecar.upstream_up)
            async with gate.session.get(gate.url + "/readyz") as r:
                assert r.status == 503
            assert await gate.wait_idle(), gate.sidecar.gate.ledger
        finally:
            os.killpg(own_server.pid, signal.SIGCONT)

        # What had not started relaying (a non-streamed answer, a stream still queued) is a 504;
        # a stream frozen mid-generation ends with an error event; nothing else.
        timed_out = [o for o in outcomes if o.status == 504]
        cut = [o for o in outcomes if o.status == 200]
        assert all(o.error_code == "upstream_timeout" for o in timed_out), outcomes
        assert all(o.ended_with_error_event and not o.ended_with_done for o in cut), outcomes
        assert any(o.streamed_tokens for o in cut), outcomes
        assert len(timed_out) + len(cut) + sum(o.status == 429 for o in outcomes) == len(outcomes), outcomes
        assert all((o.status, o.error_code) in ((504, "upstream_timeout"), (503, "slogate_unavailable"))
                   for o in during), during  # fmt: skip
        assert len(timed_out) + sum(o.status == 504 for o in during) >= 1, (outcomes, during)
        timeouts = sum(o.status == 504 for o in during) + len(timed_out) + len(cut)
        assert await metric(gate, 'slogate_upstream_errors_total{kind="timeout"}') == timeouts

        # Resumed: the sidecar sees it healthy again and serves; llama-server itself drops
        # the abandoned generations (their connections were closed).
        assert await until(lambda: gate.sidecar.upstream_up)
        after = await generate(gate.session, gate.url, 40000, stream=True)
        assert (after.status, after.ended_with_done) == (200, True)
        assert await upstream_idle(own_server)
        assert await gate.wait_idle()
        record_property("requests", len(outcomes) + len(during) + 1)
        record_property("faults", "1 SIGSTOP (then SIGCONT) with 4 generations in flight, 4 arrivals while frozen")
        record_property("outcomes", json.dumps({"504": len(timed_out) + sum(o.status == 504 for o in during),
                                                "cut_streams": len(cut), "503_while_down": sum(o.status == 503 for o in during)}))  # fmt: skip
        record_property("counters_after", json.dumps((await gate.state())["live"]))
