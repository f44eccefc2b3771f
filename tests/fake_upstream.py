"""A fake llama-server for fault injection only: it crashes, stalls and fails on demand.

Everything that can be tested against the real llama-server is; this fake exists for
the failures the real one cannot produce on cue.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

from aiohttp import web

from slogate_llama.exposition import IDLE, exposition
from slogate_llama.routes import Route

METRICS = exposition(replace(IDLE, prompt_tokens_total=1000, prompt_seconds_total=4.0))
"""The fake's /metrics: constant counters (1,000 prompt tokens in 4 s), so no live rate is learnt."""


@dataclass
class FakeUpstream:
    """Behaviour switches, flipped by tests while it runs."""

    mode: str = "ok"
    """ok | crash (one chunk, then the connection dies) | stall (one chunk, then silence) | error500"""
    healthy: bool = True
    started: int = 0
    aborted: int = 0
    url: str = ""
    stall_forever: asyncio.Event = field(default_factory=asyncio.Event)

    async def health(self, _r: web.Request) -> web.Response:
        return web.json_response({"status": "ok"}, status=200 if self.healthy else 503)

    async def metrics(self, _r: web.Request) -> web.Response:
        return web.Response(text=METRICS)

    async def tokenize(self, request: web.Request) -> web.Response:
        content = (await request.json())["content"]
        return web.json_response({"tokens": list(range(max(1, len(content) // 4)))})

    async def apply_template(self, request: web.Request) -> web.Response:
        messages = (await request.json())["messages"]
        return web.json_response({"prompt": "".join(str(m.get("content")) for m in messages)})

    async def completion(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.started += 1
        if self.mode == "error500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {
            "index": 0,
            "content": "Hi",
            "stop": False,
            "tokens_predicted": 1,
            "tokens_evaluated": 3,
        }
        try:
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if self.mode == "crash":
                assert request.transport is not None
                request.transport.abort()  # the process died mid-stream
                return response
            if self.mode == "stall":
                await self.stall_forever.wait()
            final = {
                **chunk,
                "content": "",
                "stop": True,
                "tokens_predicted": 2,
                "timings": {"prompt_n": 3, "cache_n": 0},
            }
            await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            await response.write_eof()
        except asyncio.CancelledError:
            self.aborted += 1  # the gate closed the connection: the generation is abandoned
            raise
        return response


class LlamaLike(Protocol):
    """What a fake llama-server answers: the sidecar's health poll, counters, token counting, generations."""

    async def health(self, request: web.Request) -> web.StreamResponse: ...
    async def metrics(self, request: web.Request) -> web.StreamResponse: ...
    async def tokenize(self, request: web.Request) -> web.StreamResponse: ...
    async def apply_template(self, request: web.Request) -> web.StreamResponse: ...
    async def completion(self, request: web.Request) -> web.StreamResponse: ...


def llama_app(upstream: LlamaLike) -> web.Application:
    """llama-server's routes the sidecar calls, answered by ``upstream``."""
    app = web.Application()
    app.router.add_get("/health", upstream.health)
    app.router.add_get("/metrics", upstream.metrics)
    app.router.add_post("/tokenize", upstream.tokenize)
    app.router.add_post("/apply-template", upstream.apply_template)
    for route in Route:
        app.router.add_post(route.value, upstream.completion)
    return app


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port (handlers cancelled on disconnect); yields its URL."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.base_events.Server)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def fake_upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    try:
        async with serve(llama_app(fake)) as fake.url:
            yield fake
    finally:
        fake.stall_forever.set()
