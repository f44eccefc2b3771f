"""An open-loop load generator: Poisson arrivals that never wait for completions.

Closed loops hide overload (a slow server slows its own clients down); real users
keep arriving. Each request streams, so the client measures its TTFT; a client
timeout abandons it (closing the connection, as an impatient user does).

The arrival schedule (times, prompt sizes, output limits, classes) is drawn up front
from the seed alone, so two systems driven with the same seed and workload see the
very same traffic, whatever their clients' retry behaviour. Retries are made by the
client on 429 and 503 (the rejections of slogate and of the baselines); every attempt
is an arrival at the server, so ``Run.arrivals`` against ``len(Run.results)`` shows
the retry amplification λ_eff / λ, to compare with 1 / (1 − p).

All times are seconds from the request's *first* attempt: a request retried into
success has the TTFT its user saw, backoff included.

Behind the fleet's balancer (``balancer``: nginx, which retries sheds itself), each answer
names the pods nginx tried (``TRIED_HEADER``); a Result keeps it, so ``Result.tries`` counts
nginx's tries of the request's last attempt and ``Result.answered_by`` names the pod that answered.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import aiohttp

from slogate_bench.live.balancer import TRIED_HEADER
from slogate_bench.live.retries import NO_RETRY, RetryBudget, RetryPolicy, parse_retry_after
from slogate_bench.results import NEVER_FITS_CODE, REJECTION_STATUSES, Outcome, Result, Run
from slogate_sim.workloads import Arrival, Workload, schedule

PREDICTED_TTFT_HEADER = "X-Slogate-Predicted-Ttft"
"""slogate's median TTFT prediction, seconds, on every forwarded response."""

Sleep = Callable[[float], Awaitable[None]]
Progress = Callable[["Result"], None]


@dataclass(frozen=True, slots=True)
class _Attempt:
    outcome: Outcome
    status: int
    first_token_at: float | None
    ended_at: float
    retry_after_s: float | None = None
    predicted_ttft_s: float | None = None
    upstreams: str | None = None

    def result(
        self,
        started: float,
        *,
        attempts: int = 1,
        rejections: tuple[float, ...] = (),
        delays: tuple[float, ...] = (),
        class_name: str | None,
        prompt_tokens: int,
        max_tokens: int,
        tenant: str | None = None,
    ) -> Result:
        """The request's fate, this its last attempt, in seconds from its first (``started``)."""
        return Result(
            self.outcome,
            self.status,
            None if self.first_token_at is None else self.first_token_at - started,
            self.ended_at - started,
            self.retry_after_s,
            attempts,
            rejections,
            delays,
            class_name,
            prompt_tokens,
            max_tokens,
            self.predicted_ttft_s,
            upstreams=self.upstreams,
            tenant=tenant,
        )


def _body(prompt: list[int], max_tokens: int) -> dict[str, object]:
    return {"prompt": prompt, "n_predict": max_tokens, "stream": True, "cache_prompt": False, "ignore_eos": True}


async def _attempt(
    session: aiohttp.ClientSession, url: str, body: dict[str, object], headers: dict[str, str], deadline: float
) -> _Attempt:
    """One POST of a streaming native completion, abandoned at ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    first: float | None = None
    predicted: str | None = None
    tried: str | None = None  # read with the headers, so a stream cut short still says where it ran
    try:
        async with asyncio.timeout_at(deadline):
            async with session.post(url + "/completion", json=body, headers=headers) as response:
                tried = response.headers.get(TRIED_HEADER)
                if response.status in REJECTION_STATUSES:
                    await response.read()
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
                    return _Attempt("rejected", response.status, None, loop.time(), retry_after, upstreams=tried)
                predicted = response.headers.get(PREDICTED_TTFT_HEADER)
                if response.status != 200:
                    payload = await response.read()
                    refused = response.status == 400 and NEVER_FITS_CODE in payload
                    outcome: Outcome = "refused" if refused else "error"
                    return _Attempt(outcome, response.status, None, loop.time(), upstreams=tried)
                async for line in response.content:
                    if not line.startswith(b"data: "):
                        continue
                    # Parse only until the first token, plus any error event: the client's CPU is measured.
                    if first is None or b'"error"' in line:
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            return _Attempt("error", 200, first, loop.time(), upstreams=tried)
                        if first is None and chunk.get("content"):
                            first = loop.time()
    except TimeoutError:
        return _Attempt("timeout", 0, first, loop.time(), upstreams=tried)
    except (aiohttp.ClientError, ValueError):
        return _Attempt("error", 0, first, loop.time(), upstreams=tried)
    return _Attempt("ok", 200, first, loop.time(), None, float(predicted) if predicted else None, tried)


async def request_with_retries(
    session: aiohttp.ClientSession,
    url: str,
    arrival: Arrival,
    *,
    timeout_s: float = 10.0,
    policy: RetryPolicy = NO_RETRY,
    budget: RetryBudget | None = None,
    rng: random.Random | None = None,
    sleep: Sleep = asyncio.sleep,
) -> Result:
    """Send one request, retrying rejections per ``policy``, within ``timeout_s`` in all.

    The timeout covers the whole request, backoff included (a user's patience): a
    retry whose delay would end past it is not made, and the request stays rejected.
    """
    loop = asyncio.get_running_loop()
    rng = rng or random.Random(0)
    budget = budget if budget is not None else RetryBudget(policy.budget_ratio)
    budget.request()
    body = _body(arrival.prompt(), arrival.max_tokens)
    headers = arrival.headers()
    started = loop.time()
    deadline = started + timeout_s
    rejections: list[float] = []
    delays: list[float] = []
    attempts = 0
    while True:
        attempts += 1
        sent = loop.time()
        done = await _attempt(session, url, body, headers, deadline)
        if done.outcome == "rejected":
            rejections.append(done.ended_at - sent)
        if done.outcome == "rejected" and policy.kind != "none" and attempts < policy.max_attempts:
            delay = policy.delay(attempts, done.retry_after_s, rng)
            if loop.time() + delay < deadline and (policy.kind != "budget" or budget.try_spend()):
                delays.append(delay)
                await sleep(delay)
                continue
        return done.result(
            started,
            attempts=attempts,
            rejections=tuple(rejections),
            delays=tuple(delays),
            class_name=arrival.class_name,
            prompt_tokens=arrival.prompt_tokens,
            max_tokens=arrival.max_tokens,
            tenant=arrival.tenant,
        )


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    prompt: list[int],
    *,
    max_tokens: int,
    class_name: str | None,
    timeout_s: float,
) -> Result:
    """POST a streaming native completion once; classify what came back (429 and 503: rejected).

    Give it a session whose connector has ``force_close=True`` when requests follow each other
    to llama-server: it closes a connection after a streamed response, so a reused one can fail.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    headers = {"X-Slogate-Class": class_name} if class_name else {}
    done = await _attempt(session, url, _body(prompt, max_tokens), headers, started + timeout_s)
    rejections = (done.ended_at - started,) if done.outcome == "rejected" else ()
    return done.result(
        started, rejections=rejections, class_name=class_name, prompt_tokens=len(prompt), max_tokens=max_tokens
    )


async def run_arrivals(
    url: str,
    arrivals: list[Arrival],
    duration_s: float,
    *,
    seed: int = 1,
    timeout_s: float = 10.0,
    retry: RetryPolicy = NO_RETRY,
    progress: Progress | None = None,
    retry_sleep: Sleep = asyncio.sleep,
) -> Run:
    """Send each arrival at its time, never waiting for earlier ones; wait for every request to end."""
    loop = asyncio.get_running_loop()
    rng = random.Random(f"{seed}/retries")  # jitter: apart from the schedule, which stays the same
    budget = RetryBudget(retry.budget_ratio)
    run = Run(duration_s=duration_s)
    cpu_before = time.process_time()
    # No client-side queue (limit=0), and a fresh connection per attempt, as independent users have:
    # llama-server closes a connection after a streamed response, so an immediate reuse fails.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def one(arrival: Arrival, lag_s: float) -> Result:
            result = await request_with_retries(
                session, url, arrival, timeout_s=timeout_s, policy=retry, budget=budget, rng=rng, sleep=retry_sleep
            )
            result = replace(result, lag_s=lag_s)
            if progress is not None:
                progress(result)
            return result

        tasks: list[asyncio.Task[Result]] = []
        start = loop.time()
        for arrival in arrivals:
            wait = start + arrival.at_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(arrival, max(0.0, -wait))))
        run.results = list(await asyncio.gather(*tasks))
        run.wall_s = loop.time() - start
    run.client_cpu_s = time.process_time() - cpu_before
    return run


async def open_loop(
    url: str,
    rate_rps: float,
    duration_s: float,
    workload: Workload,
    *,
    seed: int = 1,
    tick: Callable[[], None] | None = None,
    retry: RetryPolicy = NO_RETRY,
    progress: Progress | None = None,
    retry_sleep: Sleep = asyncio.sleep,
) -> Run:
    """Poisson arrivals at ``rate_rps`` for ``duration_s``; waits for every request to end.

    Each client is as patient as the workload says. ``progress`` is called with each
    finished request's Result (``tick``, without it).
    """

    def finished(result: Result) -> None:
        if tick is not None:
            tick()
        if progress is not None:
            progress(result)

    arrivals = schedule(rate_rps, duration_s, workload, seed=seed)
    return await run_arrivals(
        url,
        arrivals,
        duration_s,
        seed=seed,
        timeout_s=workload.client_timeout_s,
        retry=retry,
        progress=finished,
        retry_sleep=retry_sleep,
    )
