"""The gate's state machine: each event returns what happened; time is passed in, no loop runs."""

from __future__ import annotations

import pytest

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import Outcome, Reason, Request
from slogate_admission.derivation import derive_thresholds
from slogate_admission.gate_machine import GateMachine, GateNotReady
from slogate_admission.schema import Policy, Thresholds


def thresholds(cap: int = 2, max_wait: float | None = 5.0) -> Thresholds:
    """Two classes, each request's wait bounded by its own slack and the policy's max wait."""
    policy = Policy.model_validate(
        {
            "concurrency": {"max": cap},
            "classes": [{"name": "interactive", "ttftSeconds": 5.0}, {"name": "batch", "ttftSeconds": 20.0}],
            "deferral": {"maxWaitSeconds": max_wait},
        }
    )
    return derive_thresholds(policy, smollm2_profile(), derived_at=NOW)


def loaded(cap: int = 2, max_wait: float | None = 5.0) -> GateMachine:
    machine = GateMachine()
    assert machine.load(thresholds(cap, max_wait), 0.0) == []
    return machine


def test_nothing_is_decided_before_thresholds() -> None:
    with pytest.raises(GateNotReady):
        GateMachine().arrive(Request(10, 10), 0.0)


def test_admit_books_a_ticket_and_its_end_returns_everything() -> None:
    machine = loaded()
    verdict = machine.arrive(Request(100, 50, "interactive"), 1.0)
    assert verdict.decision.outcome is Outcome.ADMIT
    assert verdict.ticket is not None
    assert verdict.waiter is None
    ledger = machine.ledger
    assert (ledger.queued_prefill_tokens, ledger.streams, ledger.reserved_kv_tokens) == (100, 1, 150)
    assert machine.first_token(verdict.ticket, 1.5) == []
    assert machine.first_token(verdict.ticket, 1.6) == []  # idempotent
    assert ledger.queued_prefill_tokens == 0
    assert machine.release(verdict.ticket, 2.0) == []
    assert machine.release(verdict.ticket, 2.1) == []
    assert machine.is_idle()


def test_a_deferred_request_is_resolved_by_the_release_that_frees_its_slot() -> None:
    machine = loaded()
    held = [machine.arrive(Request(50, 20, "interactive"), 0.0).ticket for _ in range(2)]
    verdict = machine.arrive(Request(50, 20, "interactive"), 0.5)
    assert verdict.decision.outcome is Outcome.DEFER
    waiter = verdict.waiter
    assert waiter is not None
    assert waiter.deadline == pytest.approx(0.5 + verdict.decision.max_wait_s)
    assert machine.deferred == 1
    assert held[0] is not None
    (resolution,) = machine.release(held[0], 1.5)
    assert resolution.waiter is waiter
    assert resolution.decision.outcome is Outcome.ADMIT
    # Its second of waiting counts against its TTFT, beside the 50 prompt tokens still queued
    # (the released request's 50 left the queue with it).
    expected = 1.0 + 50 / machine.config.prefill_tokens_per_s + machine.config.prefill.seconds(50)
    assert resolution.decision.predicted_ttft_s == pytest.approx(expected)
    assert resolution.ticket is not None
    assert machine.deferred == 0
    for ticket in (held[1], resolution.ticket):
        assert ticket is not None
        machine.release(ticket, 2.0)
    assert machine.is_idle()


def test_waiters_are_resolved_in_priority_order_then_arrival_order() -> None:
    machine = loaded()
    held = [machine.arrive(Request(50, 20, "interactive"), 0.0).ticket for _ in range(2)]
    batch = machine.arrive(Request(50, 20, "batch"), 0.1).waiter
    first = machine.arrive(Request(50, 20, "interactive"), 0.2).waiter
    second = machine.arrive(Request(50, 20, "interactive"), 0.3).waiter
    assert machine.deferred == 3
    assert held[0] is not None
    assert held[1] is not None
    resolved = machine.release(held[0], 1.0) + machine.release(held[1], 1.0)
    assert [r.waiter for r in resolved] == [first, second]  # batch came first, waits last
    assert all(r.ticket is not None for r in resolved)
    assert machine.queue.count_at_or_above(2) == 1  # batch: the second class's cheap rank (2 x 1)
    assert batch in machine.queue


def test_an_expired_wait_is_refused_with_its_reasons_unless_it_fits_by_then() -> None:
    machine = loaded(max_wait=0.5)
    held = [machine.arrive(Request(50, 4), 0.0).ticket for _ in range(2)]  # expected to end within 0.5 s
    assert machine.ledger.next_release_s(0.0) < 0.5
    waiter = machine.arrive(Request(50, 20), 0.0).waiter
    assert waiter is not None
    assert waiter.deadline == pytest.approx(0.5)
    refused = machine.expire(waiter, 0.5)
    assert refused is not None
    assert refused.ticket is None
    assert refused.decision.outcome is Outcome.REJECT
    assert refused.decision.reasons == (Reason.CONCURRENCY,)  # it does not count itself as ahead
    assert machine.expire(waiter, 0.6) is None  # already gone
    assert machine.deferred == 0
    # A waiter whose slot is free when its deadline comes (no event woke it) is admitted.
    late = machine.arrive(Request(50, 20), 1.0).waiter
    assert late is not None
    assert held[0] is not None
    machine.ledger.release(held[0])  # behind the machine's back: no wake-up
    admitted = machine.expire(late, 1.5)
    assert admitted is not None
    assert admitted.ticket is not None
    assert admitted.decision.outcome is Outcome.ADMIT


def test_a_client_leaving_takes_its_waiter_out() -> None:
    machine = loaded()
    held = [machine.arrive(Request(50, 20), 0.0).ticket for _ in range(2)]
    waiter = machine.arrive(Request(50, 20), 0.0).waiter
    assert waiter is not None
    assert machine.cancel(waiter)
    assert not machine.cancel(waiter)
    assert held[0] is not None
    assert machine.release(held[0], 1.0) == []  # nobody left to wake
    assert machine.deferred == 0


def test_new_thresholds_resolve_waiters() -> None:
    machine = loaded(cap=1)
    held = machine.arrive(Request(50, 20), 0.0).ticket
    waiter = machine.arrive(Request(50, 20), 0.0).waiter
    assert held is not None
    assert waiter is not None
    (resolution,) = machine.load(thresholds(cap=2), 0.2)
    assert resolution.waiter is waiter
    assert resolution.ticket is not None


def test_an_arrival_no_stream_in_service_would_make_room_for_is_refused_at_once() -> None:
    """One slot, one stream in it, one waiter for its end: a third arrival's slot would be
    the second end after the waiter's, and no stream in service gives it one (``inf``)."""
    machine = loaded(cap=1)
    machine.arrive(Request(50, 20, "batch"), 0.0)
    assert machine.arrive(Request(50, 20, "batch"), 0.0).waiter is not None
    third = machine.arrive(Request(50, 20, "batch"), 0.0)
    assert third.decision.outcome is Outcome.REJECT
    assert third.decision.reasons == (Reason.CONCURRENCY, Reason.QUEUE_FULL)
    # The higher class queues ahead of batch waiters: they do not count against it.
    assert machine.arrive(Request(50, 20, "interactive"), 0.0).waiter is not None


def test_expected_ends_follow_the_load_they_run_under() -> None:
    """A new prompt's prefill stalls every stream in service and each decodes slower beside
    it; when a stream ends the others speed up again. Retry-After and the waits read these ends."""
    machine = loaded(cap=2)
    decode, prefill = machine.config.decode, machine.config.prefill
    first = machine.arrive(Request(50, 200, "interactive"), 0.0).ticket
    assert first is not None
    alone = machine.ledger.next_release_s(0.0)
    assert alone == pytest.approx(first.predicted_ttft_s + 200 * decode.seconds_per_token(1))
    second = machine.arrive(Request(400, 10, "interactive"), 1.0).ticket
    assert second is not None
    slower = decode.seconds_per_token(2) / decode.seconds_per_token(1)
    beside = (alone - 1.0) * slower + prefill.seconds(400)
    assert first.expected_end - 1.0 == pytest.approx(beside)
    assert machine.release(second, 2.0) == []
    assert first.expected_end - 2.0 == pytest.approx((beside - 1.0) / slower)
