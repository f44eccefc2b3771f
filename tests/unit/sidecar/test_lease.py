"""The three outcomes a proxy reports to a lease, and the learners that hear them."""

from __future__ import annotations

import asyncio

import pytest

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import Outcome, Request
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds
from slogate_llama.routes import Route
from slogate_sidecar.gate import Gate
from slogate_sidecar.learners import MetricsLearner, TtftLearner, UsageLearner
from slogate_sidecar.lease import Lease, Origin, Usage
from slogate_sidecar.metrics import SidecarMetrics

ORIGIN = Origin(Route.COMPLETIONS, estimated_prompt_tokens=60, counted_prompt_tokens=50, prompt_given_as_tokens=False)


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Heard:
    """A learner that writes down what it hears."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def first_token(self, lease: Lease) -> None:
        self.events.append(("first_token", lease.ttft_s))

    def completed(self, lease: Lease, usage: Usage) -> None:
        self.events.append(("completed", usage if lease.ended else None))

    def abandoned(self, lease: Lease) -> None:
        self.events.append(("abandoned", lease.ttft_s))


def thresholds(cap: int = 2) -> Thresholds:
    policy = Policy.model_validate({"slo": {"ttftSeconds": 5.0}, "concurrency": {"max": cap}})
    return derive_thresholds(policy, smollm2_profile(), derived_at=NOW)


async def test_each_outcome_is_heard_once_and_the_books_follow() -> None:
    clock, heard = Clock(), Heard()
    gate = Gate(clock=clock, learners=[heard])
    gate.load(thresholds())
    admission = await gate.acquire(Request(50, 20), ORIGIN, arrived_at=99.5)
    lease = admission.lease
    assert lease is not None
    assert gate.ledger.queued_prefill_tokens == 50
    clock.now = 100.25
    lease.first_token()
    lease.first_token()
    assert gate.ledger.queued_prefill_tokens == 0
    assert lease.ttft_s == pytest.approx(0.75)  # from the arrival at the proxy, not the decision
    lease.complete(Usage(prompt_tokens=51, completion_tokens=20))
    lease.abandon()  # after completion: nothing more happens
    lease.complete(Usage(None, None))
    assert heard.events == [("first_token", pytest.approx(0.75)), ("completed", Usage(51, 20))]
    assert gate.is_idle()


async def test_an_abandoned_request_returns_its_slot_and_says_so() -> None:
    heard = Heard()
    gate = Gate(learners=[heard])
    gate.load(thresholds())
    lease = (await gate.acquire(Request(50, 20), ORIGIN)).lease
    assert lease is not None
    lease.abandon()
    lease.first_token()  # too late: the lease has ended
    assert heard.events == [("abandoned", None)]
    assert gate.is_idle()


async def test_the_gate_corrects_its_rate_from_the_first_tokens_it_relays() -> None:
    clock = Clock()
    gate = Gate(clock=clock)
    learner = TtftLearner()
    gate.learners.append(learner)
    gate.load(thresholds(cap=8))
    before = gate.decide(Request(200, 10)).predicted_ttft_s
    errors = gate.machine.errors
    assert errors is not None
    for _ in range(errors.bias.batch):  # every first token comes 1.5x later than predicted
        lease = (await gate.acquire(Request(200, 10), ORIGIN, arrived_at=clock.now)).lease
        assert lease is not None
        clock.now += 1.5 * lease.decision.predicted_ttft_s
        lease.first_token()
        lease.complete(Usage(200, 10))
    assert learner.tracker.missed + learner.tracker.met == errors.bias.batch
    assert errors.bias.factor(0) == pytest.approx(1.5)  # one request at a time: B = 0
    assert gate.decide(Request(200, 10)).predicted_ttft_s == pytest.approx(1.5 * before)


async def test_the_usage_learner_learns_n_out_per_route_and_the_prompt_count_error() -> None:
    learner = UsageLearner()
    gate = Gate(learners=[learner])
    gate.load(thresholds())
    lease = (await gate.acquire(Request(50, 20), ORIGIN)).lease
    assert lease is not None
    lease.complete(Usage(prompt_tokens=50, completion_tokens=17))
    assert learner.output_tokens[Route.COMPLETIONS].quantile(0.5) == 17
    assert len(learner.output_tokens[Route.CHAT]) == 0
    assert learner.prompt_error.estimate.quantile(0.5) == pytest.approx((60 - 50) / 50)
    assert learner.prompt_error.counted.quantile(0.5) == 0.0


async def test_a_client_leaving_while_deferred_is_counted_under_its_resolved_class() -> None:
    metrics = SidecarMetrics()
    recorded = MetricsLearner(metrics)
    gate = Gate(observers=[recorded], learners=[recorded])
    gate.load(thresholds(cap=1))  # one slot; a waiter for its stream's end
    held = (await gate.acquire(Request(50, 20), ORIGIN)).lease
    waiting = asyncio.create_task(gate.acquire(Request(50, 20, "no-such-class"), ORIGIN))
    await asyncio.sleep(0)
    assert gate.deferred == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    samples = {
        (s.labels["result"], s.labels["class"]): s.value
        for s in metrics.deferral_outcomes.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert samples[("cancelled", "default")] == 1  # never the raw header's class
    decided = sum(s.value for s in metrics.requests.collect()[0].samples if s.name.endswith("_total"))
    assert decided == 2
    assert held is not None
    held.abandon()
    assert gate.is_idle()
    assert (await gate.acquire(Request(50, 20), ORIGIN)).first.outcome is Outcome.ADMIT
