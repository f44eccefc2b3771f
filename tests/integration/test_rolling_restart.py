"""Rolling restarts lose nothing (issue 15, point 5), with real processes only.

Two real llama-servers (one thread, two slots each), each behind its own `slogate sidecar`
process, Debian's nginx in front (random, two tries, retry on 429 and 503:
``slogate_bench.live.balancer``), and a steady load of short streamed chat completions through
nginx. During the load, one pod's sidecar is stopped as Kubernetes stops a container
(SIGTERM: it drains, then exits; started again on the same ports), then that pod's
llama-server is restarted the Kubernetes way (its preStop hook, the sidecar's GET
/slogate/v1/drain, answers once the admitted streams have ended; then SIGTERM; a new one on
the same port). An admitted stream of its own runs on that pod across each stop. No client
may see a 5xx, a reset or a stream without its end, requests must be served in every
stretch of the run, and the drained pod must have refused (429) while draining.

Second: a sidecar SIGKILLed while it relays a long generation leaves nothing running in
llama-server (``requests_processing`` back to 0), and the tokens llama-server decoded for
that request stay far below what it asked for.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from canned_profiles import smollm2_profile
from sidecar_harness import thresholds_for
from sidecar_process import SidecarProcess
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_bench.live.balancer import TRIED_HEADER, Balancing, spawned_balancer, tries_of
from slogate_calibration.runtime import LlamaRuntime, LlamaServer
from slogate_llama.counters import LlamaCounters

pytestmark = pytest.mark.usefixtures("nginx_binary")

INTERVAL_S = 0.8
"""One request every 0.8 s through nginx: well under what one pod serves alone, so the pod
left serving while the other restarts admits what is retried to it. (nginx's pod list is
fixed: while a sidecar is down, a request the other pod refused is retried on the dead one
and nginx answers 502. In Kubernetes the pod, not ready, has left the Service's endpoints.)"""
SHORT = 32
"""Output tokens of a load request."""
LONG = 600
"""Output tokens of the stream held across each stop: seconds of decoding at one thread
(about 130 tokens/s here), so that the load meets the pod while it drains."""
HANG_GUARD_S = 120.0
"""Not a performance bound: something still awaited after this long is hung."""
SLOTS, CTX = 4, 4096


def pod_profile(slots: int, ctx: int) -> CalibrationProfile:
    """The canned SmolLM2 profile, reshaped to a one-thread server of ``slots`` slots (thresholds
    generous enough that the load is admitted: the test is about stopping, not shedding)."""
    return smollm2_profile(
        server={"slots": slots, "ctxPerSlot": ctx // slots, "threads": 1},
        kv={"bytesPerToken": 23040, "capacityTokens": ctx, "perRequestMaxTokens": ctx // slots},
        decode=[{"streams": n, "tokensPerSecond": 50 - 8 * (n - 1)} for n in range(1, slots + 1)],
    )


def llama(runtime: LlamaRuntime, tmp_path: Path, name: str, port: int | None = None, **shape: int) -> LlamaServer:
    server = LlamaServer(runtime, port=port, threads=1, parallel=shape.get("parallel", SLOTS),
                         ctx=shape.get("ctx", CTX), log_path=tmp_path / f"llama-{name}.log")  # fmt: skip
    return server.start(timeout=180.0)


@pytest.fixture
def two_llama_servers(llama_runtime: LlamaRuntime, tmp_path: Path) -> Iterator[list[LlamaServer]]:
    servers: list[LlamaServer] = []
    try:
        for name in ("a", "b"):
            servers.append(llama(llama_runtime, tmp_path, name))
        yield servers
    finally:
        for server in servers:
            server.stop()


@dataclass
class Outcome:
    """What one client of the load saw."""

    sent_at: float
    status: int = 0
    complete: bool = False
    """A 200 whose stream ended with ``data: [DONE]``."""
    failure: str | None = None
    """An exception: a reset, a cut stream."""
    tries: int = 0
    code: str | None = None
    reasons: tuple[str, ...] = ()
    """A gate's refusal: the predicates that failed."""


async def chat(session: aiohttp.ClientSession, url: str, max_tokens: int, outcome: Outcome,
               first_chunk: asyncio.Event | None = None) -> Outcome:  # fmt: skip
    """One streamed chat completion; records how it ended."""
    body = {"messages": [{"role": "user", "content": f"Count from {int(outcome.sent_at * 10) % 97} upwards."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "cache_prompt": False}  # fmt: skip
    try:
        async with asyncio.timeout(HANG_GUARD_S), session.post(url + "/v1/chat/completions", json=body) as response:
            outcome.status = response.status
            outcome.tries = tries_of(response.headers.get(TRIED_HEADER))
            if response.status != 200:
                text = await response.read()
                try:
                    refusal = json.loads(text)
                except ValueError:  # not the sidecar's: nginx's own error page
                    outcome.code = text.decode(errors="replace")[:200]
                    return outcome
                outcome.code = refusal.get("error", {}).get("code")
                outcome.reasons = tuple((refusal.get("slogate") or {}).get("reasons") or ())
                return outcome
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                if first_chunk is not None:
                    first_chunk.set()
                if line.strip() == b"data: [DONE]":
                    outcome.complete = True
                elif "error" in json.loads(line[6:]):
                    outcome.failure = "error event"
    except (aiohttp.ClientError, TimeoutError) as failure:
        outcome.failure = repr(failure)
    return outcome


@dataclass
class Load:
    """Streamed chat completions through nginx at a steady rate, until stopped (each of exactly
    ``SHORT`` tokens: ``ignore_eos``)."""

    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    _tasks: list[asyncio.Task[Outcome]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, session: aiohttp.ClientSession) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            outcome = Outcome(sent_at=time.monotonic())
            self.outcomes.append(outcome)
            self._tasks.append(asyncio.create_task(chat(session, self.url, SHORT, outcome)))
            next_at += INTERVAL_S
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.monotonic()))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def served_between(self, start: float, end: float) -> int:
        return sum(1 for o in self.outcomes if start <= o.sent_at < end and o.status == 200 and o.complete)


async def counters(session: aiohttp.ClientSession, server: LlamaServer) -> LlamaCounters:
    async with session.get(server.url + "/metrics") as response:
        return LlamaCounters.from_text(await response.text())


async def until(condition: Callable[[], Any], what: str) -> Any:
    """Poll an async condition (bounded); its truthy value, or fail saying what never happened."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        value = await condition()
        if value:
            return value
        await asyncio.sleep(0.05)
    pytest.fail(f"never happened: {what}")


@asynccontextmanager
async def sidecars(
    servers: list[LlamaServer], tmp_path: Path, thresholds: Thresholds
) -> AsyncIterator[list[SidecarProcess]]:
    made = [SidecarProcess(s.url, tmp_path, thresholds, ("--poll-interval", "0.2")) for s in servers]
    try:
        for sidecar in made:
            await sidecar.start()
        yield made
    finally:
        for sidecar in made:
            await sidecar.stop()


async def held_stream(session: aiohttp.ClientSession, sidecar: SidecarProcess) -> asyncio.Task[Outcome]:
    """A long stream admitted by this pod's sidecar, once its first chunk has arrived."""
    started = asyncio.Event()
    task = asyncio.create_task(chat(session, sidecar.url, LONG, Outcome(time.monotonic()), started))
    await asyncio.wait_for(started.wait(), HANG_GUARD_S)
    return task


async def refused_while_draining(session: aiohttp.ClientSession, sidecar: SidecarProcess) -> str | None:
    """A request sent straight to a draining sidecar: its error code (``slogate_draining`` expected)."""
    outcome = await chat(session, sidecar.url, SHORT, Outcome(time.monotonic()))
    assert outcome.status == 429, outcome
    return outcome.code


async def test_restarting_a_pods_sidecar_then_its_llama_server_loses_nothing(
    two_llama_servers: list[LlamaServer], llama_runtime: LlamaRuntime, tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:  # fmt: skip
    # A 10 s SLO and the load's own n_out as the reference: room to queue what the other pod sheds.
    thresholds = thresholds_for(pod_profile(SLOTS, CTX), slo={"ttftSeconds": 10.0}, outputTokens={"default": SHORT})
    llama_b = two_llama_servers[1]
    async with (
        sidecars(two_llama_servers, tmp_path, thresholds) as (a, b),
        spawned_balancer(tmp_path, [a.hostport, b.hostport], Balancing("random", tries=2)) as nginx,
        aiohttp.ClientSession() as session,
    ):
        load = Load(nginx.url)
        generating = asyncio.create_task(load.run(session))
        marks = {"start": time.monotonic()}
        await asyncio.sleep(3.0)  # both pods serving

        # 1. The sidecar's container is stopped (SIGTERM) with a stream of its own under way.
        long_1 = await held_stream(session, b)
        marks["sigterm"] = time.monotonic()
        b.send(signal.SIGTERM)
        drain = await until(lambda: _final_drain(session, b), "the sidecar drains on SIGTERM")
        probe_1 = await refused_while_draining(session, b)
        last_seen = drain
        while b.returncode is None:  # its books as long as it answers: it exits once drained
            try:
                last_seen = (await b.state(session))["drain"]
            except aiohttp.ClientError:
                break
            await asyncio.sleep(0.1)
        exit_code = await asyncio.wait_for(b.exited(), HANG_GUARD_S)
        first_long = await long_1
        marks["sidecar back"] = time.monotonic()
        await b.start()  # the kubelet starts the container again: same ports
        marks["sidecar ready"] = time.monotonic()
        await asyncio.sleep(2.0)

        # 2. llama-server's container is restarted: its preStop hook first, then SIGTERM.
        long_2 = await held_stream(session, b)
        marks["hook"] = time.monotonic()
        async with session.get(b.admin_url + "/slogate/v1/drain") as hook:  # as the kubelet calls it
            hooked = await hook.json()
        second_long = await long_2
        await asyncio.to_thread(llama_b.stop)
        probe_2 = await refused_while_draining(session, b)  # llama-server down: still a 429, not a 503
        new_b = await asyncio.to_thread(llama, llama_runtime, tmp_path, "b2", llama_b.port)
        two_llama_servers[1] = new_b  # the fixture stops this one
        resumed = await until(lambda: _resumed(session, b), "the sidecar admits again once llama-server is back")
        marks["resumed"] = time.monotonic()
        await asyncio.sleep(3.0)
        await load.stop()
        await generating
        marks["end"] = time.monotonic()
        idle = [(await counters(session, s)).requests_processing for s in (two_llama_servers[0], new_b)]

    outcomes = load.outcomes
    by_status: dict[str, int] = {}
    for o in outcomes:
        key = f"{o.status} {o.code} {','.join(o.reasons)}" if o.code else str(o.status)
        by_status[key] = by_status.get(key, 0) + 1
    stretches = {
        "before": load.served_between(marks["start"], marks["sigterm"]),
        "sidecar draining, down, restarting": load.served_between(marks["sigterm"], marks["sidecar ready"]),
        "llama-server draining, down, restarting": load.served_between(marks["hook"], marks["resumed"]),
        "after": load.served_between(marks["resumed"], marks["end"]),
    }
    record_property("statuses", by_status)
    record_property("served by stretch", stretches)
    record_property("retried", sum(1 for o in outcomes if o.tries > 1))
    record_property("refused while draining", {"sidecar stop": last_seen["refused"], "hook": resumed["refused"]})
    print(f"\nrolling restart: {len(outcomes)} requests, statuses {by_status}, served by stretch {stretches}, "
          f"{sum(1 for o in outcomes if o.tries > 1)} retried by nginx; refused while draining: "
          f"{last_seen['refused']} (sidecar stop), {resumed['refused']} (llama-server restart); at "
          f"{ {k: round(v - marks['start'], 1) for k, v in marks.items()} } s")  # fmt: skip

    assert [o for o in outcomes if o.failure is not None] == []  # no reset, no cut stream
    assert [o for o in outcomes if o.status >= 500 or o.status == 0] == [], (marks, b.log_text()[-3000:])
    assert [o for o in outcomes if o.status == 200 and not o.complete] == []
    assert all(count >= 1 for count in stretches.values()), stretches
    # The held streams ran to their end across both stops; the sidecar exited cleanly once drained.
    assert (first_long.status, first_long.complete, second_long.status, second_long.complete) == (200, True, 200, True)
    assert exit_code == 0
    assert "drained:" in b.log_text()
    assert (hooked["drained"], hooked["streams"]) == (True, 0)
    # The drained pod refused while draining: straight probes, and what it counted.
    assert (probe_1, probe_2) == ("slogate_draining", "slogate_draining")
    assert last_seen["refused"] >= 1
    assert resumed["refused"] >= 1
    # Beyond the two probes: load that nginx sent there first was refused, then retried on the other pod.
    assert last_seen["refused"] + resumed["refused"] - 2 >= 1
    assert sum(1 for o in outcomes if o.tries > 1) >= 1
    assert resumed["resumed"] == 1
    assert idle == [0, 0]  # nothing left running in either llama-server


async def _final_drain(session: aiohttp.ClientSession, sidecar: SidecarProcess) -> dict[str, Any] | None:
    drain: dict[str, Any] = (await sidecar.state(session))["drain"]
    return drain if drain["final"] else None


async def _resumed(session: aiohttp.ClientSession, sidecar: SidecarProcess) -> dict[str, Any] | None:
    state = await sidecar.state(session)
    async with session.get(sidecar.url + "/readyz") as ready:
        return state["drain"] if ready.status == 200 and not state["drain"]["draining"] else None


# ------------------------------------------------------------------------------ SIGKILL

N_PREDICT = 4000


async def test_a_sigkilled_sidecar_leaves_no_generation_running(
    llama_runtime: LlamaRuntime, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    server = llama(llama_runtime, tmp_path, "k", parallel=1, ctx=4096)
    thresholds = thresholds_for(pod_profile(1, 4096), slo={"ttftSeconds": 10.0})
    try:
        async with sidecars([server], tmp_path, thresholds) as (gate,), aiohttp.ClientSession() as session:
            before = await counters(session, server)
            body = {"prompt": "Once upon a time", "n_predict": N_PREDICT, "ignore_eos": True, "stream": True}
            streamed = 0
            async with session.post(gate.url + "/completion", json=body) as response:
                assert response.status == 200
                async for line in response.content:
                    streamed += line.startswith(b"data: ")
                    if streamed == 16:
                        break
                running = await counters(session, server)
                gate.send(signal.SIGKILL)
                cut = False
                try:
                    async for _line in response.content:
                        streamed += 1
                except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                    cut = True
            assert await asyncio.wait_for(gate.exited(), HANG_GUARD_S) == -signal.SIGKILL
            after = await until(lambda: _idle(session, server), "llama-server's requests_processing back to 0")
    finally:
        server.stop()
    decoded = after.n_decode_total - before.n_decode_total
    predicted = after.tokens_predicted_total - before.tokens_predicted_total
    record_property("decoded after SIGKILL", {"decode calls": decoded, "tokens predicted": predicted,
                                               "streamed": streamed, "asked": N_PREDICT})  # fmt: skip
    print(f"\nSIGKILL: {streamed} chunks streamed, llama-server decoded {decoded} times "
          f"(tokens_predicted_total +{predicted:g}) of {N_PREDICT} asked, then requests_processing 0")  # fmt: skip
    assert running.requests_processing == 1  # the generation was under way when the sidecar died
    assert cut  # the client's stream ended without its end
    assert after.requests_processing == 0
    assert decoded < N_PREDICT / 10  # llama-server stopped the generation, far from its end
    assert predicted < N_PREDICT / 10


async def _idle(session: aiohttp.ClientSession, server: LlamaServer) -> LlamaCounters | None:
    now = await counters(session, server)
    return now if now.requests_processing == 0 else None
