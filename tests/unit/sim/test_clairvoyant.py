"""The clairvoyant bound: traces replayed in the simulator, known optima, and a true bound.

``on_time`` (the clairvoyant plan, replayed) <= the optimum <= ``upper_bound``: checked
by brute force over every admission subset on tiny random traces, and against the
simulated fronts (which may hold and reorder) on the benchmark's presets.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canned_profiles import smollm2_profile
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds
from slogate_admission.service import DecodeCurve, PrefillCurve
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.clairvoyant import bound_for_trace
from slogate_sim.engine import simulate
from slogate_sim.fronts import CountCapped, Direct, FrontSpec, Gated, Planned
from slogate_sim.limits import CountCap, fair_count_cap
from slogate_sim.scenario import SimulationConfig, config_for_trace, trace_of
from slogate_sim.workloads import Workload, preset, schedule

SLO_S = 2.0
SERVER = ServerModel.from_profile(smollm2_profile())
# One slot, 10 ms per prompt token, 10 ms per output token: service times read off by hand.
PLAIN = ServerModel(slots=1, prefill=PrefillCurve(0.0, 0.01), decode=DecodeCurve((100.0,)))

Trace = list[tuple[float, int, int]]


def bench_thresholds() -> Thresholds:
    """As the benchmark suite derives them: the 2 s SLO, deferrals of at most 0.5 s."""
    policy = Policy.model_validate({"slo": {"ttftSeconds": SLO_S}, "deferral": {"maxWaitSeconds": 0.5}})
    return derive_thresholds(policy, smollm2_profile(), derived_at=datetime(2026, 1, 1, tzinfo=UTC))


def on_time(server: ServerModel, trace: Trace, front: FrontSpec, *, window_s: float, slo_s: float = SLO_S) -> int:
    config = config_for_trace(server, trace, duration_s=window_s, ttft_slo_s=slo_s, front=front)
    return simulate(config).completed_within_slo


# --------------------------------------------------------------------------- traces


def test_a_trace_is_replayed_as_given_whatever_its_form() -> None:
    arrivals = schedule(2.0, 20.0, preset("chat"), seed=3)
    triples = [(a.at_s, a.prompt_tokens, a.max_tokens) for a in arrivals]
    from_schedule = simulate(config_for_trace(SERVER, arrivals, duration_s=20.0, ttft_slo_s=SLO_S, front=Direct()))
    from_triples = simulate(config_for_trace(SERVER, triples, duration_s=20.0, ttft_slo_s=SLO_S, front=Direct()))
    assert from_schedule.offered == len(arrivals) > 0
    assert from_schedule == from_triples
    assert from_schedule.arrival_rate_rps == pytest.approx(len(arrivals) / 20.0)
    # Out of order in, time order out (equal times keep their order).
    assert [a.at_s for a in trace_of([(2.0, 1, 1), (1.0, 2, 2), (1.0, 3, 3)])] == [1.0, 1.0, 2.0]
    assert [a.prompt_tokens for a in trace_of([(2.0, 1, 1), (1.0, 2, 2), (1.0, 3, 3)])] == [2, 3, 1]


def test_a_trace_beyond_its_window_or_without_token_counts_is_refused() -> None:
    with pytest.raises(ValueError, match="within"):
        config_for_trace(SERVER, [(5.0, 10, 10)], duration_s=4.0, ttft_slo_s=SLO_S, front=Direct())
    base = config_for_trace(SERVER, [(1.0, 10, 10)], duration_s=4.0, ttft_slo_s=SLO_S, front=Direct())
    exponential = Workload(service="exponential")
    with pytest.raises(ValueError, match="token counts"):
        dataclasses.replace(base, workload=exponential)
    with pytest.raises(ValueError, match=">= 0"):
        config_for_trace(SERVER, [(1.0, -1, 10)], duration_s=4.0, ttft_slo_s=SLO_S, front=Direct())


def test_an_empty_trace_has_nothing_to_serve() -> None:
    bound = bound_for_trace(SERVER, 4, [], SLO_S, 10.0)
    assert (bound.requests, bound.on_time, bound.upper_bound, bound.clairvoyant_goodput_rps) == (0, 0, 0, 0.0)
    assert math.isnan(bound.share(1.0))


# --------------------------------------------------------------------------- known optima


def test_the_big_request_first_makes_two_small_ones_miss_so_the_clairvoyant_drops_it() -> None:
    # The big one: 1.5 s of prefill, 1 s of decode, holding the only slot until 2.5 s. Each small
    # one: 0.2 s + 0.1 s. Admit the big one and both small ones wait past 2 s; drop it and both fit.
    trace: Trace = [(0.0, 150, 100), (0.1, 20, 10), (0.2, 20, 10)]
    bound = bound_for_trace(PLAIN, 1, trace, SLO_S, 1.0)
    assert on_time(PLAIN, trace, Direct(), window_s=1.0) == 1
    assert bound.plan == frozenset({1, 2})
    assert (bound.admitted, bound.on_time) == (2, 2)
    assert bound.upper_bound >= 2
    assert bound.clairvoyant_goodput_rps == 2.0  # per second of the 1 s window, as Run.goodput


def test_an_underloaded_trace_is_served_in_full_and_the_bound_is_tight() -> None:
    trace: Trace = [(5.0 * i, 100, 50) for i in range(8)]  # 1.5 s of work every 5 s
    bound = bound_for_trace(PLAIN, 1, trace, SLO_S, 40.0)
    assert bound.on_time == bound.admitted == bound.upper_bound == bound.requests == 8
    assert bound.clairvoyant_goodput_rps == bound.upper_bound_goodput_rps == 8 / 40.0
    assert bound.share(8 / 40.0) == 1.0
    assert json.loads(json.dumps(bound.as_dict()))["plan"] == list(range(8))


def test_a_prompt_whose_prefill_alone_exceeds_the_slo_is_never_on_time() -> None:
    trace: Trace = [(0.0, 250, 10), (10.0, 20, 10)]  # 2.5 s of prefill, then a small one
    bound = bound_for_trace(PLAIN, 1, trace, SLO_S, 20.0)
    assert (bound.requests, bound.feasible, bound.on_time, bound.upper_bound) == (2, 1, 1, 1)


def test_back_to_back_equal_requests_fill_the_server_and_no_more() -> None:
    # Ten 1 s requests (0.5 s + 0.5 s) at once, one slot: the k-th first token at k - 0.5 s,
    # so two meet 2 s (at 0.5 and 1.5 s). The bound: 2 s + one request's decode (0.5 s) of
    # room fits at most 2.5 / 1 = 2 whole requests.
    trace: Trace = [(0.0, 50, 50)] * 10
    bound = bound_for_trace(PLAIN, 1, trace, SLO_S, 1.0)
    assert bound.on_time == bound.upper_bound == 2


# --------------------------------------------------------------------------- orderings


@pytest.mark.parametrize("workload", ["chat", "heavy_tail"])
@pytest.mark.parametrize("load", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_front_beats_the_bound_nor_the_clairvoyant_on_the_benchmark_traces(
    workload: str, load: float, seed: int
) -> None:
    t = bench_thresholds()
    wl = preset(workload)
    mu = capacity_rps(SERVER, wl, t.concurrency_cap)
    arrivals = schedule(load * mu, 40.0, wl, seed=seed)
    bound = bound_for_trace(SERVER, t.concurrency_cap, arrivals, SLO_S, 40.0)
    trace = [(a.at_s, a.prompt_tokens, a.max_tokens) for a in arrivals]
    # The plan's every request is on time in the simulator's replay, and that replay is the plan.
    assert bound.on_time == bound.admitted == on_time(SERVER, trace, Planned(bound.plan), window_s=40.0)
    cap = fair_count_cap(t.concurrency_cap, SLO_S, t.concurrency_cap / mu)
    got = [on_time(SERVER, trace, front, window_s=40.0) for front in (Gated(t), CountCapped(cap), Direct())]
    assert bound.upper_bound >= bound.on_time >= max(got)
    if load <= 0.5:
        assert bound.on_time >= bound.feasible - 1  # underloaded: (almost) everything fits


# --------------------------------------------------------------------------- a true bound


@st.composite
def tiny_cases(draw: st.DrawFn) -> tuple[ServerModel, Trace, float]:
    """A random server (its decode curve need not be monotone) and up to 7 requests."""
    slots = draw(st.integers(1, 4))
    per_stream = tuple(draw(st.lists(st.floats(20.0, 150.0), min_size=slots, max_size=slots)))
    prefill = PrefillCurve(draw(st.floats(0.0, 0.05)), draw(st.floats(0.001, 0.01)), draw(st.sampled_from([0, 1e-6])))
    span = draw(st.sampled_from([0.5, 2.0, 5.0]))
    request = st.tuples(st.floats(0.0, span), st.integers(1, 600), st.integers(0, 128))
    trace = sorted(draw(st.lists(request, min_size=1, max_size=7)))
    return ServerModel(slots, prefill, DecodeCurve(per_stream)), trace, span


@settings(max_examples=60, deadline=None)
@given(case=tiny_cases(), slo_s=st.sampled_from([0.5, 1.0, 2.0]))
def test_brute_force_optimum_lies_between_the_clairvoyant_and_the_bound(
    case: tuple[ServerModel, Trace, float], slo_s: float
) -> None:
    server, trace, window = case
    bound = bound_for_trace(server, server.slots, trace, slo_s, window)
    best = 0
    for size in range(len(trace), 0, -1):  # the largest subsets first: stop once none can do better
        if size <= best:
            break
        for subset in itertools.combinations(range(len(trace)), size):
            best = max(best, on_time(server, trace, Planned(frozenset(subset)), window_s=window, slo_s=slo_s))
    assert bound.on_time <= best <= bound.upper_bound
    # Fronts that hold requests back are bounded too.
    for cap in (CountCap(1, 0), CountCap(server.slots, 2)):
        assert on_time(server, trace, CountCapped(cap), window_s=window, slo_s=slo_s) <= bound.upper_bound


@settings(max_examples=30, deadline=None)
@given(trace=st.lists(st.tuples(st.floats(0.0, 3.0), st.integers(16, 1000), st.integers(1, 128)), max_size=12))
def test_slogate_with_its_deferrals_never_beats_the_bound(trace: Trace) -> None:
    t = bench_thresholds()
    bound = bound_for_trace(SERVER, t.concurrency_cap, trace, SLO_S, 3.0)
    assert on_time(SERVER, sorted(trace), Gated(t), window_s=3.0) <= bound.upper_bound


def test_without_a_trace_a_config_still_needs_its_arrival_rate() -> None:
    with pytest.raises(ValueError, match="arrival_rate_rps"):
        SimulationConfig(SERVER, preset("chat"), arrival_rate_rps=0.0, duration_s=1.0, ttft_slo_s=SLO_S)
