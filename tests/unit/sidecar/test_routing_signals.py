"""The routing signals through the real sidecar app, scraped over HTTP: their names, exactly one
unlabelled gauge each, values equal to the gate's state in every state it passes through, and
no call to llama-server for a scrape."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from canned_profiles import smollm2_profile
from held_upstream import held_upstream
from sidecar_harness import DRAIN_HEADERS, RunningSidecar, sidecar_in_front_of, thresholds_for
from slogate_admission.schema import Thresholds
from slogate_sidecar.routing_signals import ADMIT_HEADROOM, KV_USAGE, QUEUE_WAIT, ROUTING_SIGNALS, RUNNING, WAITING
from slogate_sidecar.state import Sidecar

QUIET = {"poll_interval_s": 3600.0}
"""One upstream poll at start, then none while the test runs: every later call is the test's."""


def two_slots() -> Thresholds:
    """Two slots and a 30 s SLO: a deferred request may wait for either stream's end."""
    return thresholds_for(
        smollm2_profile(), slo={"ttftSeconds": 30.0}, concurrency={"max": 2}, deferral={"maxWaitSeconds": 30.0}
    )


async def scrape(gate: RunningSidecar) -> dict[str, float]:
    """The five signals from the admin port's /metrics, each checked to be one unlabelled gauge."""
    async with gate.session.get(gate.admin_url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in ROUTING_SIGNALS:
            assert family.type == "gauge", family.name
            assert [(s.name, s.labels) for s in family.samples] == [(family.name, {})], family.name
            found[family.name] = family.samples[0].value
    assert set(found) == set(ROUTING_SIGNALS)
    return found


def the_gates_state(sidecar: Sidecar) -> dict[str, float]:
    """What each signal must read, worked out here from the gate's books and thresholds."""
    gate, ledger = sidecar.gate, sidecar.gate.ledger
    if not gate.ready or gate.drain.active:  # it admits nothing
        return {WAITING: gate.deferred, RUNNING: ledger.streams, KV_USAGE: 1.0, QUEUE_WAIT: math.inf, ADMIT_HEADROOM: 0}
    t, errors = gate.thresholds, gate.machine.errors
    assert t is not None
    assert errors is not None
    # The fake's counters never move, so no live rate: the calibrated one, over the learned bias.
    assert sidecar.rates.prefill_tokens_per_s(gate.clock(), sidecar.settings.rate_max_age_s) is None
    rate = t.prefill_tokens_per_second / errors.bias.factor(ledger.streams)
    default = next(c for c in t.classes if c.name == t.default_class)
    margin = errors.margin(default.name)
    queued = ledger.queued_prefill_tokens
    return {
        WAITING: gate.deferred,
        RUNNING: ledger.streams,
        KV_USAGE: ledger.reserved_kv_tokens / t.kv_capacity_tokens,
        QUEUE_WAIT: queued / rate,
        ADMIT_HEADROOM: max(min(default.ttft_budget_seconds, default.ttft_slo_seconds) / margin * rate - queued, 0.0),
    }


def agree(scraped: dict[str, float], sidecar: Sidecar) -> None:
    expected = the_gates_state(sidecar)
    for name in ROUTING_SIGNALS:
        assert math.isclose(scraped[name], expected[name], rel_tol=1e-12, abs_tol=1e-9), (name, scraped, expected)


async def generate(gate: RunningSidecar, prompt_tokens: int) -> int:
    """One streamed generation of an exactly counted prompt (token ids); its final status."""
    body = {"prompt": [1] * prompt_tokens, "n_predict": 4, "stream": True}
    async with gate.session.post(gate.url + "/completion", json=body) as response:
        await response.read()
        return response.status


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded, 10 s) for an asynchronous consequence; the caller asserts it."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.05)


async def test_the_signals_are_the_gates_state_in_every_state(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, None, **QUIET) as gate:
        sidecar = gate.sidecar

        # No thresholds: the gate admits nothing, and says so.
        closed = await scrape(gate)
        assert closed == {WAITING: 0, RUNNING: 0, KV_USAGE: 1.0, QUEUE_WAIT: math.inf, ADMIT_HEADROOM: 0.0}
        agree(closed, sidecar)

        assert (await gate.push(two_slots().model_dump_json(by_alias=True))).status == 200
        idle = await scrape(gate)
        agree(idle, sidecar)
        assert (idle[WAITING], idle[RUNNING], idle[KV_USAGE], idle[QUEUE_WAIT]) == (0, 0, 0.0, 0.0)
        assert idle[ADMIT_HEADROOM] > 250

        # Two prompts admitted, held before their first token: queued.
        held = [asyncio.create_task(generate(gate, n)) for n in (100, 150)]
        await until(lambda: fake.started == 2)
        queued = await scrape(gate)
        agree(queued, sidecar)
        assert (queued[WAITING], queued[RUNNING]) == (0, 2)
        assert queued[QUEUE_WAIT] > 0
        assert math.isclose(queued[ADMIT_HEADROOM], idle[ADMIT_HEADROOM] - 250)
        assert queued[KV_USAGE] == sidecar.gate.ledger.reserved_kv_tokens / two_slots().kv_capacity_tokens > 0

        # Their first tokens came: both decode, nothing is queued.
        fake.tokens.set()
        await until(lambda: sidecar.gate.ledger.queued_prefill_tokens == 0)
        decoding = await scrape(gate)
        agree(decoding, sidecar)
        assert (decoding[WAITING], decoding[RUNNING], decoding[QUEUE_WAIT]) == (0, 2, 0.0)
        assert decoding[KV_USAGE] == queued[KV_USAGE]
        assert decoding[ADMIT_HEADROOM] == idle[ADMIT_HEADROOM]

        # Both slots busy: two more arrivals wait in the deferral queue.
        waiting = [asyncio.create_task(generate(gate, 50)) for _ in range(2)]
        await until(lambda: sidecar.gate.deferred == 2)
        deferred = await scrape(gate)
        agree(deferred, sidecar)
        assert (deferred[WAITING], deferred[RUNNING]) == (2, 2)

        # Everything ends: back to idle.
        fake.ends.set()
        assert await asyncio.gather(*held, *waiting) == [200] * 4
        assert await gate.wait_idle()
        assert await scrape(gate) == idle

        # Draining (the llama.cpp container's preStop hook): it admits nothing, and says so.
        async with gate.session.get(gate.admin_url + "/slogate/v1/drain", headers=DRAIN_HEADERS) as response:
            assert response.status == 200
        draining = await scrape(gate)
        agree(draining, sidecar)
        assert draining == closed


async def test_a_scrape_asks_nothing_of_llama_server(tmp_path: Path) -> None:
    async with held_upstream() as fake, sidecar_in_front_of(fake.url, tmp_path, two_slots(), **QUIET) as gate:
        in_progress = asyncio.create_task(generate(gate, 100))
        await until(lambda: fake.started == 1)
        seen: Counter[str] = Counter(fake.calls)
        assert seen["/completion"] == 1  # the count sees the generation ...
        assert seen["/health"] >= 1  # ... and the poll: it would see a scrape's call
        for _ in range(5):
            agree(await scrape(gate), gate.sidecar)
        assert fake.calls == seen
        fake.release()
        assert await in_progress == 200


def test_the_signals_are_named_in_the_house_scheme() -> None:
    assert len(set(ROUTING_SIGNALS)) == 5
    for name in ROUTING_SIGNALS:
        assert name.startswith("slogate_"), name
    assert KV_USAGE.endswith("_ratio")
    assert QUEUE_WAIT.endswith("_seconds")
    assert ADMIT_HEADROOM.endswith("_tokens")
