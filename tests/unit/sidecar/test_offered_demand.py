"""Offered demand and capacity on the sidecar's /metrics: what the autoscaling query reads.

Through the sidecar's HTTP interface (a fake llama-server that holds its generations, so a
test can fill the slots and be refused): every arrival the gate decides on is counted once,
as a first try (``slogate_offered_*``) or as a retry (``slogate_retried_requests_total``),
never both, so the two add up to ``slogate_requests_total``; requests the sidecar refuses
undecided (malformed, draining) are not demand. A try is a retry when a header says so or
when its key was refused here within the Retry-After sent (plus grace). The capacity
gauges are absent before thresholds load and equal ``demand.reference_capacity`` after.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from canned_profiles import smollm2_profile
from held_upstream import HeldUpstream, held_upstream
from project_files import ROOT
from sidecar_harness import RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_admission.decision import GateConfig
from slogate_admission.demand import RETRY_GRACE_S, Attempt, offered_work_s, reference_capacity
from slogate_admission.schema import Thresholds
from slogate_llama.routes import Route
from slogate_sidecar import responses
from slogate_sidecar.drain import DrainCause
from slogate_sidecar.metrics import CAPACITY_PROMPT_TOKENS, CAPACITY_REQUESTS, SidecarMetrics
from slogate_sidecar.offered_demand import MAX_KEY_CHARS, DemandMeter, attempt_of
from slogate_sidecar.prompt_tokens import estimate_prompt_tokens
from slogate_sidecar.requests import parse_request

QUIET = {"poll_interval_s": 3600.0, "upstream_read_timeout_s": 10.0}
"""One upstream poll at start, then none."""
TOKENS = {"prompt": [1] * 50, "n_predict": 4}
"""A prompt of 50 counted tokens: the gate knows its size without /tokenize."""
COUNTERS = ("slogate_offered_requests_total", "slogate_offered_prompt_tokens_total", "slogate_retried_requests_total")


# ---------------------------------------------------------------- what a try says of itself


@pytest.mark.parametrize(
    ("headers", "retry_count"),
    [
        ({}, None),
        ({"x-stainless-retry-count": "0"}, 0),
        ({"x-stainless-retry-count": "2"}, 2),
        ({"x-envoy-attempt-count": "1"}, 0),  # Envoy counts attempts from 1
        ({"x-envoy-attempt-count": "3"}, 2),
        ({"x-envoy-attempt-count": "0"}, None),  # no attempt 0: not a count
        ({"x-slogate-retry-count": "1"}, 1),
        ({"x-slogate-retry-count": " 1 "}, 1),
        ({"x-stainless-retry-count": "0", "x-envoy-attempt-count": "2"}, 1),  # any header saying retry wins
        # Unreadable values are ignored, whatever int() would make of them.
        ({"x-stainless-retry-count": "abc"}, None),
        ({"x-stainless-retry-count": "-1"}, None),
        ({"x-stainless-retry-count": "+1"}, None),
        ({"x-stainless-retry-count": "1.0"}, None),
        ({"x-stainless-retry-count": "1_0"}, None),
        ({"x-stainless-retry-count": "\u0661"}, None),  # an Arabic-Indic 1
        ({"x-stainless-retry-count": ""}, None),
        ({"x-stainless-retry-count": "1234567"}, None),
        ({"x-stainless-retry-count": "nope", "x-slogate-retry-count": "1"}, 1),
    ],
)
def test_the_retry_count_is_read_from_the_headers_that_number_tries(
    headers: dict[str, str], retry_count: int | None
) -> None:
    assert attempt_of(headers).retry_count == retry_count


def test_the_key_is_the_idempotency_key_else_the_request_id_and_a_long_one_is_hashed() -> None:
    assert attempt_of({}).key is None
    assert attempt_of({"idempotency-key": "  ", "x-request-id": ""}).key is None
    assert attempt_of({"x-request-id": "r-1"}).key == "x-request-id:r-1"
    both = attempt_of({"idempotency-key": "k-1", "x-request-id": "r-1"})
    assert both.key == "idempotency-key:k-1"
    # One key string in two headers names two requests.
    assert attempt_of({"idempotency-key": "same"}).key != attempt_of({"x-request-id": "same"}).key
    long = "k" * (MAX_KEY_CHARS + 1)
    hashed = attempt_of({"idempotency-key": long}).key
    assert hashed is not None
    assert long not in hashed
    assert len(hashed) < MAX_KEY_CHARS
    assert attempt_of({"idempotency-key": long}).key == hashed
    assert attempt_of({"idempotency-key": long + "x"}).key != hashed
    # Undecodable header bytes (aiohttp keeps them as surrogates) are a key like any other.
    odd = "\udcff" * (MAX_KEY_CHARS + 1)
    assert attempt_of({"idempotency-key": odd}).key is not None


def refusal(retry_after: str | None, status: int = 429) -> web.Response:
    """A shed as the sidecar marks it (``responses.shed``), with or without its Retry-After."""
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return responses.shed(web.json_response({"error": {}}, status=status, headers=headers))


def test_a_refused_key_is_a_retry_until_its_retry_after_and_the_grace_are_over() -> None:
    meter = DemandMeter(SidecarMetrics())
    first = Attempt(key="idempotency-key:k")
    meter.answered(first, refusal("3"), now=100.0)
    assert meter.is_retry(first, now=100.0 + 3 + RETRY_GRACE_S - 0.01)
    assert not meter.is_retry(first, now=100.0 + 3 + RETRY_GRACE_S + 0.01)
    assert not meter.is_retry(Attempt(key="idempotency-key:other"), now=101.0)


def test_only_sheds_with_a_retry_after_are_remembered_whatever_their_status() -> None:
    """A shed is remembered by what it is, not by its status: 503 is also "llama-server down"
    (``not_ready``, with its own Retry-After), which brings no retry of a shed request."""
    meter = DemandMeter(SidecarMetrics())
    for status in (200, 400, 429, 503):
        meter.answered(Attempt(key=f"k{status}"), web.json_response({}, status=status), now=0.0)
    meter.answered(Attempt(key="not-ready"), responses.not_ready("upstream down"), now=0.0)
    meter.answered(Attempt(key="no-header"), refusal(None), now=0.0)
    meter.answered(Attempt(key="bad-header"), refusal("soon"), now=0.0)
    meter.answered(Attempt(key="draining"), responses.draining(), now=0.0)
    meter.answered(Attempt(key="draining-529"), responses.draining(529), now=0.0)
    meter.answered(Attempt(key="shed-503"), refusal("2", status=503), now=0.0)
    assert len(meter.book.memory) == 3
    assert meter.is_retry(Attempt(key="draining"), now=1.0 + RETRY_GRACE_S - 0.01)
    assert meter.is_retry(Attempt(key="draining-529"), now=1.0)
    assert meter.is_retry(Attempt(key="shed-503"), now=2.0)
    assert not meter.is_retry(Attempt(key="not-ready"), now=0.5)


# ---------------------------------------------------------------- through the sidecar


def policy(cap: int = 4, max_wait: float = 0.0) -> Thresholds:
    return thresholds_for(
        smollm2_profile(), slo={"ttftSeconds": 2.0}, concurrency={"max": cap}, deferral={"maxWaitSeconds": max_wait}
    )


async def scrape(gate: RunningSidecar) -> dict[str, float]:
    """Every sample of the admin /metrics, summed over labels (``slogate_requests_total`` whole)."""
    async with gate.session.get(gate.admin_url + "/metrics") as response:
        text = await response.text()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


async def demand(gate: RunningSidecar) -> tuple[float, float, float]:
    """(offered requests, offered prompt tokens, retried requests), checked to add up to the arrivals."""
    found = await scrape(gate)
    offered, tokens, retried = (found[name] for name in COUNTERS)
    assert offered + retried == found.get("slogate_requests_total", 0.0)
    return offered, tokens, retried


async def ask(gate: RunningSidecar, body: Any, headers: dict[str, str] | None = None) -> tuple[int, str | None]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    async with gate.session.post(gate.url + "/completion", data=data, headers=sent) as response:
        await response.read()
        return response.status, response.headers.get("Retry-After")


async def hold(gate: RunningSidecar, fake: HeldUpstream) -> asyncio.Task[tuple[int, str | None]]:
    """One generation admitted and held upstream, filling a slot."""
    started = fake.started
    task = asyncio.create_task(ask(gate, {**TOKENS, "stream": True}))
    for _ in range(200):
        if fake.started > started or task.done():
            break
        await asyncio.sleep(0.05)
    assert fake.started == started + 1, "the request to hold was not admitted"
    return task


async def test_capacity_is_absent_before_thresholds_and_follows_every_push(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, None, **QUIET) as gate:
        before = await scrape(gate)
        assert CAPACITY_REQUESTS not in before
        assert CAPACITY_PROMPT_TOKENS not in before
        assert before["slogate_offered_requests_total"] == 0.0  # the counters exist from the start
        for thresholds in (policy(cap=4), policy(cap=1)):
            assert (await gate.push(thresholds.model_dump_json(by_alias=True))).status == 200
            expected = reference_capacity(thresholds)
            found = await scrape(gate)
            assert found[CAPACITY_REQUESTS] == pytest.approx(expected.requests_per_second, rel=1e-12)
            assert found[CAPACITY_PROMPT_TOKENS] == pytest.approx(expected.prompt_tokens_per_second, rel=1e-12)
        assert policy(cap=4).throughput_rps != policy(cap=1).throughput_rps  # the push moved it
        assert fake.generations == 0


async def test_first_tries_are_counted_with_their_prompt_tokens_and_malformed_requests_are_not(
    tmp_path: Path,
) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, policy(), **QUIET) as gate:
        fake.release()
        for _ in range(3):
            assert (await ask(gate, TOKENS))[0] == 200
        assert await demand(gate) == (3, 150, 0)
        # Not demand for the model: a body that is not JSON, a batch of prompts.
        assert (await ask(gate, b"{not json"))[0] == 400
        assert (await ask(gate, {"prompt": [[1, 2], [3, 4]], "n_predict": 4}))[0] == 400
        # Demand, though it can never be served: a prompt beyond any slot's context.
        too_large = {"prompt": [1] * (policy().per_request_max_tokens + 1), "n_predict": 4}
        status, _ = await ask(gate, too_large)
        assert status == 400
        assert await demand(gate) == (4, 150 + policy().per_request_max_tokens + 1, 0)


async def test_the_work_of_first_tries_is_priced_on_the_thresholds_in_force_and_retries_add_none(
    tmp_path: Path,
) -> None:
    """slogate_offered_work_seconds_total, the autoscaling query's series: Σ demand.offered_work_s
    of the first tries, each on the thresholds in force when the gate decided (a push re-prices)."""
    small, long = {"prompt": [1] * 50, "n_predict": 4}, {"prompt": [1] * 400, "n_predict": 64}
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, policy(cap=4), **QUIET) as gate:
        fake.release()
        four = GateConfig.from_thresholds(policy(cap=4))
        for body in (small, long, small):
            assert (await ask(gate, body))[0] == 200
        assert (await ask(gate, long, {"x-stainless-retry-count": "1"}))[0] == 200  # a retry: no work
        expected = 2 * offered_work_s(four, 50, 4) + offered_work_s(four, 400, 64)
        assert (await scrape(gate))["slogate_offered_work_seconds_total"] == pytest.approx(expected, rel=1e-9)
        assert (await gate.push(policy(cap=1).model_dump_json(by_alias=True))).status == 200
        assert (await ask(gate, long))[0] == 200
        one = GateConfig.from_thresholds(policy(cap=1))
        assert offered_work_s(one, 400, 64) != offered_work_s(four, 400, 64)  # one stream decodes alone
        expected += offered_work_s(one, 400, 64)
        assert (await scrape(gate))["slogate_offered_work_seconds_total"] == pytest.approx(expected, rel=1e-9)


async def test_retries_said_by_a_header_are_counted_apart_and_a_bad_header_is_ignored(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, policy(), **QUIET) as gate:
        fake.release()
        retries = (
            {"x-stainless-retry-count": "1"},
            {"x-envoy-attempt-count": "2"},
            {"x-slogate-retry-count": "3"},
        )
        first_tries = (
            {"x-stainless-retry-count": "0"},
            {"x-envoy-attempt-count": "1"},
            {"x-stainless-retry-count": "one"},
            {"x-envoy-attempt-count": "-7"},
        )
        for headers in (*retries, *first_tries):
            assert (await ask(gate, TOKENS, headers))[0] == 200, headers
        assert await demand(gate) == (len(first_tries), 50 * len(first_tries), len(retries))


async def test_a_key_refused_here_is_a_retry_when_it_comes_back_and_only_that_key(tmp_path: Path) -> None:
    async with (
        held_upstream() as fake,
        sidecar_in_front_of(fake.url, tmp_path, policy(cap=1, max_wait=0.0), **QUIET) as gate,
    ):
        held = await hold(gate, fake)  # the one slot is taken: every arrival is refused
        status, retry_after = await ask(gate, TOKENS, {"Idempotency-Key": "k-1"})
        assert status == 429
        assert retry_after is not None
        # Its retries (refused again): the same key, with no retry header; the X-Request-Id
        # of a client that sends no idempotency key works alike.
        assert (await ask(gate, TOKENS, {"Idempotency-Key": "k-1"}))[0] == 429
        assert (await ask(gate, TOKENS, {"X-Request-Id": "r-1"}))[0] == 429
        assert (await ask(gate, TOKENS, {"X-Request-Id": "r-1"}))[0] == 429
        # Another key, and a request with none, are first tries.
        assert (await ask(gate, TOKENS, {"Idempotency-Key": "k-2"}))[0] == 429
        assert (await ask(gate, TOKENS))[0] == 429
        # held, k-1, r-1, k-2, keyless: five first tries; the two comebacks are retries.
        assert await demand(gate) == (5, 250, 2)
        fake.release()
        assert (await held)[0] == 200
        # Admitted now, the retry of k-1 is still a retry; an admitted key is never remembered.
        assert (await ask(gate, TOKENS, {"Idempotency-Key": "k-1"}))[0] == 200
        assert (await ask(gate, TOKENS, {"Idempotency-Key": "fresh"}))[0] == 200
        assert (await ask(gate, TOKENS, {"Idempotency-Key": "fresh"}))[0] == 200
        assert await demand(gate) == (7, 350, 3)


async def test_a_refusal_before_counting_counts_the_estimate_and_a_draining_refusal_nothing(
    tmp_path: Path,
) -> None:
    thresholds = policy(cap=1, max_wait=0.0)
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, thresholds, **QUIET) as gate:
        held = await hold(gate, fake)
        text = {"prompt": "a text prompt, refused before llama-server counts it", "n_predict": 4}
        tokenized = fake.calls["/tokenize"]
        assert (await ask(gate, text))[0] == 429
        assert fake.calls["/tokenize"] == tokenized  # the zero-token pre-check refused it
        parsed = parse_request(
            Route.NATIVE, json.dumps(text).encode(), max_body_bytes=1 << 20, max_output_tokens=1 << 20
        )
        assert thresholds.tokens_per_char is not None
        estimate = estimate_prompt_tokens(parsed, thresholds.tokens_per_char)
        assert await demand(gate) == (2, 50 + estimate, 0)

        gate.sidecar.gate.begin_drain(DrainCause.HOOK)
        for body in (TOKENS, text):
            assert (await ask(gate, body, {"Idempotency-Key": "k-drained"}))[0] == 429
        assert await demand(gate) == (2, 50 + estimate, 0)  # the balancer sends those on: not demand here
        assert gate.sidecar.demand.is_retry(Attempt(key="idempotency-key:k-drained"), gate.sidecar.gate.clock())
        fake.release()
        assert (await held)[0] == 200


def test_docs_metrics_names_every_series_the_autoscaling_query_reads() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    for name in (*COUNTERS, CAPACITY_REQUESTS, CAPACITY_PROMPT_TOKENS):
        assert f"| `{name}` |" in text, name
