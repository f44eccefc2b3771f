"""A storm of 1,000 client disconnects at random points, streaming and not.

Clients speak raw HTTP to a real sidecar and vanish (RST or FIN) at a random point:
mid-upload, while the gate counts or defers them, while waiting for a non-streamed
answer, or after a few streamed tokens. A tenth complete normally. The upstream is a
fault-injecting fake that records every generation's fate: it streams three tokens,
then a request planned to be abandoned stalls until its connection is closed, so the
only way such a generation can end is the gate aborting it. Afterwards: nothing
queued, reserved, streaming or deferred in the gate, nothing left running upstream,
and every abandoned generation that reached the upstream was aborted there.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from canned_profiles import smollm2_profile
from fake_upstream import METRICS, llama_app, serve
from sidecar_harness import RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_llama.routes import Route

REQUESTS = 1000
CONCURRENCY = 48
HANG_GUARD_S = 60.0
"""Not a performance bound: a client or generation still running after this is hung."""


@dataclass
class RecordingUpstream:
    """Streams route-shaped chunks; records each generation's fate by the client's test id."""

    started: dict[int, str] = field(default_factory=dict)
    """id -> plan ("complete" or "abandon") for every generation that reached it."""
    fate: dict[int, str] = field(default_factory=dict)
    """id -> "completed" | "aborted"."""
    tokenized: int = 0

    @property
    def running(self) -> int:
        return len(self.started) - len(self.fate)

    async def health(self, _r: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(self, _r: web.Request) -> web.Response:
        return web.Response(text=METRICS)

    async def tokenize(self, request: web.Request) -> web.Response:
        self.tokenized += 1
        content = (await request.json())["content"]
        return web.json_response({"tokens": list(range(max(1, len(content) // 4)))})

    async def apply_template(self, request: web.Request) -> web.Response:
        messages = (await request.json())["messages"]
        return web.json_response({"prompt": "".join(str(m.get("content")) for m in messages)})

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        test = body["slogate_test"]
        self.started[test["id"]] = test["plan"]
        route = Route(request.path)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            for _ in range(3):
                await response.write(sse(chunk(route, "tok", final=False)))
                await asyncio.sleep(0.005)
            if test["plan"] == "abandon":
                await asyncio.Event().wait()  # until the gate closes the connection
            await response.write(sse(chunk(route, "", final=True)))
            if route is not Route.NATIVE:
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.fate[test["id"]] = "aborted"
            raise
        self.fate[test["id"]] = "completed"
        return response


def sse(value: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(value).encode() + b"\n\n"


def chunk(route: Route, text: str, *, final: bool) -> dict[str, Any]:
    """A chunk shaped like llama-server's on this route (so the gate sees first tokens)."""
    usage = {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}
    if route is Route.NATIVE:
        return {"index": 0, "content": text, "stop": final, **({"tokens_predicted": 4} if final else {})}
    if route is Route.COMPLETIONS:
        choice = {"text": text, "index": 0, "finish_reason": "length" if final else None}
        return {"object": "text_completion", "choices": [choice], **({"usage": usage} if final else {})}
    delta = {} if final else {"content": text}
    choice = {"delta": delta, "index": 0, "finish_reason": "length" if final else None}
    return {"object": "chat.completion.chunk", "choices": [choice], **({"usage": usage} if final else {})}


@pytest.fixture
async def storm_target(tmp_path: Path) -> AsyncIterator[tuple[RunningSidecar, RecordingUpstream]]:
    upstream = RecordingUpstream()
    # Deferral on (waits up to 0.3 s) and a 16-stream cap (a 16-slot server): the storm meets
    # every stage of the gate, and many abandoned generations get as far as the upstream.
    profile = smollm2_profile(server={"slots": 16, "ctxPerSlot": 2048, "threads": 2},
                              kv={"bytesPerToken": 23040, "capacityTokens": 32768, "perRequestMaxTokens": 2048})  # fmt: skip
    thresholds = thresholds_for(profile, deferral={"maxWaitSeconds": 0.3})
    async with serve(llama_app(upstream)) as url, sidecar_in_front_of(url, tmp_path, thresholds) as gate:
        yield gate, upstream


def body_for(i: int, route: Route, stream: bool, plan: str, rng: random.Random) -> bytes:
    test = {"id": i, "plan": plan}
    prompt: Any = rng.choice(["Tell me a story.", list(range(10, 10 + rng.randint(1, 40)))])
    if route is Route.CHAT:
        fields: dict[str, Any] = {"messages": [{"role": "user", "content": str(prompt)}], "max_tokens": 8}
    else:
        fields = {"prompt": prompt, "n_predict" if route is Route.NATIVE else "max_tokens": 8}
    return json.dumps({**fields, "stream": stream, "slogate_test": test}).encode()


async def one_client(url: str, i: int, rng: random.Random, tally: Callable[[str], None]) -> None:
    """Send one request and (nine times in ten) vanish at a random point."""
    route = rng.choice(list(Route))
    stream = rng.random() < 0.5
    plan = "complete" if rng.random() < 0.1 else "abandon"
    body = body_for(i, route, stream, plan, rng)
    head = (f"POST {route.value} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    stages = ["mid-upload", "waiting", "after-tokens"] if stream else ["mid-upload", "waiting"]
    point = "completed" if plan == "complete" else rng.choice(stages)
    try:
        if point == "mid-upload":
            writer.write(head + body[: rng.randrange(len(body))])
            await writer.drain()
            await asyncio.sleep(rng.uniform(0, 0.02))
        elif point == "waiting":  # counting, deferred, queued, or waiting for a non-streamed answer
            writer.write(head + body)
            await writer.drain()
            await asyncio.sleep(rng.uniform(0, 0.1))
        elif point == "after-tokens":
            writer.write(head + body)
            await writer.drain()
            wanted, seen = rng.randint(1, 3), 0
            while seen < wanted:
                line = await reader.readline()
                if not line:
                    break  # answered and closed: rejected, or deferred until the wait ran out
                seen += line.startswith(b"data: ")
        else:
            writer.write(head + body)
            await writer.drain()
            answer = await reader.read()
            assert answer.split(b" ", 2)[1] in (b"200", b"429"), answer[:200]
    finally:
        if point == "completed" or rng.random() < 0.5:
            writer.close()
        else:
            writer.transport.abort()  # a reset rather than an orderly close
        tally(point)


async def until(condition: Callable[[], bool], limit_s: float = HANG_GUARD_S) -> bool:
    for _ in range(int(limit_s / 0.05)):
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


async def test_a_thousand_disconnects_leak_nothing_and_abort_upstream(
    storm_target: tuple[RunningSidecar, RecordingUpstream], record_property: Callable[[str, object], None]
) -> None:
    gate, upstream = storm_target
    rng = random.Random(8)
    points: Counter[str] = Counter()
    gate_limit = asyncio.Semaphore(CONCURRENCY)

    async def guarded(i: int) -> None:
        async with gate_limit:
            await one_client(gate.url, i, random.Random(rng.random()), lambda point: points.update([point]))

    async with asyncio.timeout(HANG_GUARD_S * 5):
        await asyncio.gather(*(guarded(i) for i in range(REQUESTS)))

    assert sum(points.values()) == REQUESTS
    assert min(points[p] for p in ("mid-upload", "waiting", "after-tokens", "completed")) >= 50, points
    # The gate's books: nothing queued, reserved, streaming or deferred.
    assert await gate.wait_idle(), gate.sidecar.gate.ledger
    live = (await gate.state())["live"]
    assert live == {"queuedPrefillTokens": 0, "streams": 0, "reservedKvTokens": 0, "deferred": 0}
    # Upstream: nothing left running; every abandoned generation that reached it was aborted.
    assert await until(lambda: upstream.running == 0), upstream.running
    abandoned = {i for i, plan in upstream.started.items() if plan == "abandon"}
    assert {i for i in abandoned if upstream.fate[i] == "aborted"} == abandoned
    assert len(abandoned) >= 100  # the storm did reach the upstream in numbers, not only the gate
    completed = {i for i, plan in upstream.started.items() if plan == "complete"}
    assert all(upstream.fate[i] in ("completed", "aborted") for i in completed)
    async with gate.session.get(gate.admin_url + "/metrics") as response:
        disconnects = next(
            float(line.split()[-1])
            for line in (await response.text()).splitlines()
            if line.startswith("slogate_client_disconnects_total ")
        )
    assert disconnects >= len(abandoned)  # each aborted generation had a client that left
    record_property("requests", REQUESTS)
    record_property("faults", json.dumps(dict(points)))
    record_property("upstream", json.dumps({"started": len(upstream.started), "aborted_abandoned": len(abandoned),
                                            "tokenized": upstream.tokenized}))  # fmt: skip
    record_property("counters_after", json.dumps(live))
