"""The simulator's dynamic fleets: time-varying load, pods that start and stop, retrying clients
counted as the sidecar counts them, and the autoscaler's signals on small runs."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest

from chat_fleet import CHAT, SERVER, SLO_S, thresholds
from project_files import ROOT
from slogate_admission.demand import offered_work_s
from slogate_admission.scale_up import lasting_demand_window_s
from slogate_bench.reports import autoscaling as autoscale_report
from slogate_sim.arrivals import RateCurve, arrivals
from slogate_sim.capacity import capacity_rps
from slogate_sim.engine import simulate
from slogate_sim.fleet import OUTCOMES, Autoscaling, FleetRecord, RetryingClients
from slogate_sim.fronts import Gated, SlogateFront
from slogate_sim.hpa import HpaSpec, Signal
from slogate_sim.load_shapes import oracle_replicas, pod_seconds, recovery_s, steady_mask
from slogate_sim.routing import Routing
from slogate_sim.scenario import SimulationConfig, SimulationResult

MU = capacity_rps(SERVER, CHAT, thresholds().concurrency_cap)


def run(**settings: Any) -> tuple[SimulationResult, FleetRecord]:
    """Simulate ``configure(**settings)``: gated pods at a load x their summed μ, least-requests routing."""
    result = simulate(configure(**settings))
    assert result.fleet is not None
    return result, result.fleet


def configure(
    *,
    load: float,
    replicas: int,
    duration_s: float,
    signal: Signal = "slogate",
    plan: tuple[tuple[float, int], ...] = (),
    clients: RetryingClients | None = None,
    curve: RateCurve | None = None,
    seed: int = 5,
    autoscaled: bool = True,
    up_window_s: float = 0.0,
) -> SimulationConfig:
    """The configuration ``run`` simulates."""
    hpa = HpaSpec(1, 20, up_window_s=up_window_s)
    scaling = Autoscaling(signal, 0.7 if signal != "waiting" else 5.0, hpa, startup_s=30.0, plan=plan)
    return SimulationConfig(
        server=SERVER, workload=CHAT, arrival_rate_rps=load * replicas * MU, duration_s=duration_s,
        ttft_slo_s=SLO_S, front=Gated(thresholds()), seed=seed, replicas=replicas,
        routing=Routing("least-requests"), rate_curve=curve, autoscaling=scaling if autoscaled else None,
        clients=clients,
    )  # fmt: skip


# --------------------------------------------------------------------------- load


def test_thinning_follows_a_step_in_the_rate() -> None:
    curve = RateCurve((0.0, 1000.0, 1000.0), (2.0, 2.0, 6.0))
    config = SimulationConfig(
        server=SERVER, workload=CHAT, arrival_rate_rps=2.0, duration_s=2000.0, ttft_slo_s=SLO_S, rate_curve=curve
    )
    times = np.array([a[0] for a in arrivals(config)])
    before, after = np.sum(times < 1000.0), np.sum(times >= 1000.0)
    assert abs(before - 2000) < 4 * math.sqrt(2000)  # Poisson: within four standard deviations
    assert abs(after - 6000) < 4 * math.sqrt(6000)
    assert np.all(np.diff(times) >= 0)
    assert times[-1] <= 2000.0


def test_a_rate_curve_must_start_at_zero_and_not_go_back() -> None:
    with pytest.raises(ValueError, match="start at 0"):
        RateCurve((1.0, 2.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="start at 0"):
        RateCurve((0.0, 5.0, 4.0), (1.0, 1.0, 1.0))


def test_a_fleet_that_changes_size_needs_a_router_that_sees_every_pod() -> None:
    scaling = Autoscaling("slogate", 0.7, HpaSpec(1, 4))
    with pytest.raises(ValueError, match="least-requests"):
        SimulationConfig(
            server=SERVER, workload=CHAT, arrival_rate_rps=1.0, duration_s=10.0, ttft_slo_s=SLO_S,
            front=Gated(thresholds()), routing=Routing("random"), autoscaling=scaling,
        )  # fmt: skip


# --------------------------------------------------------------------------- pods start and stop


PLAN = ((0.0, 2), (60.0, 6), (300.0, 2))
"""Two pods, six from t = 60 s (four new ones ready at 90 s), two again from 300 s."""


def test_pods_get_requests_only_while_ready_and_not_stopping() -> None:
    _result, record = run(load=1.5, replicas=2, duration_s=600.0, plan=PLAN)
    assert record.misrouted == 0
    assert len(record.pods) == 6
    created = [p[0] for p in record.pods]
    ready = [p[1] for p in record.pods]
    assert created == [0.0, 0.0, 60.0, 60.0, 60.0, 60.0]
    assert ready == [0.0, 0.0, 90.0, 90.0, 90.0, 90.0]
    # The youngest ready pods go first: the four new ones stop at 300 s, the first two never.
    stops = [p[2] for p in record.pods]
    assert all(math.isnan(s) for s in stops[:2])
    assert stops[2:] == [300.0] * 4
    assert all(n > 0 for n in record.pod_tries)  # every pod was used while it was ready


def test_a_stopped_pod_finishes_what_it_holds_and_every_request_is_accounted_for() -> None:
    result, record = run(load=1.5, replicas=2, duration_s=600.0, plan=PLAN)
    ended = [p[3] for p in record.pods[2:]]
    assert all(e >= 300.0 for e in ended)
    assert any(e > 300.0 for e in ended)  # busy pods drained after being told to stop
    assert len(record.outcomes) == result.offered == record.unique
    assert result.completed + result.rejected + result.timed_out == result.offered


def test_pod_seconds_run_from_creation_to_the_end_of_draining() -> None:
    _result, record = run(load=1.5, replicas=2, duration_s=600.0, plan=PLAN)
    by_hand = 2 * 600.0 + sum(p[3] - 60.0 for p in record.pods[2:])
    assert pod_seconds(record.pods, 0.0, 600.0) == pytest.approx(by_hand)
    # Measured from 200 s: the new pods count from then.
    assert pod_seconds(record.pods, 200.0, 600.0) == pytest.approx(
        2 * 400.0 + sum(p[3] - 200.0 for p in record.pods[2:])
    )


def test_a_pod_stopped_before_it_is_ready_never_gets_a_request_and_is_gone_at_once() -> None:
    _result, record = run(load=1.0, replicas=2, duration_s=300.0, plan=((0.0, 2), (60.0, 4), (75.0, 2)))
    assert record.misrouted == 0
    assert [p[2] for p in record.pods[2:]] == [75.0, 75.0]
    assert [p[3] for p in record.pods[2:]] == [75.0, 75.0]
    assert all(math.isnan(p[1]) for p in record.pods[2:])
    assert record.pod_tries[2:] == (0, 0)


# --------------------------------------------------------------------------- retrying clients


def test_counted_retries_leave_first_try_demand_at_the_unique_arrivals() -> None:
    result, record = run(load=3.0, replicas=2, duration_s=600.0, plan=((0.0, 2),), clients=RetryingClients(2))
    assert record.counted_first == record.unique == result.offered
    assert record.work_first == pytest.approx(record.work_unique)
    assert record.counted_all > record.unique  # the refused came back
    assert record.counted_all == result.tries


def test_keyed_retries_that_land_elsewhere_inflate_first_try_demand() -> None:
    result, record = run(
        load=3.0, replicas=2, duration_s=600.0, plan=((0.0, 2),), clients=RetryingClients(2, say_count=False)
    )
    assert record.unique == result.offered
    assert record.unique < record.counted_first <= record.counted_all
    assert record.work_first > record.work_unique > 0


def test_clients_that_retry_are_refused_less_in_the_end() -> None:
    plain, _ = run(load=3.0, replicas=2, duration_s=600.0, plan=((0.0, 2),), clients=None, autoscaled=True)
    retried, record = run(load=3.0, replicas=2, duration_s=600.0, plan=((0.0, 2),), clients=RetryingClients(2))
    assert plain.offered == retried.offered  # the same arrivals
    assert retried.rejected < plain.rejected
    assert record.unique < record.counted_all <= 3 * record.unique  # two retries at most


# --------------------------------------------------------------------------- signals


def test_each_sync_reads_its_signal_and_the_fleet_follows_it() -> None:
    signals: tuple[Signal, ...] = ("cpu", "waiting", "slogate", "slogate-all-tries", "slogate-reference")
    for signal in signals:
        _, record = run(load=2.0, replicas=2, duration_s=300.0, signal=signal)
        assert [t[0] for t in record.ticks] == [15.0 * k for k in range(1, 21)]
        for (_, before, ready, _, after), (_, nxt, _, _, _) in zip(record.ticks, record.ticks[1:], strict=False):
            assert ready <= before
            assert nxt == after
        values = [t[3] for t in record.ticks if not math.isnan(t[3])]
        assert values
        assert all(v >= 0 for v in values)
        if signal == "cpu":
            assert all(v <= 1.0 + 1e-9 for v in values)


def test_every_try_reads_at_least_the_first_tries_on_the_same_fleet() -> None:
    plan = ((0.0, 2),)
    _, first = run(load=3.0, replicas=2, duration_s=300.0, plan=plan, clients=RetryingClients(2))
    _, every = run(load=3.0, replicas=2, duration_s=300.0, plan=plan, clients=RetryingClients(2),
                   signal="slogate-all-tries")  # fmt: skip
    pairs = list(zip((t[3] for t in first.ticks), (t[3] for t in every.ticks), strict=True))
    assert all(b >= a for a, b in pairs)
    assert any(b > a for a, b in pairs)


def test_slogate_reads_each_first_try_priced_as_the_sidecar_prices_it() -> None:
    # Every pod runs the same thresholds and nobody retries: each arrival is a first try at its
    # arrival time, and the signal at a sync is Σ offered_work_s(config, n_in, n_out) over the
    # last 60 s (the n_out the gate books: the arrival's max_tokens) per second.
    config = configure(load=1.5, replicas=2, duration_s=600.0, plan=((0.0, 2),))
    record = simulate(config).fleet
    assert record is not None
    gate = SlogateFront(thresholds()).machine.config
    times, prices = [], []
    for at, n_in, n_out, _ in arrivals(config):
        times.append(at)
        prices.append(offered_work_s(gate, n_in, n_out))
    t, price = np.array(times), np.array(prices)
    assert record.work_unique == pytest.approx(float(np.sum(price)), rel=1e-9)
    for now, _, _, value, _ in record.ticks:
        inside = (t > now - 60.0) & (t <= now)
        assert value == pytest.approx(float(np.sum(price[inside])) / min(now, 60.0), rel=1e-9)


def test_slogate_reads_the_load_in_pods() -> None:
    # At 2x the capacity of 2 pods, ρ is 4 pods' worth; the 60 s window's mean over 20 min is close.
    _, record = run(load=2.0, replicas=2, duration_s=1200.0, plan=((0.0, 2),), signal="slogate", seed=9)
    values = [t[3] for t in record.ticks if t[0] >= 60.0]
    assert float(np.mean(values)) == pytest.approx(4.0, rel=0.1)


def test_the_reference_request_ratio_over_reads_a_mix_of_cheaper_requests() -> None:
    # The chat mix's requests are shorter than the policy's reference request (512 / 256).
    plan = ((0.0, 2),)
    _, cost = run(load=1.0, replicas=2, duration_s=600.0, plan=plan)
    _, reference = run(load=1.0, replicas=2, duration_s=600.0, plan=plan, signal="slogate-reference")
    assert [t[2] for t in cost.ticks] == [t[2] for t in reference.ticks]  # the same fleet
    pairs = [(a[3], b[3]) for a, b in zip(cost.ticks, reference.ticks, strict=True) if a[3] > 0]
    assert pairs
    assert all(b > 1.5 * a for a, b in pairs)


def test_an_hpa_on_slogate_grows_an_overloaded_fleet_and_shrinks_an_idle_one() -> None:
    _, grown = run(load=3.0, replicas=2, duration_s=600.0, signal="slogate")
    assert grown.ticks[-1][4] >= 6  # ρ = 6 pods' worth at target 0.7: ⌈6 / 0.7⌉ = 9
    _, shrunk = run(load=0.03, replicas=8, duration_s=900.0, signal="slogate")
    assert shrunk.ticks[-1][4] == 1  # ρ = 0.24: min replicas, after the 300 s window


def test_a_scale_up_window_scales_up_later_and_less_on_a_spike() -> None:
    # 4x for 30 s from t = 300 s. The 60 s rate window stretches the spike's demand over 90 s;
    # a 60 s scale-up window takes the least recommendation of its last 60 s, so it scales up
    # later, and only to what the signal held for a whole 60 s.
    spike = RateCurve((0.0, 300.0, 300.0, 330.0, 330.0), (1.0, 1.0, 4.0, 4.0, 1.0))
    at = 0.5 * 2 * MU  # 1x: half of two pods' capacity
    curve = RateCurve(spike.times_s, tuple(at * x for x in spike.rates_rps))
    runs = {w: run(load=0.5, replicas=2, duration_s=600.0, curve=curve, up_window_s=w)[1] for w in (0.0, 60.0)}
    before = [t[4] for t in runs[0.0].ticks if t[0] < 300.0]
    assert before == [t[4] for t in runs[60.0].ticks if t[0] < 300.0]

    def first_up(record: FleetRecord) -> float:
        return next(t[0] for t in record.ticks if t[0] >= 300.0 and t[4] > max(before))

    assert first_up(runs[0.0]) < first_up(runs[60.0])
    assert max(t[4] for t in runs[60.0].ticks) < max(t[4] for t in runs[0.0].ticks)
    assert len(runs[60.0].pods) < len(runs[0.0].pods)


def test_the_derived_window_buys_no_pod_for_a_spike_shorter_than_a_start_up_and_pods_for_a_step() -> None:
    """The operator's default window (``scale_up``: start-up 30 s + the 60 s rate window + a
    15 s sync): 4x for 30 s buys nothing; 4x that lasts buys pods, later than with no window."""
    window = lasting_demand_window_s(30.0, 60.0, 15.0)
    at = 0.5 * 2 * MU  # 1x: half of two pods' capacity
    spike = RateCurve((0.0, 300.0, 300.0, 330.0, 330.0), tuple(at * x for x in (1.0, 1.0, 4.0, 4.0, 1.0)))
    step = RateCurve((0.0, 300.0, 300.0), tuple(at * x for x in (1.0, 1.0, 4.0)))
    spiked = {w: run(load=0.5, replicas=2, duration_s=700.0, curve=spike, up_window_s=w)[1] for w in (0.0, window)}
    assert len(spiked[0.0].pods) > 2  # without the window the spike buys pods: the check can fail
    assert len(spiked[window].pods) == 2
    stepped = {w: run(load=0.5, replicas=2, duration_s=700.0, curve=step, up_window_s=w)[1] for w in (0.0, window)}
    assert len(stepped[window].pods) > 2

    def first_up(record: FleetRecord) -> float:
        return next(t[0] for t in record.ticks if t[1] > 2)

    assert 300.0 + window <= first_up(stepped[window])
    assert first_up(stepped[0.0]) < first_up(stepped[window])


# --------------------------------------------------------------------------- the report's arithmetic


def test_the_oracle_rounds_up_and_keeps_its_minimum() -> None:
    rate = np.array([0.0, 0.7, 0.71, 2.8, 2.81])
    assert oracle_replicas(rate, 0.7, 1.0, 2).tolist() == [2, 2, 2, 4, 5]


def test_steady_state_excludes_each_catch_up_after_the_oracle_moves() -> None:
    oracle = np.array([4, 4, 8, 8, 8, 8, 4, 4])
    ready = np.array([4, 4, 4, 6, 8, 8, 8, 8])
    assert steady_mask(ready, oracle, before=4).tolist() == [True, True, False, False, True, True, True, True]
    assert steady_mask(np.array([3, 3]), np.array([4, 4]), before=2).tolist() == [False, False]


def test_recovery_is_the_end_of_the_last_window_refusing_two_percent() -> None:
    arrivals_s = np.arange(0.0, 600.0, 0.1)  # 10 a second
    refused = (arrivals_s >= 100.0) & (arrivals_s < 130.0)
    # The last window holding 2 % of 600 arrivals (1.2 s of refusals) ends 60 − 1.2 s after 130 s.
    assert recovery_s(arrivals_s, refused, 100.0, 600.0) == pytest.approx(30.0 + 60.0 - 1.2, abs=1.0)
    assert recovery_s(arrivals_s, np.zeros_like(refused), 100.0, 600.0) == 0.0
    assert recovery_s(arrivals_s, arrivals_s >= 100.0, 100.0, 600.0) is None


def test_outcomes_are_named() -> None:
    assert len(OUTCOMES) == 6
    _, record = run(load=2.0, replicas=2, duration_s=200.0, plan=((0.0, 2),))
    assert set(record.outcomes) <= set(range(len(OUTCOMES)))
    assert dataclasses.is_dataclass(record)


def test_the_published_block_is_the_published_json() -> None:
    """docs/autoscaling.md's block is what reports.autoscaling renders from docs/bench/autoscaling.json
    (regenerate with `make bench-autoscale`, or re-render with `python -m slogate_bench.reports.autoscaling`)."""
    raw = json.loads((ROOT / "docs" / "bench" / "autoscaling.json").read_text())
    doc = (ROOT / "docs" / "autoscaling.md").read_text()
    start, end = doc.index(autoscale_report.BEGIN), doc.index(autoscale_report.END) + len(autoscale_report.END)
    assert doc[start:end] == autoscale_report.block(raw)
