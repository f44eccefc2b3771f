"""The load generator's client behaviours and the baseline proxies, against in-process fakes.

These test the client (retries, budgets, timeouts) and the proxies' bookkeeping, which
the real llama-server cannot script on cue; tests/integration/test_baselines.py puts
the proxies in front of the real server.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fake_upstream import fake_upstream, serve
from slogate_bench.live.baselines import CountCapProxy, FifoLimiter, RateLimitProxy, TokenBucket, serving
from slogate_bench.live.load import one_request, open_loop, request_with_retries, run_arrivals
from slogate_bench.live.retries import RetryBudget, RetryPolicy, parse_retry_after
from slogate_bench.results import Result, Run
from slogate_sim.limits import CountCap, RateLimit, fair_count_cap, fair_rate_limit
from slogate_sim.workloads import PRESETS, Arrival, Workload, class_mix, preset, schedule

# --- a scripted upstream: rejects on cue, counts every attempt it sees ---------------------------------------------


@dataclass
class Scripted:
    """Rejects the first ``reject_attempts`` attempts of each request (None: all), then streams."""

    status: int = 429
    retry_after: str | None = None
    reject_attempts: int | None = None
    then: str = "ok"
    """ok | error_event (a 200 stream that ends in an error event) | 500 | never_fits | 400"""
    hits: int = 0
    seen: dict[int, int] = field(default_factory=dict)
    url: str = ""

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        key = body["prompt"][0]
        self.hits += 1
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.reject_attempts is None or self.seen[key] <= self.reject_attempts:
            headers = {"Retry-After": self.retry_after} if self.retry_after is not None else None
            return web.json_response({"error": {"message": "busy"}}, status=self.status, headers=headers)
        if self.then == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if self.then == "never_fits":
            return web.json_response(
                {"error": {"message": "too long", "code": "slogate_request_too_large"}}, status=400
            )
        if self.then == "400":
            return web.json_response({"error": {"message": "malformed", "code": None}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"content": "Hi", "stop": false}\n\n')
        if self.then == "error_event":
            await response.write(b'data: {"error": {"message": "upstream failed mid-stream"}}\n\n')
        else:
            await response.write(b'data: {"content": "", "stop": true}\n\n')
        await response.write_eof()
        return response


@asynccontextmanager
async def scripted(**behaviour: Any) -> AsyncIterator[Scripted]:
    fake = Scripted(**behaviour)
    app = web.Application()
    app.router.add_post("/completion", fake.completion)
    async with serve(app) as fake.url:
        yield fake


def burst(n: int) -> list[Arrival]:
    """n requests all due at once, each with its own first token (the fake's request key)."""
    return [Arrival(0.0, 1000 + 10 * i, 5, 4, None) for i in range(n)]


class RecordingSleep:
    """An injected sleep: records the delays asked for and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded, 5 s) for an asynchronous consequence; the caller asserts it."""
    for _ in range(250):
        if condition():
            return
        await asyncio.sleep(0.02)


# --- retries: amplification, backoff, budget -----------------------------------------------------------------------


async def test_immediate_retries_against_a_server_rejecting_everything_make_max_attempts_each() -> None:
    sleep = RecordingSleep()
    async with scripted(status=503) as fake:
        run = await run_arrivals(fake.url, burst(20), 1.0, retry=RetryPolicy("immediate", max_attempts=3),
                                 retry_sleep=sleep)  # fmt: skip
    assert [r.attempts for r in run.results] == [3] * 20
    assert {r.outcome for r in run.results} == {"rejected"}
    assert all(len(r.rejection_latencies_s) == 3 for r in run.results)
    assert fake.hits == run.arrivals == 60  # what the server saw is what the client counted
    assert run.retries == 40
    assert sleep.delays == [0.0] * 40  # immediate: no waiting at all
    assert run.rejection_probability() == 1.0
    assert run.effective_rate() == pytest.approx(run.predicted_effective_rate(max_attempts=3)) == 60.0
    assert run.predicted_effective_rate() == math.inf


async def test_without_retries_each_request_is_one_arrival() -> None:
    async with scripted(status=429, retry_after="1") as fake:
        run = await run_arrivals(fake.url, burst(20), 1.0)
    assert fake.hits == run.arrivals == len(run.results) == 20
    assert all(r.attempts == 1 and r.outcome == "rejected" and r.status == 429 for r in run.results)
    assert all(r.retry_after_s == 1.0 for r in run.results)


async def test_retried_into_success_amplifies_arrivals_by_one_over_one_minus_p() -> None:
    # Every request is refused twice, then served: p = 2/3 of attempts, λ_eff = 3 λ = λ / (1 − p).
    sleep = RecordingSleep()
    async with scripted(status=429, reject_attempts=2) as fake:
        run = await run_arrivals(fake.url, burst(15), 1.0, retry=RetryPolicy("immediate", max_attempts=10),
                                 retry_sleep=sleep)  # fmt: skip
    assert {(r.outcome, r.attempts) for r in run.results} == {("ok", 3)}
    assert all(r.ttft_s is not None and r.ttft_s <= r.total_s for r in run.results)
    assert fake.hits == run.arrivals == 45
    assert run.rejection_probability() == pytest.approx(2 / 3)
    assert run.effective_rate() == pytest.approx(run.predicted_effective_rate())
    assert run.effective_rate() == pytest.approx(3 * run.offered_rate())


async def test_backoff_waits_at_least_the_retry_after() -> None:
    sleep = RecordingSleep()
    policy = RetryPolicy("backoff", max_attempts=4, base_s=0.1, cap_s=1.0)  # jitter <= 1 s < Retry-After
    async with scripted(status=429, retry_after="3") as fake:
        run = await run_arrivals(fake.url, burst(10), 1.0, retry=policy, timeout_s=60.0, retry_sleep=sleep)
    assert sleep.delays == [3.0] * 30
    assert all(r.retry_delays_s == (3.0, 3.0, 3.0) and r.attempts == 4 for r in run.results)
    assert fake.hits == 40


async def test_backoff_without_retry_after_is_jittered_under_an_exponential_cap() -> None:
    sleep = RecordingSleep()
    policy = RetryPolicy("backoff", max_attempts=5, base_s=0.5, cap_s=2.0)
    async with scripted(status=503) as fake:
        run = await run_arrivals(fake.url, burst(10), 1.0, retry=policy, timeout_s=60.0, retry_sleep=sleep)
    for result in run.results:
        assert len(result.retry_delays_s) == 4
        for k, delay in enumerate(result.retry_delays_s, start=1):
            assert 0.0 <= delay <= min(2.0, 0.5 * 2 ** (k - 1))
    assert len(set(sleep.delays)) == 40  # full jitter: no two clients wait alike
    assert fake.hits == 50


def test_backoff_delay_is_full_jitter_floored_by_retry_after() -> None:
    rng = random.Random(3)
    policy = RetryPolicy("backoff", base_s=0.25, cap_s=4.0)
    for k in range(1, 12):
        assert 0.0 <= policy.delay(k, None, rng) <= min(4.0, 0.25 * 2 ** (k - 1))
        assert policy.delay(k, 0.7, rng) >= 0.7
        assert policy.delay(k, 9.0, rng) == 9.0  # past the cap: the server's word wins
    assert RetryPolicy("immediate").delay(3, 9.0, rng) == 0.0  # the badly-behaved client ignores it


async def test_no_retry_whose_wait_would_end_past_the_client_timeout() -> None:
    sleep = RecordingSleep()
    async with scripted(status=429, retry_after="30") as fake:
        run = await run_arrivals(fake.url, burst(5), 1.0, retry=RetryPolicy("backoff"), timeout_s=10.0,
                                 retry_sleep=sleep)  # fmt: skip
    assert sleep.delays == []
    assert fake.hits == 5
    assert all(r.outcome == "rejected" and r.attempts == 1 for r in run.results)


def test_retry_budget_allows_retries_only_within_ten_percent_of_requests() -> None:
    budget = RetryBudget(0.1)
    granted: list[bool] = []
    for _ in range(35):
        budget.request()
        granted.append(budget.try_spend())
        granted.append(budget.try_spend())  # a second client asking at the same moment
        assert budget.retries <= 0.1 * budget.requests
    assert budget.retries == 3
    # Granted at the 10th, 20th and 30th requests, once each.
    assert [i // 2 + 1 for i, ok in enumerate(granted) if ok] == [10, 20, 30]


async def test_retry_budget_caps_retries_at_ten_percent_of_requests() -> None:
    sleep = RecordingSleep()
    async with scripted(status=429) as fake:
        budgeted = await run_arrivals(fake.url, burst(50), 1.0, retry=RetryPolicy("budget", max_attempts=4),
                                      timeout_s=60.0, retry_sleep=sleep)  # fmt: skip
        hits_budgeted = fake.hits
        unbudgeted = await run_arrivals(fake.url, burst(50), 1.0, retry=RetryPolicy("backoff", max_attempts=4),
                                        timeout_s=60.0, retry_sleep=RecordingSleep())  # fmt: skip
    assert budgeted.retries == 5 == len(sleep.delays)  # 10 % of 50 requests
    assert hits_budgeted == budgeted.arrivals == 55
    assert unbudgeted.retries == 150  # without the budget: 3 retries each
    assert all(r.outcome == "rejected" for r in budgeted.results)


# --- single requests: outcomes, timeouts, the progress hook, CPU --------------------------------------------------


@pytest.mark.parametrize(
    ("behaviour", "outcome", "status"),
    [
        ({"status": 503}, "rejected", 503),
        ({"status": 429, "retry_after": "2"}, "rejected", 429),
        ({"reject_attempts": 0, "then": "500"}, "error", 500),
        ({"reject_attempts": 0, "then": "error_event"}, "error", 200),
        ({"reject_attempts": 0, "then": "never_fits"}, "refused", 400),  # slogate: no wait would help
        ({"reject_attempts": 0, "then": "400"}, "error", 400),  # any other 400 is the client's bug
        ({"reject_attempts": 0}, "ok", 200),
    ],
)
async def test_one_request_classifies_what_came_back(behaviour: dict[str, Any], outcome: str, status: int) -> None:
    async with scripted(**behaviour) as fake, aiohttp.ClientSession() as session:
        result = await one_request(session, fake.url, [7, 8, 9], max_tokens=4, class_name="batch", timeout_s=10.0)
    assert (result.outcome, result.status, result.attempts) == (outcome, status, 1)
    assert (result.ttft_s is not None) == (outcome != "rejected" and status == 200)
    assert len(result.rejection_latencies_s) == (1 if outcome == "rejected" else 0)
    assert result.class_name == "batch"


async def test_client_timeout_abandons_the_request_and_closes_the_connection() -> None:
    async with fake_upstream() as fake, aiohttp.ClientSession() as session:
        fake.mode = "stall"  # one token, then silence
        result = await request_with_retries(session, fake.url, burst(1)[0], timeout_s=0.3)
        await until(lambda: fake.aborted == 1)
        assert fake.aborted == 1  # the server saw the client leave: its generation is abandoned
    assert result.outcome == "timeout"
    assert result.ttft_s is not None  # the first token came before the client gave up


async def test_open_loop_reports_progress_per_request_and_its_own_cpu() -> None:
    finished: list[Result] = []
    ticks: list[int] = []
    async with scripted(status=429, reject_attempts=1) as fake:
        run = await open_loop(fake.url, 200.0, 0.1, preset("uniform", interactive_fraction=0.5), seed=4,
                              tick=lambda: ticks.append(1), progress=finished.append,
                              retry=RetryPolicy("immediate"))  # fmt: skip
    assert len(run.results) == len(schedule(200.0, 0.1, preset("uniform"), seed=4)) > 5
    assert sorted(map(id, finished)) == sorted(map(id, run.results))  # once each, with its result
    assert len(ticks) == len(run.results)
    assert run.count("ok") == len(run.results)
    assert run.arrivals == 2 * len(run.results) == fake.hits
    assert {r.class_name for r in run.results} == {"interactive", "batch"}
    assert run.client_cpu_s > 0
    assert run.client_cpu_per_request_s() == pytest.approx(run.client_cpu_s / run.arrivals)
    summary = run.summary(slo_s=2.0)
    assert summary["requests"] == len(run.results)
    assert summary["arrivals"] == run.arrivals
    assert run.for_class("batch").results == [r for r in run.results if r.class_name == "batch"]


def test_run_statistics() -> None:
    results = [
        Result("ok", 200, 0.5, 1.0),
        Result("ok", 200, 3.0, 4.0, attempts=2, rejection_latencies_s=(0.01,)),
        Result("rejected", 429, None, 0.02, 1.0, attempts=1, rejection_latencies_s=(0.02,)),
        Result("timeout", 0, None, 10.0),
    ]
    run = Run(duration_s=2.0, results=results)
    assert run.count("ok") == 2
    assert run.within(2.0) == [results[0]]
    assert run.goodput(2.0) == 0.5
    assert run.ttft_quantile(0.5) in (0.5, 3.0)
    assert run.rejection_latency_median() == pytest.approx(0.015)
    assert (run.arrivals, run.retries) == (5, 1)
    assert run.rejection_probability() == pytest.approx(2 / 5)
    assert run.predicted_effective_rate() == pytest.approx(2.0 / (1 - 0.4))


def test_retry_after_parsing() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert parse_retry_after("-1") is None
    assert parse_retry_after("nan") is None


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="unknown retry"):
        RetryPolicy("sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy("immediate", max_attempts=0)


# --- workloads and the schedule ------------------------------------------------------------------------------------


def test_the_schedule_depends_on_the_seed_alone() -> None:
    a = schedule(5.0, 60.0, PRESETS["chat"], seed=9)
    assert a == schedule(5.0, 60.0, PRESETS["chat"], seed=9)
    assert a != schedule(5.0, 60.0, PRESETS["chat"], seed=10)
    assert all(0 < x.at_s <= 60.0 for x in a)
    assert [x.at_s for x in a] == sorted(x.at_s for x in a)
    assert 5.0 * 60 * 0.8 < len(a) < 5.0 * 60 * 1.2  # Poisson: about λ T arrivals


def test_a_class_mix_leaves_times_and_sizes_unchanged() -> None:
    plain = schedule(4.0, 100.0, preset("chat"), seed=2)
    mixed = schedule(4.0, 100.0, preset("chat", interactive_fraction=0.3), seed=2)
    strip = [(x.at_s, x.first_token_id, x.prompt_tokens, x.max_tokens) for x in plain]
    assert strip == [(x.at_s, x.first_token_id, x.prompt_tokens, x.max_tokens) for x in mixed]
    assert {x.class_name for x in plain} == {None}
    share = sum(x.class_name == "interactive" for x in mixed) / len(mixed)
    assert 0.25 < share < 0.35
    assert {x.class_name for x in mixed} == {"interactive", "batch"}


def test_presets() -> None:
    uniform = PRESETS["uniform"].draws(200, seed=1)
    assert set(uniform) == {(200, 32)}
    chat = PRESETS["chat"].draws(5000, seed=1)
    prompts = [p for p, _ in chat]
    assert min(prompts) >= 16
    assert max(prompts) <= 1000
    assert 90 < statistics.median(prompts) < 110  # lognormal around 100 tokens
    assert 0.005 < sum(p > 450 for p in prompts) / len(prompts) < 0.03  # a few beyond a 2 s SLO here
    assert {m for _, m in chat} == {32, 64, 128}
    heavy = PRESETS["heavy_tail"].draws(5000, seed=1)
    long_share = sum(p == 1500 for p, _ in heavy) / len(heavy)
    assert 0.04 < long_share < 0.06
    assert all(100 <= p <= 300 for p, _ in heavy if p != 1500)
    with pytest.raises(ValueError, match="unknown workload"):
        preset("bursty")
    with pytest.raises(ValueError, match="interactive fraction"):
        class_mix(1.5)


def test_the_default_workload_is_unchanged() -> None:
    w = Workload()
    assert w.draws(3) == [(200, 32)] * 3
    assert w.class_of(random.Random(0)) is None


# --- the baselines: fair tuning, the token bucket, the count cap ---------------------------------------------------


def test_fair_count_cap_is_littles_law_on_the_slo() -> None:
    # floor(slots x SLO / S): 4 slots, 2 s SLO, 1.6 s per request in a slot -> 5 waiting.
    assert fair_count_cap(4, 2.0, 1.6) == CountCap(concurrency=4, queue=5)
    assert fair_count_cap(4, 1.0, 3.0) == CountCap(4, 1)  # floor(1.33)
    assert fair_count_cap(4, 0.5, 3.0) == CountCap(4, 0)  # SLO shorter than a slot's turn: no queue
    mu = 2.5  # from a capacity: S = slots / μ, so the queue is floor(SLO x μ)
    assert fair_count_cap(4, 2.0, 4 / mu).queue == math.floor(2.0 * mu) == 5
    for bad in ((0, 2.0, 1.0), (4, 0.0, 1.0), (4, 2.0, 0.0)):
        with pytest.raises(ValueError, match="must"):
            fair_count_cap(*bad)
    assert fair_rate_limit(1.7, 4) == RateLimit(rate_rps=1.7, burst=4)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_with_a_fake_clock() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate_rps=2.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]  # starts full: the burst
    assert bucket.take() == pytest.approx(0.5)  # empty: the next token in 1 / rate
    clock.now += 0.2
    assert bucket.take() == pytest.approx(0.3)  # refused takes nothing
    clock.now += 0.3
    assert bucket.take() == 0.0
    assert bucket.take() == pytest.approx(0.5)
    clock.now += 3600  # a long idle refills to the burst, never beyond
    assert [bucket.take() for _ in range(4)][:3] == [0.0, 0.0, 0.0]
    assert bucket.tokens < 1.0


async def test_rate_limit_proxy_answers_429_with_the_time_to_the_next_token() -> None:
    clock = FakeClock()
    async with (
        fake_upstream() as fake,
        serving(RateLimitProxy(RateLimit(0.5, 2), clock=clock), fake.url) as url,
        aiohttp.ClientSession() as session,
    ):
        statuses = []
        for _ in range(3):
            async with session.post(url + "/completion", json={"prompt": [1, 2], "stream": True}) as r:
                statuses.append(r.status)
                body = await r.text()
        assert statuses == [200, 200, 429]
        assert r.headers["Retry-After"] == "2"
        assert json.loads(body)["retryAfterSeconds"] == 2.0
        clock.now += 1.25
        async with session.post(url + "/completion", json={"prompt": [1]}) as r:
            assert (r.status, r.headers["Retry-After"]) == (429, "1")  # 0.75 s, in whole seconds
        clock.now += 0.75
        async with session.post(url + "/completion", json={"prompt": [1], "stream": True}) as r:
            assert r.status == 200
            assert '"stop": true' in await r.text()  # the stream passed through
        assert fake.started == 3


async def post_and_read(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.post(url + "/completion", json={"prompt": [1, 2, 3], "stream": True}) as r:
        return r.status, await r.text()


async def test_count_cap_returns_503_exactly_when_concurrency_and_queue_are_full() -> None:
    proxy = CountCapProxy(CountCap(concurrency=2, queue=1))
    async with fake_upstream() as fake, serving(proxy, fake.url) as url, aiohttp.ClientSession() as session:
        fake.mode = "stall"
        running = [asyncio.create_task(post_and_read(session, url)) for _ in range(2)]
        await until(lambda: fake.started == 2)
        assert (proxy.limiter.active, proxy.limiter.waiting) == (2, 0)
        queued = asyncio.create_task(post_and_read(session, url))
        await until(lambda: proxy.limiter.waiting == 1)
        assert fake.started == 2  # queued, not forwarded
        status, body = await post_and_read(session, url)  # concurrency and queue both full
        assert status == 503
        assert json.loads(body)["error"]["code"] == "queue_full"
        assert proxy.rejected == 1

        fake.stall_forever.set()  # the streams finish; the queued request gets its slot
        done = await asyncio.gather(*running, queued)
        assert [s for s, _ in done] == [200, 200, 200]
        assert all('"stop": true' in text for _, text in done)
        assert fake.started == 3
        assert await post_and_read(session, url) == (200, done[0][1])  # room again
        assert (proxy.forwarded, proxy.rejected, proxy.limiter.peak_active) == (4, 1, 2)
        assert (proxy.limiter.active, proxy.limiter.waiting) == (0, 0)


async def test_count_cap_frees_the_slot_and_aborts_upstream_when_clients_leave() -> None:
    proxy = CountCapProxy(CountCap(concurrency=1, queue=1))
    async with fake_upstream() as fake, serving(proxy, fake.url) as url, aiohttp.ClientSession() as session:
        fake.mode = "stall"
        in_flight = asyncio.create_task(post_and_read(session, url))
        await until(lambda: fake.started == 1)
        waiting = asyncio.create_task(post_and_read(session, url))
        await until(lambda: proxy.limiter.waiting == 1)
        waiting.cancel()  # leaves the queue
        await until(lambda: proxy.limiter.waiting == 0)
        assert proxy.limiter.waiting == 0
        in_flight.cancel()  # leaves mid-stream: the proxy closes its upstream request
        await until(lambda: fake.aborted == 1 and proxy.limiter.active == 0)
        assert (fake.aborted, proxy.limiter.active) == (1, 0)
        fake.mode = "ok"
        assert (await post_and_read(session, url))[0] == 200
        assert fake.started == 2  # the cancelled waiter never reached the upstream


async def test_fifo_limiter_serves_in_arrival_order() -> None:
    limiter = FifoLimiter(max_concurrency=1, max_queue=3)
    assert await limiter.enter()
    order: list[int] = []

    async def wait_turn(i: int) -> None:
        assert await limiter.enter()
        order.append(i)
        limiter.leave()

    waiters = [asyncio.create_task(wait_turn(i)) for i in range(3)]
    await until(lambda: limiter.waiting == 3)
    assert not await limiter.enter()  # full
    limiter.leave()
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2]
    assert (limiter.active, limiter.waiting, limiter.peak_active) == (0, 0, 1)
