"""Fair shares between tenants: the share rule, who is tracked, the counters, the deferral order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import Outcome, Reason, Request
from slogate_admission.derivation import derive_thresholds
from slogate_admission.gate_machine import GateMachine
from slogate_admission.ledger import Ticket
from slogate_admission.schema import Policy, Thresholds
from slogate_admission.tenant_schema import OTHER_TENANTS, TenantsPolicy
from slogate_admission.tenant_shares import share_excess_tokens, share_retry_after_s

SLO_S = 2.0


def thresholds(tenants: dict[str, object] | None = None, **policy: object) -> Thresholds:
    raw: dict[str, object] = {"slo": {"ttftSeconds": SLO_S}, **policy}
    if tenants is not None:
        raw["tenants"] = tenants
    return derive_thresholds(Policy.model_validate(raw), smollm2_profile(), derived_at=NOW)


def machine(tenants: dict[str, object] | None, **policy: object) -> GateMachine:
    """A gate; ``tenants`` None: no tenant policy."""
    gate = GateMachine()
    gate.load(thresholds(tenants, **policy), 0.0)
    return gate


def budget_tokens(gate: GateMachine) -> float:
    """What ``decide`` lets the default class's queue hold at the prior margin."""
    assert gate.errors is not None
    config = gate.config
    return (
        config.classes[config.default_class].ttft_budget_s / gate.errors.margin("default") * config.prefill_tokens_per_s
    )


# ---------------------------------------------------------------------- schema and derivation


def test_the_output_weight_is_measured_unless_set() -> None:
    measured = thresholds({}).tenants
    assert measured is not None
    assert measured.output_weight_measured
    t = thresholds({})
    # R / (B · r_decode(B)) at the cap: 4 streams of 45 tok/s against the prefill rate.
    assert measured.output_weight == pytest.approx(t.prefill_tokens_per_second / (4 * 45))
    chosen = thresholds({"outputWeight": 3}).tenants
    assert chosen is not None
    assert (chosen.output_weight, chosen.output_weight_measured) == (3, False)
    assert thresholds(None).tenants is None


@pytest.mark.parametrize(
    "raw",
    [
        {"weights": {"a": 1, "b": 1}, "maxTracked": 1},
        {"weights": {"a": 0}},
        {"weights": {"-bad": 1}},
        {"weights": {OTHER_TENANTS: 1}},
        {"header": "X Tenant"},
        {"maxTracked": 0},
        {"halfLifeSeconds": 0},
        {"outputWeight": -1},
    ],
)
def test_invalid_tenant_policies_are_refused(raw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        TenantsPolicy.model_validate(raw)


# ---------------------------------------------------------------------- the share rule


def test_share_arithmetic() -> None:
    # Alone, or holding nothing: never over. Two equal tenants: half the budget each.
    assert share_excess_tokens(900, 100, 1.0, 1.0, 1000) == 0
    assert share_excess_tokens(0, 900, 1.0, 2.0, 1000) == 0
    assert share_excess_tokens(400, 100, 1.0, 2.0, 1000) == 0
    assert share_excess_tokens(450, 100, 1.0, 2.0, 1000) == pytest.approx(50)
    # Its own excess drains at its fair part of the rate: 50 tokens at 500/s x 1/2.
    assert share_retry_after_s(50, 500, 1.0, 2.0) == pytest.approx(0.2)


def fill(gate: GateMachine, tenant: str, now: float, prompt: int = 100) -> list[Outcome]:
    """Send ``tenant``'s requests until one is refused; their outcomes."""
    outcomes = []
    while True:
        verdict = gate.arrive(Request(prompt, 8, tenant=tenant), now)
        outcomes.append(verdict.decision.outcome)
        if verdict.decision.outcome is Outcome.REJECT:
            return outcomes


def test_a_tenant_alone_may_use_the_whole_budget_and_is_refused_on_ttft_as_without_tenants() -> None:
    fair, plain = machine({}), machine(None)
    sent = [gate.arrive(Request(100, 8, tenant="a"), 0.0).decision for gate in (fair, plain) for _ in range(1)]
    assert [d.outcome for d in sent] == [Outcome.ADMIT, Outcome.ADMIT]
    for _ in range(30):
        with_tenants = fair.arrive(Request(100, 8, tenant="a"), 0.0).decision
        without = plain.arrive(Request(100, 8, tenant="a"), 0.0).decision
        assert (with_tenants.outcome, with_tenants.reasons) == (without.outcome, without.reasons)
        assert Reason.TENANT_SHARE not in with_tenants.reasons
    assert fair.ledger.queued_prefill_tokens == plain.ledger.queued_prefill_tokens


def test_while_two_tenants_are_active_each_holds_at_most_its_share() -> None:
    gate = machine({}, concurrency={"max": 4}, deferral={"maxWaitSeconds": 0})
    gate.arrive(Request(100, 8, tenant="b"), 0.0)  # b is active (and holds 100)
    budget = budget_tokens(gate)
    admitted = 0
    while True:
        verdict = gate.arrive(Request(100, 8, tenant="a"), 0.0)
        if verdict.decision.outcome is not Outcome.ADMIT:
            break
        admitted += 1
    refusal = verdict.decision
    assert refusal.outcome is Outcome.REJECT
    assert Reason.TENANT_SHARE in refusal.reasons
    assert gate.tenants is not None
    a = gate.tenants.account("a", 0.0)
    # a holds what fits in half the budget, never more.
    assert a.held["default"] == 100 * admitted
    assert a.held["default"] <= budget / 2 < a.held["default"] + 100
    # Retry-After: a's own excess drained at half the rate.
    excess = a.held["default"] + 100 - budget / 2
    rate = gate.config.prefill_tokens_per_s / gate.errors.margin("default")  # type: ignore[union-attr]
    assert refusal.retry_after_s == pytest.approx(max(excess / (rate / 2), refusal.retry_after_s or 0))
    assert (a.share_refusals, a.refused_requests) == (1, 1)


def test_weights_divide_the_budget() -> None:
    gate = machine({"weights": {"a": 3, "b": 1}}, deferral={"maxWaitSeconds": 0})
    gate.arrive(Request(20, 8, tenant="b"), 0.0)
    outcomes = fill(gate, "a", 0.0, prompt=200)
    assert gate.tenants is not None
    a = gate.tenants.account("a", 0.0)
    assert a.share_refusals == 1
    assert outcomes.count(Outcome.ADMIT) == 2  # 400 of a 3/4 share of 502 tokens
    assert budget_tokens(gate) * 3 / 4 - 200 < a.held["default"] <= budget_tokens(gate) * 3 / 4


def test_a_tenant_holding_nothing_may_always_send_one_request() -> None:
    # Twenty active tenants, each share far below one 300-token prompt.
    gate = machine({}, deferral={"maxWaitSeconds": 0})
    for k in range(20):
        ticket = gate.arrive(Request(1, 1, tenant=f"t{k}"), 0.0).ticket
        assert ticket is not None
        gate.release(ticket, 0.0)  # done, but active for a half-life
    assert budget_tokens(gate) / 21 < 300
    first = gate.arrive(Request(300, 8, tenant="heavy"), 0.0).decision
    second = gate.arrive(Request(300, 8, tenant="heavy"), 0.0).decision
    assert first.outcome is Outcome.ADMIT
    assert Reason.TENANT_SHARE in second.reasons


def test_a_share_is_held_for_an_active_tenant_for_a_half_life_then_released() -> None:
    half_life = 10.0
    gate = machine({"halfLifeSeconds": half_life}, deferral={"maxWaitSeconds": 0})
    ticket = gate.arrive(Request(50, 8, tenant="b"), 0.0).ticket
    assert ticket is not None
    gate.release(ticket, 0.1)
    assert gate.tenants is not None
    assert gate.tenants.active_weight("default") == 1
    fill(gate, "a", 5.0)  # b still active: a stops at half
    half = gate.tenants.account("a", 5.0).held["default"]
    assert half <= budget_tokens(gate) / 2
    # Past b's half-life, a is alone: the rest of the budget is a's (refused on TTFT only).
    outcomes = fill(gate, "a", 10.5)
    assert gate.tenants.active_weight("default") == 1
    assert outcomes.count(Outcome.ADMIT) >= 1
    assert gate.tenants.account("a", 10.5).held["default"] > budget_tokens(gate) / 2


# ---------------------------------------------------------------------- bounded accounts


def test_at_most_max_tracked_tenants_have_an_account_the_rest_share_one() -> None:
    gate = machine({"maxTracked": 3, "weights": {"vip": 2}, "halfLifeSeconds": 5})
    assert gate.tenants is not None
    for k in range(10):
        gate.arrive(Request(10, 1, tenant=f"t{k}"), 0.0)
    names = [a.name for a in gate.tenants.tracked()]
    assert names == ["vip", "t0", "t1", OTHER_TENANTS]
    assert gate.tenants.account("t7", 0.0) is gate.tenants.other
    assert gate.tenants.account("not a name!", 0.0) is gate.tenants.other
    assert gate.tenants.account(None, 0.0) is gate.tenants.other
    # t0 is idle once its requests end and a half-life has passed: it gives way to a newcomer.
    for ticket in list(gate.ledger._tickets):
        gate.release(ticket, 1.0)
    assert gate.tenants.account("new", 4.0) is gate.tenants.other  # t0 seen 4 s ago: not yet
    new = gate.tenants.account("new", 6.0)
    assert new.name == "new"
    assert [a.name for a in gate.tenants.tracked()] == ["vip", "t1", "new", OTHER_TENANTS]


# ---------------------------------------------------------------------- counters and the deferral order


def test_served_tokens_decay_by_half_each_half_life_and_count_output_by_its_weight() -> None:
    gate = machine({"halfLifeSeconds": 10, "outputWeight": 2})
    ticket = gate.arrive(Request(100, 50, tenant="a"), 0.0).ticket
    assert ticket is not None
    assert gate.tenants is not None
    a = gate.tenants.account("a", 0.0)
    assert gate.tenants.served_tokens(a, 0.0) == pytest.approx(100 + 2 * 50)
    assert gate.tenants.served_tokens(a, 10.0) == pytest.approx(100)
    gate.release(ticket, 10.0, output_tokens=20)  # 30 booked tokens never came
    assert gate.tenants.served_tokens(a, 10.0) == pytest.approx(100 - 2 * 30)
    # Far in the future (the counters are kept in the log, never rebased) the values hold.
    later = gate.arrive(Request(10, 0, tenant="b"), 1000.0).ticket
    assert later is not None
    assert gate.tenants.served_tokens(gate.tenants.account("b", 1000.0), 1000.0) == pytest.approx(10)


def occupy_slots(gate: GateMachine, tenant: str, now: float) -> list[Ticket]:
    tickets = []
    for _ in range(gate.config.classes["default"].concurrency_cap):
        ticket = gate.arrive(Request(10, 8, tenant=tenant), now).ticket
        assert ticket is not None
        tickets.append(ticket)
    return tickets


def test_the_least_served_tenant_leaves_the_deferral_queue_first() -> None:
    gate = machine({}, deferral={"maxWaitSeconds": 1.5})
    held = occupy_slots(gate, "heavy", 0.0)  # heavy has been served 4 requests
    heavy = gate.arrive(Request(10, 8, tenant="heavy"), 0.1).waiter
    light = gate.arrive(Request(10, 8, tenant="light"), 0.2).waiter
    assert heavy is not None
    assert light is not None
    for ticket in held:
        gate.first_token(ticket, 0.3)
    (first,) = gate.release(held[0], 0.4)
    assert first.waiter is light  # it came later but was served less
    (second,) = gate.release(held[1], 0.5)
    assert second.waiter is heavy


def test_a_waiter_held_by_its_own_share_lets_the_other_tenants_pass() -> None:
    # b active, holding all three slots: each waiter below waits for one of their ends.
    gate = machine({}, concurrency={"max": 3}, deferral={"maxWaitSeconds": 1.5})
    slot, *others = [gate.arrive(Request(10, 1, tenant="b"), 0.0).ticket for _ in range(3)]
    for ticket in (slot, *others):
        assert ticket is not None
        gate.first_token(ticket, 0.05)
    # Two tenants active: a may hold half the budget, and its two waiters fit in it.
    a_first = gate.arrive(Request(150, 8, tenant="a"), 0.1).waiter
    a_second = gate.arrive(Request(150, 8, tenant="a"), 0.1).waiter
    # A third tenant arrives: a's share falls to a third, below what its waiters hold.
    c = gate.arrive(Request(150, 8, tenant="c"), 0.2).waiter
    assert a_first is not None
    assert a_second is not None
    assert c is not None
    assert 150 < budget_tokens(gate) / 3 < 300 <= budget_tokens(gate) / 2
    resolved = gate.release(slot, 0.3)
    # a's head came first (served as little, earlier) but waits for its own share: c passes.
    assert [r.waiter for r in resolved] == [c]
    assert resolved[0].ticket is not None
    assert a_first in gate.queue
    assert a_second in gate.queue
    # At its deadline a's waiter is refused for its share, with a Retry-After from a's backlog.
    refused = gate.expire(a_first, a_first.deadline)
    assert refused is not None
    assert refused.decision.outcome is Outcome.REJECT
    assert Reason.TENANT_SHARE in refused.decision.reasons
    assert refused.decision.retry_after_s is not None
    assert refused.decision.retry_after_s > 0


def test_a_half_life_change_carries_the_counters_over_at_their_value() -> None:
    gate = machine({"halfLifeSeconds": 10})
    assert gate.arrive(Request(100, 0, tenant="a"), 0.0).ticket is not None
    assert gate.tenants is not None
    a = gate.tenants.account("a", 0.0)
    gate.load(thresholds({"halfLifeSeconds": 20}), 10.0)
    assert gate.tenants.served_tokens(a, 10.0) == pytest.approx(50)
    assert gate.tenants.served_tokens(a, 30.0) == pytest.approx(25)


def test_the_least_served_tenant_does_not_queue_behind_a_heavier_tenants_waiters() -> None:
    gate = machine({}, deferral={"maxWaitSeconds": 1.5})
    occupy_slots(gate, "heavy", 0.0)
    waiting = [gate.arrive(Request(10, 8, tenant="heavy"), 0.1).decision for _ in range(3)]
    # A waiter waits for the end of a stream in service: heavy's waiters take the soonest
    # ends in turn, and once more wait than streams are in service, the next is refused.
    assert [d.outcome for d in waiting] == [Outcome.DEFER] * 3
    assert gate.arrive(Request(10, 8, tenant="heavy"), 0.1).decision.outcome is Outcome.DEFER
    refused = gate.arrive(Request(10, 8, tenant="heavy"), 0.1).decision
    assert (refused.outcome, Reason.QUEUE_FULL in refused.reasons) == (Outcome.REJECT, True)
    # light has been served nothing: its turn comes first, so nothing of heavy's is ahead.
    light = gate.arrive(Request(10, 8, tenant="light"), 0.2)
    assert light.decision.outcome is Outcome.DEFER
    assert light.waiter is not None
    assert gate.queue.count_ahead_of(light.waiter) == 0
    assert [w.request.tenant for w in gate.queue.in_priority_order()] == ["light"] + ["heavy"] * 4


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(1, 400), st.integers(0, 64)),
        min_size=1,
        max_size=40,
    )
)
def test_the_books_by_tenant_return_to_zero(requests: list[tuple[str | None, int, int]]) -> None:
    """However arrivals, first tokens, releases and deadlines interleave, every hold is returned."""
    gate = machine({}, concurrency={"max": 2}, deferral={"maxWaitSeconds": 0.5})
    now = 0.0
    tickets: list[Ticket] = []
    waiters = []
    for tenant, prompt, out in requests:
        now += 0.01
        verdict = gate.arrive(Request(prompt, out, tenant=tenant), now)
        if verdict.ticket is not None:
            tickets.append(verdict.ticket)
        if verdict.waiter is not None:
            waiters.append(verdict.waiter)
        if len(tickets) > 1:
            gate.first_token(tickets[0], now)
            tickets.extend(r.ticket for r in gate.release(tickets.pop(0), now, out) if r.ticket is not None)
    for waiter in waiters:
        resolution = gate.expire(waiter, now + 1.0)
        if resolution is not None and resolution.ticket is not None:
            tickets.append(resolution.ticket)
    while tickets:
        tickets.extend(r.ticket for r in gate.release(tickets.pop(), now + 2.0) if r.ticket is not None)
    assert gate.is_idle()
    assert gate.tenants is not None
    for account in gate.tenants.tracked():
        assert sum(account.held.values()) == 0
        assert account.requests_inside == 0
    decided = sum(a.admitted_requests + a.refused_requests for a in gate.tenants.tracked())
    assert decided == len(requests)


def test_a_precheck_is_its_tenants_arrival_and_a_refusal_there_is_counted() -> None:
    gate = machine({}, deferral={"maxWaitSeconds": 0})
    gate.arrive(Request(10, 8, tenant="b"), 0.0)
    for _ in range(2):
        assert gate.arrive(Request(150, 8, tenant="a"), 0.0).ticket is not None  # 300 of a's half
    assert gate.tenants is not None
    # A newcomer's precheck passes, books nothing, and makes it active: a's share is now a third.
    passed = gate.precheck(Request(0, 8, tenant="c"), 0.1, counted_as=50)
    assert passed.outcome is Outcome.ADMIT
    assert gate.tenants.active_weight("default") == 3
    c = gate.tenants.account("c", 0.1)
    assert (c.admitted_requests, c.refused_requests, c.requests_inside) == (0, 0, 0)
    # a holds more than a third of the budget: even an empty prompt is over it, refused before counting.
    assert budget_tokens(gate) / 3 < 300
    decision = gate.precheck(Request(0, 8, tenant="a"), 0.2, counted_as=100)
    assert decision.outcome is Outcome.REJECT
    assert Reason.TENANT_SHARE in decision.reasons
    a = gate.tenants.account("a", 0.2)
    assert (a.refused_requests, a.refused_prompt_tokens, a.share_refusals) == (1, 100, 1)


def test_new_thresholds_listing_more_tenants_take_idle_unlisted_accounts() -> None:
    gate = machine({"maxTracked": 3, "halfLifeSeconds": 5})
    for k in range(3):
        ticket = gate.arrive(Request(10, 1, tenant=f"t{k}"), 0.0).ticket
        assert ticket is not None
        gate.release(ticket, 0.0)
    assert gate.tenants is not None
    gate.load(thresholds({"maxTracked": 3, "halfLifeSeconds": 5, "weights": {"vip": 2, "gold": 2}}), 10.0)
    assert len(gate.tenants.tracked()) == 3 + 1  # two idle unlisted accounts gave way
    assert {a.name for a in gate.tenants.tracked()} >= {"vip", "gold", OTHER_TENANTS}


def test_a_tenant_at_its_share_of_the_streams_takes_a_free_slot_never_a_place_in_line() -> None:
    gate = machine({})
    held = [gate.arrive(Request(10, 8, tenant="heavy"), 0.0).ticket for _ in range(4)]
    for ticket in held:
        assert ticket is not None
        gate.first_token(ticket, 0.05)
    light = gate.arrive(Request(10, 8, tenant="light"), 0.1)
    # All four slots are heavy's: light may wait for the soonest end, within its slack.
    assert gate.ledger.next_release_s(0.1) < SLO_S
    assert light.decision.outcome is Outcome.DEFER
    heavy = gate.arrive(Request(10, 8, tenant="heavy"), 0.1)
    # heavy holds more than its half of the streams while light is active: no wait for it.
    assert heavy.decision.outcome is Outcome.REJECT
    assert heavy.decision.reasons == (Reason.CONCURRENCY, Reason.TENANT_SHARE)
    assert heavy.decision.retry_after_s == pytest.approx(gate.ledger.next_release_s(0.1))
    assert held[0] is not None
    (resolution,) = gate.release(held[0], 0.2)
    assert resolution.waiter is light.waiter
    assert resolution.ticket is not None
    # Without tenants the same arrival waits for the soonest end like any other.
    plain = machine(None)
    for _ in range(4):
        plain.arrive(Request(10, 8), 0.0)
    assert plain.arrive(Request(10, 8), 0.1).decision.outcome is Outcome.DEFER


def test_a_wait_for_a_slot_overlaps_the_queue_it_would_wait_behind() -> None:
    """The prompts queued ahead prefill while it waits for the soonest end: once the slot is
    its own only its own prefill is left, so it may wait when that end plus its prefill fits
    the SLO, though the end plus its whole predicted TTFT would not."""
    gate = machine({})
    held = [gate.arrive(Request(100, 8, tenant="heavy"), 0.0).ticket for _ in range(4)]
    end = gate.ledger.next_release_s(0.1)
    light = gate.arrive(Request(10, 8, tenant="light"), 0.1)
    assert end + light.decision.predicted_ttft_quantile_s > SLO_S  # the two waits overlap
    assert light.decision.outcome is Outcome.DEFER
    assert light.waiter is not None
    assert light.waiter.deadline >= 0.1 + end
    for ticket in held:  # their prompts prefill one after the other, as predicted
        assert ticket is not None
        assert gate.first_token(ticket, ticket.predicted_ttft_s) == []
    assert held[0] is not None
    (resolution,) = gate.release(held[0], 0.1 + end)
    assert resolution.waiter is light.waiter
    assert resolution.ticket is not None
    assert resolution.decision.predicted_ttft_quantile_s <= SLO_S
