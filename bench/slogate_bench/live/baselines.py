"""The admission controls slogate is compared with, as small reverse proxies.

- count cap: at most N requests forwarded at once, at most Q waiting in FIFO order,
  503 beyond that (what Ollama's OLLAMA_NUM_PARALLEL / OLLAMA_MAX_QUEUE and most
  proxies offer);
- rate limit: a token bucket of R requests per second, 429 when empty.

(llama-server alone, its own unbounded queue, needs no proxy: ``live.fronts.DirectFront``.)

Both proxies stream the upstream's SSE through line by line, as the sidecar does, and
run with handler_cancellation, so a client that disconnects cancels its handler, which
closes the upstream connection: llama-server aborts the generation. Only the native
``POST /completion`` (what the load generator sends) and ``GET /health`` are proxied.

Each is tuned *fairly*, from the same calibration and SLO slogate gets (``limits``). The
benchmarks run each in its own process (``live.fronts``, through ``python -m
slogate_bench.live.baselines``): in-process they would share the load generator's event loop
and its CPU count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from slogate_sim.limits import CountCap, RateLimit

Clock = Callable[[], float]


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; starts full. The clock is injected for tests."""

    def __init__(self, rate_rps: float, burst: int, clock: Clock = time.monotonic) -> None:
        if rate_rps <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst >= 1")
        self.rate, self.burst, self.clock = rate_rps, burst, clock
        self.tokens = float(burst)
        self.updated = clock()

    def take(self) -> float:
        """0.0 if a token was taken; else the seconds until the next token (nothing taken)."""
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class FifoLimiter:
    """At most ``max_concurrency`` holders, at most ``max_queue`` waiters served in order.

    A released slot is handed straight to the oldest waiter, so a newcomer can never
    overtake the queue, and "full" is exact: active == max_concurrency and
    waiting == max_queue.
    """

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ValueError("max_concurrency must be >= 1 and max_queue >= 0")
        self.max_concurrency, self.max_queue = max_concurrency, max_queue
        self.active = 0
        self.peak_active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def enter(self) -> bool:
        """Take a slot, queueing if needed; False at once if the queue is full too."""
        if self.active < self.max_concurrency:
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
            return True
        if len(self._waiters) >= self.max_queue:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # resolved by leave(), which hands over its slot
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.leave()  # handed a slot in the same instant the client left: pass it on
            else:
                with contextlib.suppress(ValueError):  # leave() may have dropped it already
                    self._waiters.remove(waiter)
            raise
        return True

    def leave(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.active -= 1


def _error(
    status: int,
    message: str,
    *,
    kind: str,
    code: str,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> web.Response:
    body: dict[str, Any] = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    body.update(extra or {})
    return web.json_response(body, status=status, headers=headers)


class BaselineProxy:
    """Forwarding shared by the baselines; subclasses decide who may pass."""

    def __init__(self) -> None:
        self.forwarded = 0
        self.rejected = 0
        self.upstream = ""
        self._session: aiohttp.ClientSession | None = None

    async def completion(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def health(self, _request: web.Request) -> web.Response:
        try:
            async with self.session.get(self.upstream + "/health", timeout=aiohttp.ClientTimeout(total=5)) as up:
                return web.Response(body=await up.read(), status=up.status, content_type=up.content_type)
        except (aiohttp.ClientError, TimeoutError):
            return _error(503, "upstream unavailable", kind="server_error", code="upstream_unavailable")

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "serve the proxy with serving()"
        return self._session

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """Relay one /completion; SSE line by line, anything else whole."""
        self.forwarded += 1
        body = await request.read()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        response: web.StreamResponse | None = None
        try:
            async with self.session.post(
                self.upstream + "/completion", data=body, headers=headers, timeout=timeout
            ) as upstream:
                if upstream.status == 200 and upstream.content_type == "text/event-stream":
                    response = web.StreamResponse(
                        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                    )
                    await response.prepare(request)
                    async for line in upstream.content:
                        await response.write(line)
                    await response.write_eof()
                    return response
                payload = await upstream.read()
                # An upstream 5xx (a 503 while llama-server loads) is not this proxy's shedding: 502.
                status = 502 if upstream.status >= 500 else upstream.status
                return web.Response(body=payload, status=status, content_type=upstream.content_type)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            raise asyncio.CancelledError from None  # the client left mid-stream: abandon the upstream too
        except (aiohttp.ClientError, TimeoutError) as failure:
            if response is None:
                return _error(502, f"upstream failed: {failure!r}", kind="server_error", code="upstream_error")
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
                await response.write(b'data: {"error": {"message": "upstream failed mid-stream"}}\n\n')
                await response.write_eof()
            return response


class CountCapProxy(BaselineProxy):
    """Fixed concurrency plus a fixed FIFO queue; 503 at once when both are full."""

    def __init__(self, cap: CountCap) -> None:
        super().__init__()
        self.limiter = FifoLimiter(cap.concurrency, cap.queue)

    async def completion(self, request: web.Request) -> web.StreamResponse:
        if not await self.limiter.enter():
            self.rejected += 1
            return _error(
                503,
                f"server busy: {self.limiter.max_concurrency} requests running and {self.limiter.max_queue} queued",
                kind="server_error",
                code="queue_full",
            )
        try:
            return await self.forward(request)
        finally:
            self.limiter.leave()


class RateLimitProxy(BaselineProxy):
    """A static token bucket; 429 with Retry-After (the time to the next token) when empty."""

    def __init__(self, limit: RateLimit, clock: Clock = time.monotonic) -> None:
        super().__init__()
        self.bucket = TokenBucket(limit.rate_rps, limit.burst, clock)

    async def completion(self, request: web.Request) -> web.StreamResponse:
        wait = self.bucket.take()
        if wait > 0:
            self.rejected += 1
            # Retry-After is whole seconds (RFC 9110); the exact wait is in the body.
            return _error(
                429,
                f"rate limit of {self.bucket.rate:g} requests/s exceeded",
                kind="rate_limit_error",
                code="rate_limited",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
                extra={"retryAfterSeconds": round(wait, 3)},
            )
        return await self.forward(request)


@contextlib.asynccontextmanager
async def serving(proxy: BaselineProxy, upstream: str, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``proxy`` in front of ``upstream``; yields its base URL (a free port unless one is given)."""
    proxy.upstream = upstream.rstrip("/")
    app = web.Application()
    app.router.add_post("/completion", proxy.completion)
    app.router.add_get("/health", proxy.health)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    # One upstream connection per request: llama-server closes a connection after a streamed
    # response, and a pooled connection reused at that instant fails (ServerDisconnectedError).
    proxy._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        server = site._server  # the bound port when 0 was asked for
        assert isinstance(server, asyncio.base_events.Server)
        yield f"http://{host}:{server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()
        await proxy._session.close()


async def _serve_until_signalled(proxy: BaselineProxy, upstream: str, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with serving(proxy, upstream, host, port) as url:
        print(url, flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slogate_bench.live.baselines --upstream URL count-cap|rate-limit ...``: prints its URL, serves."""
    parser = argparse.ArgumentParser(
        prog="python -m slogate_bench.live.baselines", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    proxies = parser.add_subparsers(required=True, metavar="PROXY")
    cap = proxies.add_parser("count-cap", help="CountCapProxy")
    cap.add_argument("--concurrency", type=int, required=True)
    cap.add_argument("--queue", type=int, required=True)
    cap.set_defaults(proxy=lambda a: CountCapProxy(CountCap(a.concurrency, a.queue)))
    rate = proxies.add_parser("rate-limit", help="RateLimitProxy")
    rate.add_argument("--rate-rps", type=float, required=True)
    rate.add_argument("--burst", type=int, required=True)
    rate.set_defaults(proxy=lambda a: RateLimitProxy(RateLimit(a.rate_rps, a.burst)))
    args = parser.parse_args(argv)
    asyncio.run(_serve_until_signalled(args.proxy(args), args.upstream, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
