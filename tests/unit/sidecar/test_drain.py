"""The drain (docs/sidecar.md, "Draining") in front of the fault-injecting fake upstream.

In-process: /readyz turns 503 at once; every new request gets 429 ``slogate_draining`` with
a Retry-After and nothing reaches the upstream (not even /tokenize); deferred requests are
refused the moment the drain begins; admitted streams run to their end; the hook (GET
/slogate/v1/drain) answers only once the last one ended; a hook drain ends when the upstream
has been down and is healthy again, or, the upstream never stopping, after twice the
deadline; a SIGTERM drain never resumes. As a process (`slogate sidecar`, the fake still the
upstream): SIGTERM drains, then the process exits once the last stream ended; at the
deadline it cuts what still runs, and the upstream sees its connection closed.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from canned_profiles import smollm2_profile
from fake_upstream import FakeUpstream, llama_app, serve
from sidecar_harness import DRAIN_HEADERS, RunningSidecar, sidecar_in_front_of, thresholds_for
from sidecar_process import SidecarProcess
from slogate_admission import drain_token
from slogate_admission.schema import Thresholds
from slogate_sidecar.drain import DrainCause

STREAM = {"prompt": [1, 2, 3], "n_predict": 4, "stream": True}
TEXT = {"messages": [{"role": "user", "content": "count to three"}], "max_tokens": 4}
HANG_GUARD_S = 30.0
"""Not a performance bound: something still waited for after this long is hung."""


@dataclass
class CountingUpstream(FakeUpstream):
    """The fake llama-server, counting the token-counting calls too (a generation is ``started``)."""

    counted: int = 0

    async def tokenize(self, request: web.Request) -> web.Response:
        self.counted += 1
        return await super().tokenize(request)

    async def apply_template(self, request: web.Request) -> web.Response:
        self.counted += 1
        return await super().apply_template(request)


@asynccontextmanager
async def gated(
    tmp_path: Path, thresholds: Thresholds | None = None, **settings: Any
) -> AsyncIterator[tuple[CountingUpstream, RunningSidecar]]:
    """The fake (holding each generation after its first token) behind an in-process sidecar."""
    fake = CountingUpstream(mode="stall")
    try:
        async with (
            serve(llama_app(fake)) as fake.url,
            sidecar_in_front_of(
                fake.url, tmp_path, thresholds or thresholds_for(smollm2_profile()), **settings
            ) as gate,
        ):
            yield fake, gate
    finally:
        fake.stall_forever.set()


async def until(condition: Callable[[], bool]) -> bool:
    """Wait (bounded) for an asynchronous consequence; the caller asserts it."""
    for _ in range(int(HANG_GUARD_S / 0.02)):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


@dataclass
class Streamed:
    """What a streaming client received."""

    status: int
    chunks: list[dict[str, Any]]
    complete: bool
    """The final chunk (``stop: true``) arrived and the body ended cleanly."""


async def stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any] | None = None) -> Streamed:
    chunks: list[dict[str, Any]] = []
    try:
        async with session.post(url + "/completion", json=body or STREAM) as response:
            if response.status != 200:
                return Streamed(response.status, [await response.json()], complete=False)
            async for line in response.content:
                if line.startswith(b"data: "):
                    chunks.append(json.loads(line[6:]))
            return Streamed(200, chunks, complete=bool(chunks) and chunks[-1].get("stop") is True)
    except aiohttp.ClientPayloadError:  # the stream was cut
        return Streamed(200, chunks, complete=False)


async def held_stream(gate: RunningSidecar, fake: FakeUpstream) -> asyncio.Task[Streamed]:
    """A streamed generation admitted and held by the fake after its first token."""
    started = fake.started
    task = asyncio.create_task(stream(gate.session, gate.url))
    assert await until(lambda: fake.started > started)
    assert gate.sidecar.gate.ledger.streams >= 1
    return task


async def refused(session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
    async with session.post(url + path, json=body) as response:
        await response.read()
        return response


def draining_refusal(response: aiohttp.ClientResponse, body: dict[str, Any]) -> None:
    """429 ``slogate_draining``: safe to send to another replica; the connection is not kept."""
    assert response.status == 429
    assert response.headers["Retry-After"] == "1"
    assert response.headers["Connection"] == "close"
    assert body["error"]["code"] == "slogate_draining"
    assert body["slogate"]["outcome"] == "draining"


async def test_a_drain_turns_readyz_503_and_refuses_new_requests_before_the_upstream(tmp_path: Path) -> None:
    async with gated(tmp_path) as (fake, gate):
        async with gate.session.get(
            gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS
        ) as r:  # nothing runs: answered at once
            assert r.status == 200
            assert (await r.json())["drained"] is True
        async with gate.session.get(gate.url + "/readyz") as r:
            assert r.status == 503
        for path, body in (("/completion", STREAM), ("/v1/chat/completions", TEXT)):
            async with gate.session.post(gate.url + path, json=body) as r:
                draining_refusal(r, await r.json())
        assert (fake.started, fake.counted) == (0, 0)  # no generation, not even a /tokenize call
        state = await gate.state()
        assert state["ready"] is False
        assert state["drain"] | {"secondsLeft": None} == {
            "draining": True, "cause": "hook", "final": False, "secondsLeft": None, "deadlineSeconds": 25.0,
            "refused": 2, "cut": 0, "resumed": 0,
        }  # fmt: skip
        async with gate.session.get(gate.admin_url + "/metrics") as r:
            exposition = await r.text()
        assert "\nslogate_draining 1.0\n" in exposition
        assert "\nslogate_drain_refusals_total 2.0\n" in exposition


async def test_deferred_requests_are_refused_when_the_drain_begins(tmp_path: Path) -> None:
    one_slot = thresholds_for(smollm2_profile(), concurrency={"max": 1}, deferral={"maxWaitSeconds": 30})
    async with gated(tmp_path, one_slot) as (fake, gate):
        held = await held_stream(gate, fake)
        waiting = asyncio.create_task(stream(gate.session, gate.url))
        assert await until(lambda: gate.sidecar.gate.deferred == 1)
        gate.sidecar.gate.begin_drain(DrainCause.SIGNAL)
        answer = await asyncio.wait_for(waiting, HANG_GUARD_S)
        assert (answer.status, answer.chunks[0]["error"]["code"]) == (429, "slogate_draining")
        assert gate.sidecar.gate.deferred == 0
        assert fake.started == 1  # the refused request never reached the upstream
        assert not held.done()  # the admitted one runs on
        fake.stall_forever.set()
        finished = await asyncio.wait_for(held, HANG_GUARD_S)
        assert finished.complete
        assert await gate.sidecar.gate.drain.drained()
        assert (await gate.state())["drain"]["refused"] == 1


async def test_the_hook_answers_once_the_last_admitted_stream_has_ended(tmp_path: Path) -> None:
    async with gated(tmp_path) as (fake, gate):
        held = [await held_stream(gate, fake) for _ in range(2)]

        async def hook() -> dict[str, Any]:
            async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as r:
                assert r.status == 200
                answer: dict[str, Any] = await r.json()
                return answer

        waiting = asyncio.create_task(hook())
        assert await until(lambda: gate.sidecar.gate.drain.active)
        async with gate.session.get(gate.url + "/readyz") as r:
            assert r.status == 503
        assert not waiting.done()  # two streams held: the hook waits
        assert gate.sidecar.gate.ledger.streams == 2
        fake.stall_forever.set()
        answer = await asyncio.wait_for(waiting, HANG_GUARD_S)
        # Answered when the ledger had no stream left, and both ran to their end.
        assert (answer["drained"], answer["streams"], answer["cause"]) == (True, 0, "hook")
        assert [s.complete for s in await asyncio.gather(*held)] == [True, True]


async def test_a_final_drain_ends_when_its_last_stream_does(tmp_path: Path) -> None:
    async with gated(tmp_path) as (fake, gate):
        drain = gate.sidecar.gate.drain
        held = await held_stream(gate, fake)
        over = asyncio.create_task(drain.final_drained())
        gate.sidecar.gate.begin_drain(DrainCause.SIGNAL)
        async with gate.session.post(gate.url + "/completion", json=STREAM) as r:
            draining_refusal(r, await r.json())
        assert not over.done()
        fake.stall_forever.set()
        assert (await asyncio.wait_for(held, HANG_GUARD_S)).complete
        await asyncio.wait_for(over, HANG_GUARD_S)
        assert (drain.cut, drain.refused, drain.final) == (0, 1, True)


async def test_the_deadline_answers_the_hook_with_the_streams_still_running(tmp_path: Path) -> None:
    async with gated(tmp_path, drain_deadline_s=0.3) as (fake, gate):
        held = await held_stream(gate, fake)
        async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as r:
            answer = await r.json()
        assert (r.status, answer["drained"], answer["streams"]) == (200, False, 1)
        assert not held.done()  # llama-server's stop, which follows the hook, ends it; not the sidecar
        fake.stall_forever.set()
        assert (await asyncio.wait_for(held, HANG_GUARD_S)).complete


async def test_a_hook_drain_ends_once_the_upstream_was_down_and_is_healthy_again(tmp_path: Path) -> None:
    async with gated(tmp_path) as (fake, gate):
        drain = gate.sidecar.gate.drain
        async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as r:
            assert r.status == 200
        fake.healthy = False  # llama-server stopped after the hook (a container restart)
        assert await until(lambda: drain.upstream_went_down)
        async with gate.session.post(gate.url + "/completion", json=STREAM) as r:
            draining_refusal(r, await r.json())  # still a 429 to retry elsewhere, not a 503
        assert drain.active
        fake.healthy = True
        assert await until(lambda: not drain.active)
        async with gate.session.get(gate.url + "/readyz") as r:
            assert r.status == 200
        fake.stall_forever.set()
        assert (await stream(gate.session, gate.url)).complete
        assert (drain.resumed, drain.refused, fake.started) == (1, 1, 1)


async def test_a_sigterm_drain_never_resumes(tmp_path: Path) -> None:
    async with gated(tmp_path) as (fake, gate):
        drain = gate.sidecar.gate.drain
        async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as r:
            assert r.status == 200
        gate.sidecar.gate.begin_drain(DrainCause.SIGNAL)  # the pod is being deleted: final
        fake.healthy = False
        assert await until(lambda: not gate.sidecar.upstream_up)
        fake.healthy = True
        assert await until(lambda: gate.sidecar.upstream_up)  # the poll that saw it up also told the drain
        assert (drain.active, drain.final, drain.resumed) == (True, True, 0)
        async with gate.session.post(gate.url + "/completion", json=STREAM) as r:
            draining_refusal(r, await r.json())


async def test_a_stray_hook_drain_ends_after_twice_the_deadline(tmp_path: Path) -> None:
    async with gated(tmp_path, drain_deadline_s=0.2) as (fake, gate):
        drain = gate.sidecar.gate.drain
        async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as r:
            assert r.status == 200
        assert drain.active  # answered, but nothing stopped the upstream ...
        assert await until(lambda: not drain.active)  # ... so the drain ends by itself
        assert (drain.resumed, drain.upstream_went_down) == (1, False)
        fake.stall_forever.set()
        assert (await stream(gate.session, gate.url)).complete


# ------------------------------------------------------------------------------ the process


@asynccontextmanager
async def sidecar_process(tmp_path: Path, *flags: str) -> AsyncIterator[tuple[FakeUpstream, SidecarProcess]]:
    fake = FakeUpstream(mode="stall")
    async with serve(llama_app(fake)) as fake.url:
        process = SidecarProcess(
            fake.url, tmp_path, thresholds_for(smollm2_profile()), ("--poll-interval", "0.2", *flags)
        )
        try:
            await process.start()
            yield fake, process
        finally:
            fake.stall_forever.set()
            await process.stop()


async def test_sigterm_drains_and_the_process_exits_once_the_last_stream_ended(tmp_path: Path) -> None:
    async with sidecar_process(tmp_path) as (fake, process), aiohttp.ClientSession() as session:
        held = asyncio.create_task(stream(session, process.url))
        assert await until(lambda: fake.started == 1)
        process.send(signal.SIGTERM)
        drain: dict[str, Any] = {}
        for _ in range(int(HANG_GUARD_S / 0.05)):
            drain = (await process.state(session))["drain"]
            if drain["final"]:
                break
            await asyncio.sleep(0.05)
        assert (drain["draining"], drain["cause"], drain["final"]) == (True, "signal", True)
        async with session.post(process.url + "/completion", json=STREAM) as r:  # its port is still open
            draining_refusal(r, await r.json())
        assert process.returncode is None  # a stream is held: it waits
        fake.stall_forever.set()
        assert (await asyncio.wait_for(held, HANG_GUARD_S)).complete
        assert await asyncio.wait_for(process.exited(), HANG_GUARD_S) == 0
        assert fake.started == 1
    assert "drained: 1 requests refused while draining, 0 streams cut; stopping" in process.log_text()


async def test_at_the_deadline_the_process_cuts_what_still_runs_and_exits(tmp_path: Path) -> None:
    async with (
        sidecar_process(tmp_path, "--drain-deadline", "0.5") as (fake, process),
        aiohttp.ClientSession() as session,
    ):
        held = asyncio.create_task(stream(session, process.url))
        assert await until(lambda: fake.started == 1)
        process.send(signal.SIGTERM)
        assert await asyncio.wait_for(process.exited(), HANG_GUARD_S) == 0
        cut = await asyncio.wait_for(held, HANG_GUARD_S)
        assert (cut.status, cut.complete, len(cut.chunks)) == (200, False, 1)  # the first token, then the cut
        assert await until(lambda: fake.aborted == 1)  # the upstream saw its connection closed
    assert "drain deadline (0.5 s) passed: cutting 1 admitted streams" in process.log_text()
    assert "0 requests refused while draining, 1 streams cut; stopping" in process.log_text()


async def test_the_hook_drains_only_with_the_pods_drain_token(tmp_path: Path) -> None:
    """The second review: any pod that reached the admin port could drain any gated pod, again
    and again. With an admin token the drain needs the token derived from it (the hook's)."""
    async with gated(tmp_path) as (_fake, gate):
        drain = gate.sidecar.gate.drain
        for headers in ({}, {drain_token.HEADER: "guess"}, {drain_token.HEADER: drain_token.drain_token(b"other")}):
            async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=headers) as r:
                assert r.status == 403
                assert (await r.json())["error"]["type"] == "permission_error"
        assert not drain.active
        async with gate.session.get(gate.url + "/readyz") as r:
            assert r.status == 200
        async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as r:
            assert r.status == 200
        assert drain.active
