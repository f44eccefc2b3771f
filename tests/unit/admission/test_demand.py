"""Offered demand without retries, and the capacity it is divided by: ``slogate_admission.demand``."""

from __future__ import annotations

import heapq
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, Request
from slogate_admission.demand import (
    RETRY_GRACE_S,
    Attempt,
    Counted,
    DemandBook,
    RetryMemory,
    offered_work_s,
    reference_capacity,
)
from slogate_admission.derivation import derive_thresholds
from slogate_admission.retry import effective_arrival_rate
from slogate_admission.schema import Policy


def test_reference_capacity_is_the_derived_mu_in_requests_and_prompt_tokens() -> None:
    thresholds = derive_thresholds(
        Policy.model_validate({"slo": {"ttftSeconds": 2}}), smollm2_profile(), derived_at=NOW
    )
    capacity = reference_capacity(thresholds)
    assert capacity.requests_per_second == thresholds.throughput_rps
    assert capacity.prompt_tokens_per_second == thresholds.throughput_rps * thresholds.reference_prompt_tokens


def test_a_recalibration_moves_the_capacity() -> None:
    """A slower server (every prefill and decode twice as long) halves what a pod sustains."""
    policy = Policy.model_validate({"slo": {"ttftSeconds": 4}})
    fast = smollm2_profile()
    slow = fast.model_copy(
        update={
            "prefill": fast.prefill.model_copy(
                update={"intercept_s": 2 * fast.prefill.intercept_s, "linear_s": 2 * fast.prefill.linear_s,
                        "quadratic_s": 2 * fast.prefill.quadratic_s}
            ),
            "decode": tuple(p.model_copy(update={"tokens_per_second": p.tokens_per_second / 2}) for p in fast.decode),
        }
    )  # fmt: skip
    before = reference_capacity(derive_thresholds(policy, fast, derived_at=NOW))
    after = reference_capacity(derive_thresholds(policy, slow, derived_at=NOW))
    assert after.requests_per_second == pytest.approx(before.requests_per_second / 2, rel=1e-9)


def test_the_reference_request_costs_one_over_the_derived_mu() -> None:
    """offered_work_s prices the reference request at 1 / throughputRps: demand and capacity
    are one cost model, so ρ = Σ work / s is λ / μ for the reference mix."""
    for policy in (
        {"slo": {"ttftSeconds": 2}},
        {"slo": {"ttftSeconds": 2, "timePerOutputTokenSeconds": 0.05}, "concurrency": {"max": 3}},
        {"classes": [{"name": "hi", "ttftSeconds": 1, "reservedSlots": 1}, {"name": "lo", "ttftSeconds": 8}]},
    ):
        t = derive_thresholds(Policy.model_validate(policy), smollm2_profile(), derived_at=NOW)
        work = offered_work_s(GateConfig.from_thresholds(t), t.reference_prompt_tokens, t.reference_output_tokens)
        assert work == pytest.approx(1 / t.throughput_rps, rel=1e-9), policy


def test_work_grows_with_prompt_and_output_and_moves_with_a_recalibration() -> None:
    policy = Policy.model_validate({"slo": {"ttftSeconds": 4}})
    fast = smollm2_profile()
    config = GateConfig.from_thresholds(derive_thresholds(policy, fast, derived_at=NOW))
    assert offered_work_s(config, 0, 0) == pytest.approx(config.prefill.seconds(0))
    assert offered_work_s(config, 100, 10) < offered_work_s(config, 400, 10) < offered_work_s(config, 400, 200)
    slow = fast.model_copy(
        update={
            "decode": tuple(p.model_copy(update={"tokens_per_second": p.tokens_per_second / 2}) for p in fast.decode)
        }
    )
    slower = GateConfig.from_thresholds(derive_thresholds(policy, slow, derived_at=NOW))
    decode_fast = offered_work_s(config, 0, 100) - offered_work_s(config, 0, 0)
    decode_slow = offered_work_s(slower, 0, 100) - offered_work_s(slower, 0, 0)
    assert decode_slow == pytest.approx(2 * decode_fast, rel=1e-9)


def test_the_issue_example_two_pods_worth_at_target_0_7_asks_for_three() -> None:
    """Twice one pod's sustainable rate of any one request is two pods' worth of work: 3 pods at 0.7."""
    t = derive_thresholds(Policy.model_validate({"slo": {"ttftSeconds": 2}}), smollm2_profile(), derived_at=NOW)
    config = GateConfig.from_thresholds(t)
    cost = offered_work_s(config, 64, 32)
    rate = 2 / cost  # requests/s: twice what one pod sustains of this request
    assert math.ceil(rate * cost / 0.7) == 3


def test_a_declared_retry_is_a_retry_and_a_first_try_is_not() -> None:
    memory = RetryMemory()
    assert not memory.is_retry(Attempt(), 0.0)
    assert not memory.is_retry(Attempt(retry_count=0), 0.0)
    assert memory.is_retry(Attempt(retry_count=1), 0.0)
    assert memory.is_retry(Attempt(key="k", retry_count=2), 0.0)


def test_a_refused_key_is_a_retry_until_its_retry_after_plus_grace() -> None:
    memory = RetryMemory()
    attempt = Attempt(key="request-1")
    assert not memory.is_retry(attempt, 10.0)
    memory.refused(attempt, retry_after_s=3.0, now=10.0)
    assert memory.is_retry(attempt, 10.0 + 3.0 + RETRY_GRACE_S - 0.001)
    assert not memory.is_retry(Attempt(key="request-2"), 11.0)
    assert not memory.is_retry(attempt, 10.0 + 3.0 + RETRY_GRACE_S)
    assert len(memory) == 0


def test_a_second_refusal_extends_the_memory_and_a_keyless_refusal_leaves_nothing() -> None:
    memory = RetryMemory(grace_s=0.0)
    memory.refused(Attempt(key="k"), 5.0, now=0.0)
    memory.refused(Attempt(key="k"), 5.0, now=4.0)  # until 9, not 5
    assert memory.is_retry(Attempt(key="k"), 6.0)
    assert not memory.is_retry(Attempt(key="k"), 9.0)
    memory.refused(Attempt(), 5.0, now=10.0)
    assert len(memory) == 0


def test_the_memory_is_bounded_and_forgets_the_soonest_to_expire_first() -> None:
    memory = RetryMemory(grace_s=0.0, max_keys=3)
    for i, retry_after in enumerate([9.0, 1.0, 5.0, 7.0]):
        memory.refused(Attempt(key=f"k{i}"), retry_after, now=0.0)
    assert len(memory) == 3
    assert [memory.is_retry(Attempt(key=f"k{i}"), 0.5) for i in range(4)] == [True, False, True, True]


@settings(max_examples=50, deadline=None)
@given(
    unique=st.integers(min_value=1, max_value=300),
    refuse_every=st.integers(min_value=2, max_value=5),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_retries_with_keys_to_one_gate_count_each_request_once(unique: int, refuse_every: int, seed: int) -> None:
    """Every refused request retries (same key) after its 1 s Retry-After, arrivals in time order:
    arrivals exceed the unique requests by the spec's 1 / (1 − p), first tries count each once."""
    rng = random.Random(seed)
    memory = RetryMemory()
    tries = [(rng.uniform(0.0, 60.0), f"r{i}") for i in range(unique)]
    heapq.heapify(tries)
    first_tries, arrivals, refusals = 0, 0, 0
    while tries:
        now, key = heapq.heappop(tries)
        arrivals += 1
        if not memory.is_retry(Attempt(key=key), now):
            first_tries += 1
        if rng.randrange(refuse_every) == 0:
            refusals += 1
            memory.refused(Attempt(key=key), retry_after_s=1.0, now=now)
            heapq.heappush(tries, (now + 1.0 + rng.uniform(0.0, 8.0), key))  # the SDK's jittered backoff
    assert first_tries == unique
    assert arrivals == unique + refusals
    assert effective_arrival_rate(unique, refusals / arrivals) == pytest.approx(arrivals)


def test_the_book_counts_first_tries_as_demand_and_retries_apart() -> None:
    t = derive_thresholds(Policy.model_validate({"slo": {"ttftSeconds": 2}}), smollm2_profile(), derived_at=NOW)
    config = GateConfig.from_thresholds(t)
    book = DemandBook()
    first = book.count(retry=False, request=Request(200, 64), config=config)
    again = book.count(retry=True, request=Request(200, 64), config=config)
    other = book.count(retry=False, request=Request(-5, 32), config=config)  # an estimate never counts below 0
    assert first == Counted(False, 200, offered_work_s(config, 200, 64))
    assert again == Counted(True, 200, first.work_s)  # priced alike, counted apart
    assert other == Counted(False, 0, offered_work_s(config, 0, 32))
    assert (book.offered_requests, book.offered_prompt_tokens, book.retried_requests) == (2, 200, 1)
    assert book.offered_work_s == first.work_s + other.work_s


def test_the_book_prices_nothing_without_a_config() -> None:
    book = DemandBook()
    assert book.count(retry=False, request=Request(512, 256), config=None) == Counted(False, 512, 0.0)
    assert (book.offered_requests, book.offered_work_s) == (1, 0.0)


def test_a_key_the_book_refused_is_a_retry_until_its_retry_after_and_grace_end() -> None:
    book = DemandBook()
    attempt = Attempt(key="idempotency-key:a", retry_count=None)
    assert not book.is_retry(attempt, 10.0)
    book.refused(attempt, 3.0, 10.0)
    assert book.is_retry(attempt, 10.0 + 3.0 + RETRY_GRACE_S - 0.001)
    assert not book.is_retry(attempt, 10.0 + 3.0 + RETRY_GRACE_S)
    assert book.is_retry(Attempt(key=None, retry_count=1), 0.0)  # a try that says it is one
