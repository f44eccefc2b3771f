"""The fault-injection fake llama-server, made to hold its generations and count every call.

A generation is held twice, so a test can look at the gate in each state: before its first
token (its prompt still queued) until ``tokens`` is set, then decoding until ``ends`` is set.
Every request the fake receives is counted by path, so a test can show what did *not* reach
it (a scrape, a refusal).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler

from fake_upstream import FakeUpstream, llama_app, serve
from slogate_llama.routes import Route

if TYPE_CHECKING:
    from sidecar_harness import RunningSidecar

GENERATION_PATHS = frozenset(route.value for route in Route)
"""llama-server's generation routes: a call to any of them starts a generation."""


@dataclass
class HeldUpstream(FakeUpstream):
    """A FakeUpstream whose generations wait for the test, counting every call it gets."""

    tokens: asyncio.Event = field(default_factory=asyncio.Event)
    """Set: held generations send their first token."""
    ends: asyncio.Event = field(default_factory=asyncio.Event)
    """Set: generations that sent their first token finish."""
    calls: Counter[str] = field(default_factory=Counter)
    """Requests received, by path (health polls and counters scrapes included)."""
    answer_status: int | None = None
    """Set: every generation is answered at once with this status and an error body."""

    @property
    def generations(self) -> int:
        """Calls to a generation route (llama-server would have started a generation for each)."""
        return sum(n for path, n in self.calls.items() if path in GENERATION_PATHS)

    async def completion(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.started += 1
        if self.answer_status is not None:
            return web.json_response({"error": {"message": "refused by the fake"}}, status=self.answer_status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await self.tokens.wait()
            chunk = {"index": 0, "content": "Hi", "stop": False, "tokens_predicted": 1, "tokens_evaluated": 3}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await self.ends.wait()
            final = {**chunk, "content": "", "stop": True, "tokens_predicted": 2, "timings": {"prompt_n": 3}}
            await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            await response.write_eof()
        except asyncio.CancelledError:
            self.aborted += 1
            raise
        return response

    def release(self) -> None:
        """Let every generation, held or to come, run to its end."""
        self.tokens.set()
        self.ends.set()


@asynccontextmanager
async def held_upstream() -> AsyncIterator[HeldUpstream]:
    """A HeldUpstream on a free loopback port; held generations are released at exit."""
    fake = HeldUpstream()
    app = llama_app(fake)

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        fake.calls[request.path] += 1
        return await handler(request)

    app.middlewares.append(count)
    async with serve(app) as fake.url:
        try:
            yield fake
        finally:
            fake.release()


async def hold(
    gate: RunningSidecar, fake: HeldUpstream, prompt_tokens: int, n_predict: int = 4, **headers: str
) -> asyncio.Task[int]:
    """A streamed generation admitted and held upstream before its first token (its prompt
    stays queued); the task ends with its status once ``fake`` lets it go."""
    started = fake.started

    async def generate() -> int:
        body = {"prompt": [1] * prompt_tokens, "n_predict": n_predict, "stream": True}
        async with gate.session.post(gate.url + "/completion", json=body, headers=headers) as response:
            await response.read()
            return response.status

    task = asyncio.create_task(generate())
    await until(lambda: fake.started > started or task.done())
    assert fake.started == started + 1, "the request to hold was not admitted"
    return task


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded, 10 s) for an asynchronous consequence; the caller asserts it."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.05)
