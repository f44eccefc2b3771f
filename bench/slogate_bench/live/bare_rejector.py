"""The least an aiohttp server can do for a 429: the Python floor under the sidecar's rejections.

It reads the request body (an HTTP server must, before it answers on that connection) and
answers 429 with a small OpenAI-style JSON error and a Retry-After, as the sidecar's
rejections look, without parsing, counting or deciding anything. Whatever the sidecar's
rejection costs above this server's, on the same loop and the same machine at the same
moment, is slogate's own code; what this server costs above nginx's is Python's and aiohttp's.

Run: ``python -m slogate_bench.live.bare_rejector PORT`` (through ``event_loops.launcher`` for uvloop).
"""

from __future__ import annotations

import sys

from aiohttp import web

BODY = b'{"error":{"message":"over capacity","type":"rate_limit_error","param":null,"code":"bare_floor"}}'
"""What every rejection says: the size and shape of the sidecar's error body, without its details."""


def app() -> web.Application:
    """POST /completion: 429, always; GET /health: 200 (readiness)."""

    async def completion(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=BODY, status=429, content_type="application/json", headers={"Retry-After": "1"})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    application = web.Application()
    application.router.add_post("/completion", completion)
    application.router.add_get("/health", health)
    return application


if __name__ == "__main__":
    # No access log: the floor is the server, not its logging (the sidecar's access log is its own cost).
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
