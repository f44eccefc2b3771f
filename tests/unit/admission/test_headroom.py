"""A gate's load and room as a router reads them: the core's ``headroom``, against the
formula by hand and against ``decide``'s own verdicts."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Reason, Request, decide
from slogate_admission.derivation import derive_thresholds
from slogate_admission.gate_machine import GateMachine
from slogate_admission.headroom import Headroom, admit_now_tokens, headroom, kv_usage
from slogate_admission.schema import Policy, Thresholds


def two_classes() -> Thresholds:
    """interactive (1 s, one slot reserved) above batch (10 s, the default class)."""
    policy = Policy.model_validate(
        {
            "concurrency": {"max": 4},
            "classes": [{"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1}, {"name": "batch", "ttftSeconds": 10}],
        }
    )  # fmt: skip
    return derive_thresholds(policy, smollm2_profile(), derived_at=NOW)


def loaded(thresholds: Thresholds | None = None, live_rate: float | None = None) -> GateMachine:
    machine = GateMachine(lambda _now: live_rate)
    machine.load(thresholds or two_classes(), 0.0)
    return machine


def by_hand(t: Thresholds, margin: float, rate: float, queued: float, class_name: str | None = None) -> float:
    """max(min(budget, SLO) / m · R − queued, 0) for the class (default: the default class)."""
    klass = next(c for c in t.classes if c.name == (class_name or t.default_class))
    return max(min(klass.ttft_budget_seconds, klass.ttft_slo_seconds) / margin * rate - queued, 0.0)


def test_a_gate_without_thresholds_shows_no_room_at_all() -> None:
    assert headroom(GateMachine(), 0.0) == Headroom(0, 0, 1.0, math.inf, 0.0)


def test_a_gate_whose_owner_admits_nothing_shows_no_room_but_its_load() -> None:
    machine = loaded()
    assert machine.arrive(Request(60, 50), 0.0).ticket is not None
    assert headroom(machine, 0.0).admit_now_tokens > 0
    assert headroom(machine, 0.0, admitting=False) == Headroom(0, 1, 1.0, math.inf, 0.0)


def test_an_idle_gate_has_the_default_class_budget_as_room() -> None:
    t = two_classes()
    machine = loaded(t)
    assert machine.errors is not None
    margin = machine.errors.margin(t.default_class)
    room = headroom(machine, 1.0)
    assert (room.waiting, room.running, room.kv_usage, room.queue_wait_s) == (0, 0, 0.0, 0.0)
    assert room.admit_now_tokens == by_hand(t, margin, t.prefill_tokens_per_second, 0.0)
    assert room.admit_now_tokens > 0


def test_admitted_prompts_take_exactly_their_tokens_from_the_room_and_first_tokens_give_them_back() -> None:
    t = two_classes()
    machine = loaded(t)
    idle = headroom(machine, 0.0).admit_now_tokens
    first = machine.arrive(Request(60, 50), 0.0)
    second = machine.arrive(Request(90, 50), 0.0)
    assert first.ticket is not None
    assert second.ticket is not None
    room = headroom(machine, 0.0)
    assert room.admit_now_tokens == idle - 150
    assert room.running == 2
    assert room.queue_wait_s == 150 / t.prefill_tokens_per_second
    assert room.kv_usage == (110 + 140) / t.kv_capacity_tokens
    machine.first_token(first.ticket, 0.5)
    assert headroom(machine, 0.5).admit_now_tokens == idle - 90
    assert headroom(machine, 0.5).running == 2  # still decoding
    machine.release(first.ticket, 1.0)
    machine.release(second.ticket, 1.0)
    assert headroom(machine, 1.0) == Headroom(0, 0, 0.0, 0.0, idle)


def test_the_room_uses_the_rate_decisions_use_live_and_divided_by_the_bias() -> None:
    t = two_classes()
    machine = loaded(t, live_rate=500.0)
    assert machine.errors is not None
    margin = machine.errors.margin(t.default_class)
    ticket = machine.arrive(Request(400, 10), 0.0).ticket
    assert ticket is not None
    assert headroom(machine, 0.0).queue_wait_s == 400 / 500.0
    assert headroom(machine, 0.0).admit_now_tokens == by_hand(t, margin, 500.0, 400)
    # First tokens taught the gate that, with one stream in service, prefill runs twice as slow.
    machine.errors.bias.factors[machine.errors.bias.bucket(1)] = 2.0
    assert headroom(machine, 0.0).queue_wait_s == 400 / 250.0
    assert headroom(machine, 0.0).admit_now_tokens == by_hand(t, margin, 250.0, 400)


def test_deferred_requests_are_waiting_and_the_room_is_floored_at_zero() -> None:
    t = two_classes()
    machine = loaded(t)
    held = [machine.arrive(Request(100, 20, "batch"), 0.0) for _ in range(3)]  # the batch class's cap
    assert all(v.ticket is not None for v in held)
    deferred = machine.arrive(Request(100, 20, "batch"), 0.0)
    assert deferred.waiter is not None
    assert headroom(machine, 0.0).waiting == 1
    # A queue far beyond the budget: no room, never negative.
    machine.ledger.queued_prefill_tokens += int(100 * t.prefill_tokens_per_second)
    assert headroom(machine, 0.0).admit_now_tokens == 0.0


def test_kv_usage_is_reserved_over_capacity_and_never_above_one() -> None:
    assert kv_usage(0, 8192) == 0.0
    assert kv_usage(2048, 8192) == 0.25
    assert kv_usage(9000, 8192) == 1.0
    assert kv_usage(10, 0) == 1.0
    t = two_classes()
    machine = loaded(t)
    assert machine.arrive(Request(50, 1000), 0.0).ticket is not None
    # New thresholds with a smaller cache than what admitted requests already hold.
    machine.load(t.model_copy(update={"kv_capacity_tokens": 1024}), 0.0)
    assert headroom(machine, 0.0).kv_usage == 1.0


@settings(max_examples=300, deadline=None)
@given(
    queued=st.floats(0, 20_000),
    rate=st.floats(50, 5_000),
    margin=st.floats(1.0, 3.0),
    streams=st.integers(0, 3),
    class_name=st.sampled_from([None, "interactive", "batch"]),
)
def test_the_room_is_decides_max_queued_for_an_empty_prompt(
    queued: float, rate: float, margin: float, streams: int, class_name: str | None
) -> None:
    t = two_classes()
    config = GateConfig.from_thresholds(t)
    state = LiveState(queued_prefill_tokens=queued, streams=streams, prefill_tokens_per_s=rate, ttft_margin=margin)
    room = admit_now_tokens(config, state, class_name)
    assert math.isclose(room, by_hand(t, margin, rate, queued, class_name), rel_tol=1e-12, abs_tol=1e-9)
    # Room left: the empty prompt passes its TTFT predicate; refused on TTFT: no room left.
    refused = Reason.TTFT in decide(config, Request(0, 1, class_name), state, 0.0).reasons
    assert refused == (queued > by_hand(t, margin, rate, 0.0, class_name))
    assert not (refused and room > 0)


@settings(max_examples=200, deadline=None)
@given(queued=st.floats(0, 3_000))
def test_a_prompt_fits_on_ttft_while_its_own_prefill_fits_in_the_room(queued: float) -> None:
    """n prompt tokens pass the TTFT predicate iff T_prefill(n) · R_calibrated ≤ the room."""
    t = two_classes()
    config = GateConfig.from_thresholds(t)
    state = LiveState(queued_prefill_tokens=queued)
    room = admit_now_tokens(config, state)

    def own_in_tokens(n: int) -> float:
        return config.prefill.seconds(n) * config.prefill_tokens_per_s

    # The largest n whose own prefill fits (T_prefill grows with n: bisect).
    low, high = 0, 100_000
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if own_in_tokens(middle) <= room * (1 - 1e-9) else (low, middle - 1)
    if low > 0:
        assert Reason.TTFT not in decide(config, Request(low, 1), state, 0.0).reasons
    assert own_in_tokens(low + 1) > room * (1 + 1e-9)  # one token more no longer fits
    assert Reason.TTFT in decide(config, Request(low + 1, 1), state, 0.0).reasons
