"""An open-loop load generator: Poisson arrivals that never wait for completions.

Closed loops hide overload (a slow server slows its own clients down); real users
keep arriving. Each request streams, so the client measures its TTFT; a client
timeout abandons it (closing the connection, as an impatient user does).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

Outcome = Literal["ok", "rejected", "timeout", "error"]


@dataclass(frozen=True, slots=True)
class Workload:
    """What each request looks like."""

    prompt_tokens: Callable[[random.Random], int] = lambda _rng: 200
    max_tokens: Callable[[random.Random], int] = lambda _rng: 32
    class_name: Callable[[random.Random], str | None] = lambda _rng: None


@dataclass(frozen=True, slots=True)
class Result:
    """One request's fate, seen from the client."""

    outcome: Outcome
    status: int
    ttft_s: float | None
    """Client-side time to the first generated token (None unless it came)."""
    total_s: float
    retry_after_s: float | None = None


@dataclass(slots=True)
class Run:
    """All results of one load run."""

    duration_s: float
    results: list[Result] = field(default_factory=list)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)

    def within(self, slo_s: float) -> list[Result]:
        """Completed requests whose first token met the SLO."""
        return [r for r in self.results if r.outcome == "ok" and r.ttft_s is not None and r.ttft_s <= slo_s]

    def goodput(self, slo_s: float) -> float:
        """Requests completed within the TTFT SLO, per second of offered load."""
        return len(self.within(slo_s)) / self.duration_s

    def ttft_quantile(self, q: float) -> float | None:
        values = sorted(r.ttft_s for r in self.results if r.outcome == "ok" and r.ttft_s is not None)
        if not values:
            return None
        return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]

    def rejection_latency_median(self) -> float | None:
        values = [r.total_s for r in self.results if r.outcome == "rejected"]
        return statistics.median(values) if values else None


async def one_request(
    session: aiohttp.ClientSession, url: str, prompt: list[int], *, max_tokens: int, class_name: str | None,
    timeout_s: float,
) -> Result:  # fmt: skip
    """POST a streaming native completion; classify what came back."""
    body = {
        "prompt": prompt,
        "n_predict": max_tokens,
        "stream": True,
        "cache_prompt": False,
        "ignore_eos": True,
    }
    headers = {"X-Slogate-Class": class_name} if class_name else {}
    sent = time.monotonic()
    ttft: float | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url + "/completion", json=body, headers=headers) as response:
                if response.status == 429:
                    await response.read()
                    retry = response.headers.get("Retry-After")
                    return Result(
                        "rejected",
                        429,
                        None,
                        time.monotonic() - sent,
                        float(retry) if retry else None,
                    )
                if response.status != 200:
                    await response.read()
                    return Result("error", response.status, None, time.monotonic() - sent)
                async for line in response.content:
                    if ttft is None and line.startswith(b"data: ") and json.loads(line[6:]).get("content"):
                        ttft = time.monotonic() - sent
    except TimeoutError:
        return Result("timeout", 0, ttft, time.monotonic() - sent)
    except aiohttp.ClientError:
        return Result("error", 0, ttft, time.monotonic() - sent)
    return Result("ok", 200, ttft, time.monotonic() - sent)


async def open_loop(url: str, rate_rps: float, duration_s: float, workload: Workload, *, seed: int = 1,
                    timeout_s: float = 10.0, tick: Callable[[], None] | None = None) -> Run:  # fmt: skip
    """Poisson arrivals at ``rate_rps`` for ``duration_s``; waits for every request to end."""
    rng = random.Random(seed)
    run = Run(duration_s=duration_s)
    connector = aiohttp.TCPConnector(limit=0)  # an open loop never queues on the client side
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks: list[asyncio.Task[Result]] = []
        start = time.monotonic()
        next_at = start
        while True:
            next_at += rng.expovariate(rate_rps)
            if next_at - start > duration_s:
                break
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            first = rng.randrange(1000, 40000)
            prompt = list(range(first, first + workload.prompt_tokens(rng)))
            task = asyncio.create_task(
                one_request(
                    session,
                    url,
                    prompt,
                    max_tokens=workload.max_tokens(rng),
                    class_name=workload.class_name(rng),
                    timeout_s=timeout_s,
                )
            )
            if tick is not None:
                task.add_done_callback(lambda _t: tick())
            tasks.append(task)
        run.results = list(await asyncio.gather(*tasks))
    return run
