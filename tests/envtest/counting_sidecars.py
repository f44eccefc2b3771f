"""Stand-in sidecar admin APIs for the operator tests: they take pushes and say what they serve."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections import Counter
from typing import Any

import aiohttp.web

from api_cluster import Cluster
from ports import free_ports


class CountingSidecars:
    """Sidecar admin APIs on 127.0.0.x: they take a push and say what they serve; every request counted."""

    def __init__(self, cluster: Cluster, count: int, *, hang: bool = False) -> None:
        self.cluster, self.hang = cluster, hang
        (self.port,) = free_ports()
        self.requests: Counter[str] = Counter()
        self.open = 0
        self.release = threading.Event()
        self.served: dict[str, Any] = {}
        self.ips = [f"127.0.0.{10 + i}" for i in range(count)]
        self._runners = [cluster.loop.run(self._start(ip)) for ip in self.ips]

    async def _start(self, ip: str) -> aiohttp.web.AppRunner:
        app = aiohttp.web.Application()
        app.router.add_get("/slogate/v1/state", functools.partial(self._answer, ip))
        app.router.add_put("/slogate/v1/thresholds", functools.partial(self._answer, ip))
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        await aiohttp.web.TCPSite(runner, ip, self.port).start()
        return runner

    async def _answer(self, ip: str, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.requests[request.method] += 1
        if self.hang:  # accepted, never answered: what a frozen pod does to the operator
            self.open += 1
            try:
                while not self.release.is_set():
                    await asyncio.sleep(0.05)
            finally:
                self.open -= 1
        if request.method == "PUT":
            self.served[ip] = json.loads(await request.read())
        return aiohttp.web.json_response({"thresholds": self.served.get(ip)})

    def close(self) -> None:
        self.release.set()
        for runner in self._runners:
            self.cluster.loop.run(runner.cleanup())
