"""An instant stand-in for llama-server, to measure the sidecar's own cost.

It answers at once (or, for one marked prompt, holds the stream open so the gate stays
full and every other request is rejected): whatever the sidecar costs is then the only
cost. Used by the overhead benchmark, never to stand in for llama-server's behaviour.
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

from slogate_llama.exposition import IDLE, exposition

HOLD_TOKEN = 7
"""A prompt starting with this token id is held open until the stub stops."""

_METRICS = exposition(IDLE)  # counters that never move: the gate learns no live rate
_CHUNK = b'data: {"index":0,"content":"ok","tokens":[1],"stop":false}\n\n'
_FINAL = (
    b'data: {"index":0,"content":"","stop":true,"tokens_predicted":1,"tokens_evaluated":3,'
    b'"timings":{"prompt_n":3,"cache_n":0}}\n\n'
)


def app() -> web.Application:
    """The stub's routes."""
    hold = asyncio.Event()

    async def completion(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_CHUNK)
        if body.get("prompt", [0])[:1] == [HOLD_TOKEN]:
            await hold.wait()
        await response.write(_FINAL)
        await response.write_eof()
        return response

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=_METRICS)

    application = web.Application()
    application.router.add_post("/completion", completion)
    application.router.add_get("/health", health)
    application.router.add_get("/metrics", metrics)
    return application


if __name__ == "__main__":
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]), print=None)
