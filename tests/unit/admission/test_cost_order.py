"""The cost order in the GateMachine: a costly arrival is held back from the last slot, behind
the cheap, and takes it at its deadline if nobody cheaper did; without pressure nothing changes."""

from __future__ import annotations

import math

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import Outcome, Reason, Request
from slogate_admission.demand import offered_work_s
from slogate_admission.derivation import derive_thresholds
from slogate_admission.gate_machine import GateMachine
from slogate_admission.schema import Policy

CHEAP = Request(16, 8)
DEAR = Request(400, 400)


def machine(order: str, *, busy: bool = True) -> GateMachine:
    """Cap 4 (one slot held back), its book warm: under pressure when ``busy``, where the
    cheap alone offer more than the pod (CHEAP is cheap, DEAR costly), else at a tenth of a pod."""
    policy = Policy.model_validate(
        {
            "slo": {"ttftSeconds": 5.0},
            "concurrency": {"max": 4},
            "deferral": {"maxWaitSeconds": 2.0},
            "shedding": {"order": order},
        }
    )
    gate = GateMachine()
    assert gate.load(derive_thresholds(policy, smollm2_profile(), derived_at=NOW), -60.0) == []
    cheap, dear = (offered_work_s(gate.config, r.prompt_tokens, r.output_tokens) for r in (CHEAP, DEAR))
    assert dear > 4 * cheap
    per_second = math.ceil(2 / cheap) if busy else 1
    scale = 1.0 if busy else 0.1 / (cheap + dear)
    for t in range(-60, 0):
        for _ in range(per_second):
            gate.costs.observe(cheap * scale, True, float(t))
        gate.costs.observe(dear * scale, True, float(t))
    return gate


def fill(gate: GateMachine, streams: int, now: float) -> list[object]:
    tickets = [gate.arrive(CHEAP, now).ticket for _ in range(streams)]
    assert all(t is not None for t in tickets)
    return tickets


def test_a_costly_arrival_is_held_back_from_the_last_slot_and_a_cheap_one_takes_it() -> None:
    gate = machine("cost")
    fill(gate, 3, 0.0)
    held = gate.arrive(DEAR, 0.1)
    assert held.decision.outcome is Outcome.DEFER
    assert held.decision.reasons == (Reason.COST,)
    assert held.decision.costly
    assert held.decision.cost_quartile == 4
    assert held.waiter is not None
    assert held.waiter.deadline == 0.1 + held.decision.max_wait_s
    assert 0 < held.decision.max_wait_s <= 2.0
    cheap = gate.arrive(CHEAP, 0.2)
    assert cheap.decision.outcome is Outcome.ADMIT  # the held slot went to the cheap request
    expired = gate.expire(held.waiter, held.waiter.deadline)
    assert expired is not None
    assert expired.ticket is None
    assert Reason.CONCURRENCY in expired.decision.reasons
    assert expired.decision.cost_quartile == 4


def test_a_held_back_request_takes_the_slot_if_nobody_cheaper_came() -> None:
    gate = machine("cost")
    fill(gate, 3, 0.0)
    held = gate.arrive(DEAR, 0.1)
    assert held.waiter is not None
    expired = gate.expire(held.waiter, held.waiter.deadline)
    assert expired is not None
    assert expired.ticket is not None
    assert gate.ledger.streams == 4


def test_arrival_order_admits_the_same_costly_arrival_at_once() -> None:
    gate = machine("arrival")
    fill(gate, 3, 0.0)
    verdict = gate.arrive(DEAR, 0.1)
    assert verdict.decision.outcome is Outcome.ADMIT
    assert not verdict.decision.costly
    assert verdict.decision.cost_quartile == 4  # ranked for the metrics all the same


def test_a_costly_arrival_with_free_slots_beyond_the_reserve_is_admitted() -> None:
    gate = machine("cost")
    fill(gate, 2, 0.0)
    assert gate.arrive(DEAR, 0.1).decision.outcome is Outcome.ADMIT


def test_without_pressure_the_cost_order_is_arrival_order() -> None:
    gate = machine("cost", busy=False)
    assert gate.costs.summary(0.0).pressure < 1
    fill(gate, 3, 0.0)
    assert gate.arrive(DEAR, 0.1).decision.outcome is Outcome.ADMIT


def test_cheap_waiters_leave_the_queue_before_costly_ones_that_came_first() -> None:
    gate = machine("cost")
    tickets = fill(gate, 4, 0.0)
    dear = gate.arrive(DEAR, 0.1)
    cheap = gate.arrive(CHEAP, 0.2)
    assert dear.decision.outcome is cheap.decision.outcome is Outcome.DEFER
    assert dear.decision.costly
    assert not cheap.decision.costly
    resolved = gate.release(tickets[0], 0.3)  # type: ignore[arg-type]
    assert [r.waiter for r in resolved] == [cheap.waiter]
    assert dear.waiter in gate.queue
