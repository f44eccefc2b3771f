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
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import aiohttp

from slogate_bench.balancer import TRIED_HEADER, tries_of, upstreams_of
from slogate_bench.retries import NO_RETRY, RetryBudget, RetryPolicy, parse_retry_after
from slogate_bench.workloads import Arrival, Workload, schedule

Outcome = Literal["ok", "rejected", "refused", "timeout", "error"]
"""refused: slogate's 400 for a request that can never meet its SLO (own prefill beyond it, or
beyond a slot's context): an instant, deliberate no that no retry can change; not an error."""
REJECTION_STATUSES = frozenset({429, 503})
"""Load shedding: slogate's 429 (and 503 when it cannot decide), the count cap's 503."""
NEVER_FITS_CODE = b'"slogate_request_too_large"'
"""The error code of slogate's 400 for a request no wait can serve within its SLO."""
PREDICTED_TTFT_HEADER = "X-Slogate-Predicted-Ttft"
"""slogate's median TTFT prediction, seconds, on every forwarded response."""

Sleep = Callable[[float], Awaitable[None]]
Progress = Callable[["Result"], None]


@dataclass(frozen=True, slots=True)
class Result:
    """One request's fate, seen from the client (after all its attempts)."""

    outcome: Outcome
    status: int
    ttft_s: float | None
    """Client-side time to the first generated token (None unless it came)."""
    total_s: float
    retry_after_s: float | None = None
    """The last rejection's Retry-After, if it had one."""
    attempts: int = 1
    rejection_latencies_s: tuple[float, ...] = ()
    """Per rejected attempt: the time from sending it to its 429/503."""
    retry_delays_s: tuple[float, ...] = ()
    """The delays the client waited before each retry."""
    class_name: str | None = None
    prompt_tokens: int = 0
    max_tokens: int = 0
    predicted_ttft_s: float | None = None
    """slogate's median TTFT prediction for it (its ``X-Slogate-Predicted-Ttft``), if it said one."""
    lag_s: float = 0.0
    """How late the generator sent the first attempt against the schedule (its own overload)."""
    upstreams: str | None = None
    """The balancer's ``TRIED_HEADER`` on the last attempt's answer: the pods nginx tried, in order
    (None: no balancer, or no answer's headers came before the client gave up)."""
    tenant: str | None = None
    """The tenant it was sent for (``Arrival.tenant``)."""

    @property
    def tries(self) -> int:
        """Pods the balancer tried for the last attempt (0: unknown, no ``TRIED_HEADER`` seen)."""
        return tries_of(self.upstreams)

    @property
    def answered_by(self) -> str | None:
        """The pod (``host:port``) whose answer the client got: the last one nginx tried."""
        tried = upstreams_of(self.upstreams)
        return tried[-1] if tried else None


@dataclass(frozen=True, slots=True)
class _Attempt:
    outcome: Outcome
    status: int
    first_token_at: float | None
    ended_at: float
    retry_after_s: float | None = None
    predicted_ttft_s: float | None = None
    upstreams: str | None = None


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
        return Result(
            done.outcome,
            done.status,
            None if done.first_token_at is None else done.first_token_at - started,
            done.ended_at - started,
            done.retry_after_s,
            attempts,
            tuple(rejections),
            tuple(delays),
            arrival.class_name,
            arrival.prompt_tokens,
            arrival.max_tokens,
            done.predicted_ttft_s,
            upstreams=done.upstreams,
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
    return Result(
        done.outcome,
        done.status,
        None if done.first_token_at is None else done.first_token_at - started,
        done.ended_at - started,
        done.retry_after_s,
        1,
        (done.ended_at - started,) if done.outcome == "rejected" else (),
        (),
        class_name,
        len(prompt),
        max_tokens,
        upstreams=done.upstreams,
    )


@dataclass(slots=True)
class Run:
    """All results of one load run."""

    duration_s: float
    results: list[Result] = field(default_factory=list)
    client_cpu_s: float = 0.0
    """The load generator's CPU seconds over the run (time.process_time(): the whole process,
    so anything else served in-process, a proxy for instance, is counted too)."""
    wall_s: float = 0.0
    """From the first arrival to the last request's end."""

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)

    def for_class(self, class_name: str | None) -> Run:
        """The same run restricted to one class (CPU not apportioned: kept whole)."""
        return Run(
            self.duration_s, [r for r in self.results if r.class_name == class_name], self.client_cpu_s, self.wall_s
        )

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

    def time_in_system_mean(self) -> float | None:
        """Mean seconds from sending to the last token, over completed requests (Little's W,
        censored: requests whose clients gave up are not in it)."""
        values = [r.total_s for r in self.results if r.outcome == "ok"]
        return statistics.fmean(values) if values else None

    def rejection_latency_median(self) -> float | None:
        """Median time from sending an attempt to its 429/503, over every rejected attempt."""
        values = [s for r in self.results for s in r.rejection_latencies_s]
        return statistics.median(values) if values else None

    @property
    def arrivals(self) -> int:
        """Attempts that reached the server: first attempts plus retries."""
        return sum(r.attempts for r in self.results)

    @property
    def retries(self) -> int:
        return self.arrivals - len(self.results)

    def offered_rate(self) -> float:
        """λ: requests (first attempts) per second."""
        return len(self.results) / self.duration_s

    def effective_rate(self) -> float:
        """λ_eff: attempts (retries included) per second."""
        return self.arrivals / self.duration_s

    def rejection_probability(self) -> float:
        """p: the fraction of attempts answered 429/503."""
        rejected = sum(len(r.rejection_latencies_s) for r in self.results)
        return rejected / self.arrivals if self.arrivals else 0.0

    def predicted_effective_rate(self, max_attempts: int | None = None) -> float:
        """λ / (1 − p) for unbounded retries; λ (1 − p^N) / (1 − p) with N attempts at most."""
        p = self.rejection_probability()
        if max_attempts is not None:
            return self.offered_rate() * (max_attempts if p == 1.0 else (1 - p**max_attempts) / (1 - p))
        return math.inf if p == 1.0 else self.offered_rate() / (1 - p)

    def client_cpu_per_request_s(self) -> float:
        """The generator's CPU seconds per attempt sent."""
        return self.client_cpu_s / self.arrivals if self.arrivals else 0.0

    def client_cpu_share(self) -> float:
        """The generator's CPU as a fraction of one core over the run's wall time."""
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def max_lag_s(self) -> float:
        return max((r.lag_s for r in self.results), default=0.0)

    def summary(self, slo_s: float) -> dict[str, float | int | None]:
        """The numbers a benchmark table shows, by name."""
        return {
            "requests": len(self.results),
            "arrivals": self.arrivals,
            "ok": self.count("ok"),
            "within_slo": len(self.within(slo_s)),
            "rejected": self.count("rejected"),
            "refused": self.count("refused"),
            "timeout": self.count("timeout"),
            "error": self.count("error"),
            "goodput_rps": self.goodput(slo_s),
            "ttft_p50_s": self.ttft_quantile(0.5),
            "ttft_p99_s": self.ttft_quantile(0.99),
            "time_in_system_mean_s": self.time_in_system_mean(),
            "rejection_latency_p50_s": self.rejection_latency_median(),
            "offered_rps": self.offered_rate(),
            "effective_rps": self.effective_rate(),
            "rejection_probability": self.rejection_probability(),
            "client_cpu_per_request_s": self.client_cpu_per_request_s(),
            "client_cpu_share": self.client_cpu_share(),
            "max_lag_s": self.max_lag_s(),
        }


OUTCOME_COLUMNS = ("within SLO", "served late", "rejected", "refused", "timed out", "errors")
"""What became of the requests sent, one column per fate: every results table shows them all,
so each row adds up to its `sent`."""


def outcome_counts(run: Mapping[str, Any]) -> list[int]:
    """A run's counts (``Run.summary``, or a published row of it) in OUTCOME_COLUMNS order;
    ValueError unless they add up to its requests sent."""
    counts = [
        run["within_slo"],
        run["ok"] - run["within_slo"],  # completed, first token after the SLO
        run["rejected"],
        run.get("refused", 0),  # runs older than slogate's 400 have none
        run["timeout"],
        run["error"],
    ]
    if sum(counts) != run["requests"]:
        label = " ".join(str(run[k]) for k in ("scenario", "workload", "retry") if k in run) or "a run"
        at = f" at {run['load']:g}x" if "load" in run else ""
        raise ValueError(f"{label}{at}: {' + '.join(map(str, counts))} != {run['requests']} sent")
    return counts


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
