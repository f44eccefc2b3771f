"""The gate: admit, defer, reject; priority order; no leaked counters on any path."""

from __future__ import annotations

import asyncio

import pytest

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import Outcome, Reason, Request
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds
from slogate_llama.routes import Route
from slogate_sidecar.gate import Gate, GateNotReady
from slogate_sidecar.lease import Origin


def thresholds(max_wait: float | None = 2.0, cap: int = 2) -> Thresholds:
    """Two classes; each request's wait bounded by its own slack and ``max_wait``."""
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


ORIGIN = Origin(Route.CHAT, estimated_prompt_tokens=50, counted_prompt_tokens=50, prompt_given_as_tokens=True)
"""What the proxy would pass along: it matters to the learners only."""


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
    admission = await gate.acquire(Request(100, 50, "interactive"), ORIGIN)
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
    assert gate.is_idle()


async def test_deferred_request_admitted_when_a_stream_ends(gate: Gate) -> None:
    held = [(await gate.acquire(Request(50, 20, "interactive"), ORIGIN)).ticket for _ in range(2)]
    waiting = asyncio.create_task(gate.acquire(Request(50, 20, "interactive"), ORIGIN))
    await asyncio.sleep(0)
    assert gate.deferred == 1
    assert held[0] is not None
    gate.release(held[0])
    admission = await waiting
    decision, ticket = admission.final, admission.ticket
    assert decision.outcome is Outcome.ADMIT
    assert ticket is not None
    assert gate.deferred == 0
    for t in (held[1], ticket):
        assert t is not None
        gate.release(t)
    assert gate.is_idle()


async def test_waiters_admitted_in_priority_order(gate: Gate) -> None:
    held = [(await gate.acquire(Request(50, 20, "interactive"), ORIGIN)).ticket for _ in range(2)]
    order: list[str] = []

    async def wait(cls: str) -> None:
        admission = await gate.acquire(Request(50, 20, cls), ORIGIN)
        decision, ticket = admission.final, admission.ticket
        assert decision.outcome is Outcome.ADMIT
        order.append(cls)
        assert ticket is not None
        gate.release(ticket)

    batch = asyncio.create_task(wait("batch"))
    await asyncio.sleep(0)
    interactive = asyncio.create_task(wait("interactive"))
    await asyncio.sleep(0)
    assert gate.deferred == 2
    assert held[0] is not None
    gate.release(held[0])  # one slot frees: the higher class, though it came second
    await settle()
    assert order[0] == "interactive"  # (its release then admits batch)
    assert held[1] is not None
    gate.release(held[1])
    await asyncio.gather(batch, interactive)
    assert order == ["interactive", "batch"]
    assert gate.is_idle()


async def test_deferral_times_out_into_a_rejection() -> None:
    gate = Gate()
    gate.load(thresholds(max_wait=0.2))
    # Expected to end within its wait (tiny requests): it waits, and they never end.
    held = [(await gate.acquire(Request(10, 1), ORIGIN)).ticket for _ in range(2)]
    admission = await gate.acquire(Request(50, 20), ORIGIN)
    decision, ticket = admission.final, admission.ticket
    assert admission.first.outcome is Outcome.DEFER
    assert decision.outcome is Outcome.REJECT
    # Judged again at its deadline, it counts the waiters ahead of it, not itself: the
    # slots were short, the deferral queue was not.
    assert decision.reasons == (Reason.CONCURRENCY,)
    assert ticket is None
    assert decision.retry_after_s is not None
    assert gate.deferred == 0
    for t in held:
        assert t is not None
        gate.release(t)
    assert gate.is_idle()


async def test_client_leaving_while_deferred_leaks_nothing(gate: Gate) -> None:
    held = [(await gate.acquire(Request(50, 20), ORIGIN)).ticket for _ in range(2)]
    waiting = asyncio.create_task(gate.acquire(Request(50, 20), ORIGIN))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.deferred == 0
    for t in held:
        assert t is not None
        gate.release(t)
    assert gate.is_idle()


async def test_ticket_granted_as_the_client_leaves_is_released(gate: Gate) -> None:
    held = [(await gate.acquire(Request(50, 20), ORIGIN)).ticket for _ in range(2)]
    waiting = asyncio.create_task(gate.acquire(Request(50, 20), ORIGIN))
    await asyncio.sleep(0)
    assert held[0] is not None
    gate.release(held[0])  # grants the waiter a ticket ...
    waiting.cancel()  # ... in the same instant its client disconnects
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert held[1] is not None
    gate.release(held[1])
    assert gate.is_idle()


async def test_an_arrival_with_more_waiting_ahead_than_streams_in_service_is_refused_at_once() -> None:
    gate = Gate()
    gate.load(thresholds(cap=1, max_wait=5.0))
    held = (await gate.acquire(Request(50, 20, "batch"), ORIGIN)).ticket
    waiting = asyncio.create_task(gate.acquire(Request(50, 20, "batch"), ORIGIN))
    await asyncio.sleep(0)
    assert gate.deferred == 1
    # 1 in service, 1 deferred ahead taking its end: no expected end frees a slot for a third.
    third = await gate.acquire(Request(50, 20, "batch"), ORIGIN)
    assert third.first.outcome is Outcome.REJECT
    assert third.first.reasons == (Reason.CONCURRENCY, Reason.QUEUE_FULL)
    assert third.first.retry_after_s is not None
    # A higher class queues ahead of batch waiters: they do not count against it.
    interactive = asyncio.create_task(gate.acquire(Request(50, 20, "interactive"), ORIGIN))
    await asyncio.sleep(0)
    assert gate.deferred == 2
    assert held is not None
    gate.release(held)
    first = await interactive
    assert first.final.outcome is Outcome.ADMIT
    assert first.ticket is not None
    gate.release(first.ticket)
    second = await waiting
    assert second.final.outcome is Outcome.ADMIT
    assert second.ticket is not None
    gate.release(second.ticket)
    assert gate.is_idle()


async def test_a_batch_request_waits_for_the_slot_a_stream_in_service_frees() -> None:
    """Issue 12.7: with the default policy (no max wait), a 20 s class defers, not refuses."""
    gate = Gate()
    gate.load(thresholds(cap=2, max_wait=None))
    held = [(await gate.acquire(Request(50, 20, "interactive"), ORIGIN)).ticket for _ in range(2)]
    waiting = asyncio.create_task(gate.acquire(Request(50, 20, "batch"), ORIGIN))
    await asyncio.sleep(0)
    assert gate.deferred == 1
    assert held[0] is not None
    gate.release(held[0])
    admitted = await waiting
    assert (admitted.first.outcome, admitted.final.outcome) == (Outcome.DEFER, Outcome.ADMIT)
    for t in (held[1], admitted.ticket):
        assert t is not None
        gate.release(t)
    assert gate.is_idle()


async def test_new_thresholds_wake_waiters() -> None:
    gate = Gate()
    gate.load(thresholds(cap=1, max_wait=5.0))
    held = (await gate.acquire(Request(50, 20), ORIGIN)).ticket
    waiting = asyncio.create_task(gate.acquire(Request(50, 20), ORIGIN))
    await asyncio.sleep(0)
    gate.load(thresholds(cap=2, max_wait=5.0))  # a bigger cap pushed at runtime
    admission = await waiting
    decision, ticket = admission.final, admission.ticket
    assert decision.outcome is Outcome.ADMIT
    for t in (held, ticket):
        assert t is not None
        gate.release(t)
    assert gate.is_idle()


async def test_reject_never_books_anything(gate: Gate) -> None:
    admission = await gate.acquire(Request(100, 5000), ORIGIN)  # beyond one slot's context
    decision, ticket = admission.final, admission.ticket
    assert decision.outcome is Outcome.REJECT
    assert not decision.fits_ever
    assert ticket is None
    assert gate.is_idle()
