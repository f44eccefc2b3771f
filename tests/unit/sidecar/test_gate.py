"""The gate: admit, defer, reject; priority order; no leaked counters on any path."""

from __future__ import annotations

import asyncio

import pytest

from builders import NOW, smollm2_profile
from slogate_admission.decision import Outcome, Reason, Request
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds
from slogate_sidecar.gate import Gate, GateNotReady
from slogate_sidecar.state import TtftCorrection


def thresholds(max_wait: float = 0.5, cap: int = 2) -> Thresholds:
    policy = Policy.model_validate(
        {
            "concurrency": {"max": cap},
            "classes": [
                {"name": "interactive", "ttftSeconds": 5.0, "reservedSlots": 0},
                {"name": "batch", "ttftSeconds": 20.0},
            ],
            "deferral": {"maxWaitSeconds": max_wait},
        }
    )
    return derive_thresholds(policy, smollm2_profile(), derived_at=NOW)


async def settle() -> None:
    """Let woken tasks run to their next await (a few loop turns: shield, timeout)."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def gate() -> Gate:
    g = Gate()
    g.load(thresholds())
    return g


async def test_not_ready_without_thresholds() -> None:
    gate = Gate()
    assert not gate.ready
    with pytest.raises(GateNotReady):
        gate.decide(Request(10, 10))


async def test_admit_first_token_release_returns_to_zero(gate: Gate) -> None:
    admission = await gate.acquire(Request(100, 50, "interactive"))
    decision, ticket = admission.final, admission.ticket
    assert decision.outcome is Outcome.ADMIT
    assert ticket is not None
    assert (
        gate.ledger.queued_prefill_tokens,
        gate.ledger.streams,
        gate.ledger.reserved_kv_tokens,
    ) == (100, 1, 150)
    gate.first_token(ticket)
    gate.first_token(ticket)  # idempotent
    assert gate.ledger.queued_prefill_tokens == 0
    gate.release(ticket)
    gate.release(ticket)  # idempotent
    assert gate.ledger.is_idle()


async def test_deferred_request_admitted_when_a_stream_ends(gate: Gate) -> None:
    held = [(await gate.acquire(Request(50, 20, "interactive"))).ticket for _ in range(2)]
    waiting = asyncio.create_task(gate.acquire(Request(50, 20, "interactive")))
    await asyncio.sleep(0)
    assert gate.ledger.deferred == 1
    assert held[0] is not None
    gate.release(held[0])
    admission = await waiting
    decision, ticket = admission.final, admission.ticket
    assert decision.outcome is Outcome.ADMIT
    assert ticket is not None
    assert gate.ledger.deferred == 0
    for t in (held[1], ticket):
        assert t is not None
        gate.release(t)
    assert gate.ledger.is_idle()


async def test_waiters_admitted_in_priority_order(gate: Gate) -> None:
    held = [(await gate.acquire(Request(50, 20, "interactive"))).ticket for _ in range(2)]
    order: list[str] = []

    async def wait(cls: str) -> None:
        admission = await gate.acquire(Request(50, 20, cls))
        decision, ticket = admission.final, admission.ticket
        assert decision.outcome is Outcome.ADMIT
        order.append(cls)
        assert ticket is not None
        gate.release(ticket)

    batch = asyncio.create_task(wait("batch"))
    await asyncio.sleep(0)
    interactive = asyncio.create_task(wait("interactive"))
    await asyncio.sleep(0)
    assert gate.ledger.deferred == 2
    assert held[0] is not None
    gate.release(held[0])  # one slot frees: the higher class, though it came second
    await settle()
    assert order[0] == "interactive"  # (its release then admits batch)
    assert held[1] is not None
    gate.release(held[1])
    await asyncio.gather(batch, interactive)
    assert order == ["interactive", "batch"]
    assert gate.ledger.is_idle()


async def test_deferral_times_out_into_a_rejection() -> None:
    gate = Gate()
    gate.load(thresholds(max_wait=0.05))
    held = [(await gate.acquire(Request(50, 20))).ticket for _ in range(2)]
    admission = await gate.acquire(Request(50, 20))
    decision, ticket = admission.final, admission.ticket
    assert admission.first.outcome is Outcome.DEFER
    assert decision.outcome is Outcome.REJECT
    assert Reason.CONCURRENCY in decision.reasons
    assert ticket is None
    assert decision.retry_after_s is not None
    assert gate.ledger.deferred == 0
    for t in held:
        assert t is not None
        gate.release(t)
    assert gate.ledger.is_idle()


async def test_client_leaving_while_deferred_leaks_nothing(gate: Gate) -> None:
    held = [(await gate.acquire(Request(50, 20))).ticket for _ in range(2)]
    waiting = asyncio.create_task(gate.acquire(Request(50, 20)))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.ledger.deferred == 0
    for t in held:
        assert t is not None
        gate.release(t)
    assert gate.ledger.is_idle()


async def test_ticket_granted_as_the_client_leaves_is_released(gate: Gate) -> None:
    held = [(await gate.acquire(Request(50, 20))).ticket for _ in range(2)]
    waiting = asyncio.create_task(gate.acquire(Request(50, 20)))
    await asyncio.sleep(0)
    assert held[0] is not None
    gate.release(held[0])  # grants the waiter a ticket ...
    waiting.cancel()  # ... in the same instant its client disconnects
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert held[1] is not None
    gate.release(held[1])
    assert gate.ledger.is_idle()


async def test_new_thresholds_wake_waiters() -> None:
    gate = Gate()
    gate.load(thresholds(cap=1, max_wait=5.0))
    held = (await gate.acquire(Request(50, 20))).ticket
    waiting = asyncio.create_task(gate.acquire(Request(50, 20)))
    await asyncio.sleep(0)
    gate.load(thresholds(cap=2, max_wait=5.0))  # a bigger cap pushed at runtime
    admission = await waiting
    decision, ticket = admission.final, admission.ticket
    assert decision.outcome is Outcome.ADMIT
    for t in (held, ticket):
        assert t is not None
        gate.release(t)
    assert gate.ledger.is_idle()


async def test_reject_never_books_anything(gate: Gate) -> None:
    admission = await gate.acquire(Request(100, 5000))  # beyond one slot's context
    decision, ticket = admission.final, admission.ticket
    assert decision.outcome is Outcome.REJECT
    assert not decision.fits_ever
    assert ticket is None
    assert gate.ledger.is_idle()


def test_ttft_correction_converges_and_is_bounded() -> None:
    c = TtftCorrection(batch=4)
    # The server is 30% slower than predicted: after one batch the factor says so ...
    for _ in range(4):
        c.observe(1.0, 1.3)
    assert c.factor == pytest.approx(1.3)
    # ... and predictions made with it in force are right: the factor stays.
    for _ in range(4):
        c.observe(1.3, 1.3)
    assert c.factor == pytest.approx(1.3)
    for _ in range(40):  # a pathological stretch cannot push it past the clamp
        c.observe(1.0, 10.0)
    assert c.factor == 2.0
    c.observe(0.01, 5.0)  # too small to judge: ignored
    assert len(c._ratios) == 0
