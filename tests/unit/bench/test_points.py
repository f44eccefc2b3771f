"""Runs grouped into points, each scored against the clairvoyant bound of the traces it was sent."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from canned_profiles import smollm2_profile
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_bench.reports.points import find, points, trace_bounds
from slogate_sim.capacity import ServerModel
from slogate_sim.clairvoyant import bound_for_trace
from slogate_sim.workloads import preset, schedule

PROFILE = smollm2_profile()
THRESHOLDS = derive_thresholds(
    Policy.model_validate({"slo": {"ttftSeconds": 2.0}}), PROFILE, derived_at=datetime(2026, 1, 1, tzinfo=UTC)
)


def run(scenario: str, seed: int, goodput: float, retry: str = "none") -> dict[str, Any]:
    return {"scenario": scenario, "workload": "chat", "load": 2.0, "retry": retry, "seed": seed,
            "schedule_seed": 1000 * seed + 200, "rate_rps": 1.5, "goodput_rps": goodput}  # fmt: skip


RAW = {
    "slo_s": 2.0,
    "seconds": 20.0,
    "runs": [
        run("slogate", 2, 0.9),
        run("slogate", 1, 1.0),
        run("count-cap", 1, 0.8),
        run("count-cap", 2, 0.7),
        run("slogate", 1, 0.5, retry="backoff"),
    ],
}


def test_each_distinct_trace_gets_one_bound_the_same_as_its_schedule_gives() -> None:
    bounds = trace_bounds(RAW, PROFILE, THRESHOLDS)
    assert set(bounds) == {("chat", 2.0, 1), ("chat", 2.0, 2)}  # fronts share traces; retries are no trace
    arrivals = schedule(1.5, 20.0, preset("chat"), seed=1200)
    direct = bound_for_trace(ServerModel.from_profile(PROFILE), THRESHOLDS.concurrency_cap, arrivals, 2.0, 20.0)
    assert bounds["chat", 2.0, 1] == direct


def test_a_point_holds_its_runs_in_seed_order_and_its_shares_of_the_bound() -> None:
    bounds = trace_bounds(RAW, PROFILE, THRESHOLDS)
    grouped = points(RAW, bounds)
    gate = find(grouped, "chat", "slogate", 2.0)
    assert gate is not None
    assert [r["seed"] for r in gate.runs] == [1, 2]
    assert gate.goodput.mean == pytest.approx(0.95)
    share = gate.share_of_clairvoyant
    assert share is not None
    expected = [
        1.0 / bounds["chat", 2.0, 1].clairvoyant_goodput_rps,
        0.9 / bounds["chat", 2.0, 2].clairvoyant_goodput_rps,
    ]
    assert share.mean == pytest.approx(sum(expected) / 2)
    retried = find(grouped, "chat", "slogate", 2.0, "backoff")
    assert retried is not None
    assert retried.bounds == ()  # a retried run's arrivals are not its trace: no bound
    assert retried.share_of_clairvoyant is None
    assert math.isnan(retried.goodput.half_width)  # one run: no interval


def test_without_bounds_a_point_still_has_its_intervals() -> None:
    grouped = points(RAW)
    cap = find(grouped, "chat", "count-cap", 2.0)
    assert cap is not None
    assert cap.clairvoyant is None
    assert cap.goodput.mean == pytest.approx(0.75)
    assert cap.goodput.half_width == pytest.approx(12.706 * 0.0707106781 / math.sqrt(2), rel=1e-6)
