"""The benchmark's fronts as real processes: one interface, each tuned from the same calibration."""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path

import aiohttp

from canned_profiles import smollm2_profile
from fake_upstream import fake_upstream
from sidecar_harness import thresholds_for
from slogate_bench.live.fronts import CountCapFront, Front, RateLimitFront, line_up
from slogate_sim.limits import CountCap, RateLimit

BODY = {"prompt": [1, 2, 3], "n_predict": 2, "stream": True}


async def post(session: aiohttp.ClientSession, url: str) -> int:
    async with session.post(url + "/completion", json=BODY) as r:
        await r.read()
        return r.status


def test_the_line_up_is_tuned_from_mu_and_the_slo() -> None:
    thresholds = thresholds_for(smollm2_profile())
    fronts = line_up(thresholds, mu=1.3, slo_s=2.0)
    assert [f.name for f in fronts.each()] == ["direct", "count-cap", "rate-limit", "slogate"]
    cap = thresholds.concurrency_cap
    assert fronts.count_cap.cap == CountCap(cap, math.floor(2.0 * 1.3))  # slots in flight, ⌊SLO · μ⌋ waiting
    assert fronts.rate_limit.limit == RateLimit(1.3, cap)  # μ per second, a burst of slots
    assert fronts.slogate.thresholds == thresholds


async def test_every_front_serves_through_the_same_interface(tmp_path: Path) -> None:
    fronts: tuple[Front, ...] = line_up(thresholds_for(smollm2_profile()), mu=1.0, slo_s=2.0).each()
    seen = []
    async with fake_upstream() as upstream, aiohttp.ClientSession() as session:
        for front in fronts:
            async with front.in_front_of(upstream.url, tmp_path) as started:
                status = await post(session, started.url)
                books = await started.books()
                seen.append((front.name, status, started.url == upstream.url, started.pid, books is None))
            assert upstream.started == len(seen)  # each request reached llama-server, once
    assert [(name, status, direct, books) for name, status, direct, _, books in seen] == [
        ("direct", 200, True, True),  # llama-server alone: its own URL, nothing to start, no books
        ("count-cap", 200, False, True),
        ("rate-limit", 200, False, True),
        ("slogate", 200, False, False),  # the sidecar keeps books: its state and deferrals
    ]
    pids = [pid for _, _, _, pid, _ in seen]
    assert pids[0] is None
    assert all(pid not in (None, os.getpid()) for pid in pids[1:])  # each in its own process


async def test_a_count_cap_process_refuses_when_its_slots_and_queue_are_full(tmp_path: Path) -> None:
    async with fake_upstream() as upstream, aiohttp.ClientSession() as session:
        upstream.mode = "stall"
        async with CountCapFront(CountCap(concurrency=1, queue=0)).in_front_of(upstream.url, tmp_path) as started:
            held = asyncio.create_task(post(session, started.url))
            for _ in range(250):  # bounded: 5 s
                if upstream.started == 1:
                    break
                await asyncio.sleep(0.02)
            assert upstream.started == 1
            assert await post(session, started.url) == 503
            upstream.stall_forever.set()
            assert await held == 200
    assert upstream.started == 1  # the refused request never reached llama-server


async def test_a_rate_limit_process_refuses_beyond_its_burst(tmp_path: Path) -> None:
    front = RateLimitFront(RateLimit(rate_rps=0.01, burst=2))
    async with (
        fake_upstream() as upstream,
        aiohttp.ClientSession() as session,
        front.in_front_of(upstream.url, tmp_path) as started,
    ):
        statuses = [await post(session, started.url) for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert upstream.started == 2
