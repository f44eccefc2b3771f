"""The HPA's algorithm on hand-computed cases: tolerance, unready pods, stabilization windows,
rate policies, min/max replicas."""

from __future__ import annotations

import pytest

from slogate_sim.hpa import Hpa, HpaSpec, RatePolicy, average_value_proposal, utilization_proposal


def test_an_average_value_target_asks_for_the_total_over_the_target_outside_the_tolerance() -> None:
    # 10 / 0.7 = 14.29: 14 pods read a ratio of 10 / 9.8 = 1.02, within 0.1: no change.
    assert average_value_proposal(10.0, 0.7, current=14) == 14
    # 10 pods read 10 / 7 = 1.43: ⌈14.29⌉ = 15.
    assert average_value_proposal(10.0, 0.7, current=10) == 15
    # 20 pods read 10 / 14 = 0.71: down to 15.
    assert average_value_proposal(10.0, 0.7, current=20) == 15
    # Just outside: 5 / (0.5 · 9) = 1.11.
    assert average_value_proposal(5.0, 0.5, current=9) == 10
    assert average_value_proposal(0.0, 0.7, current=3) == 0


def test_a_utilization_target_scales_by_the_mean_over_ready_pods() -> None:
    assert utilization_proposal([0.9, 0.9], 0, 0.7, current=2) == 3  # 1.286 · 2 = 2.57
    assert utilization_proposal([0.75, 0.75], 0, 0.7, current=2) == 2  # 1.071: within the tolerance
    assert utilization_proposal([0.2, 0.2, 0.2, 0.2], 0, 0.7, current=4) == 2  # 0.286 · 4 = 1.14
    assert utilization_proposal([], 3, 0.7, current=3) == 3  # no metrics: the sync is skipped


def test_unready_pods_count_as_idle_when_scaling_up() -> None:
    # 1.8 / 4 / 0.7 = 0.64: taken again with the 2 starting pods it is no scale-up: no change.
    assert utilization_proposal([0.9, 0.9], 2, 0.7, current=4) == 4
    # 2 / 3 / 0.7 = 0.95: within the tolerance.
    assert utilization_proposal([1.0, 1.0], 1, 0.7, current=3) == 3
    # 4 / 5 / 0.7 = 1.143: ⌈5.71⌉ = 6 (without the unready pod it would be ⌈1.43 · 4⌉ = 6 too, but from 4 ready).
    assert utilization_proposal([1.0, 1.0, 1.0, 1.0], 1, 0.7, current=5) == 6
    # 3 / 4 / 0.7 = 1.07: within the tolerance, although the ready pods alone read 1.43.
    assert utilization_proposal([1.0, 1.0, 1.0], 1, 0.7, current=4) == 4


def test_scale_up_is_limited_to_double_or_four_pods_per_period() -> None:
    hpa = Hpa(HpaSpec(1, 100))
    assert hpa.step(0.0, 20, current=2) == 6  # max(2 · 2, 2 + 4)
    assert hpa.step(5.0, 20, current=6) == 6  # 4 added within 15 s: from 2 again, still 6
    assert hpa.step(15.0, 20, current=6) == 12  # the first change is 15 s old: max(12, 10)
    assert hpa.step(30.0, 20, current=12) == 20  # max(24, 16) allows all of it
    assert hpa.step(45.0, 500, current=20) == 40


def test_scale_up_stops_at_max_replicas() -> None:
    hpa = Hpa(HpaSpec(2, 64))
    assert hpa.step(0.0, 500, current=50) == 64


def test_scale_down_waits_for_the_largest_proposal_of_the_last_five_minutes() -> None:
    hpa = Hpa(HpaSpec(1, 100))
    assert hpa.step(0.0, 10, current=10) == 10
    for t in range(15, 300, 15):  # proposals of 2, but 10 is within the window
        assert hpa.step(float(t), 2, current=10) == 10
    # At 300 s the proposal of t = 0 is exactly 300 s old: out of the window (timestamp.After).
    assert hpa.step(300.0, 2, current=10) == 2  # 100 % per 15 s allows all of it


def test_scale_down_stops_at_min_replicas() -> None:
    hpa = Hpa(HpaSpec(3, 100, down_window_s=0.0))
    assert hpa.step(0.0, 0, current=10) == 3


def test_a_pods_policy_limits_scale_down_per_period() -> None:
    hpa = Hpa(HpaSpec(1, 100, down_window_s=0.0, down_policies=(RatePolicy("Pods", 2, 60.0),)))
    assert hpa.step(0.0, 1, current=10) == 8
    assert hpa.step(15.0, 1, current=8) == 8  # 2 removed within 60 s: from 10, at most to 8
    assert hpa.step(60.0, 1, current=8) == 6  # the removal is 60 s old


def test_scale_up_stabilization_takes_the_least_proposal_of_its_window() -> None:
    hpa = Hpa(HpaSpec(1, 100, up_window_s=60.0))
    assert hpa.step(0.0, 4, current=4) == 4
    assert hpa.step(15.0, 9, current=4) == 4  # min(4, 9): the proposal of 4 is 15 s old
    assert hpa.step(60.0, 9, current=4) == 8  # 4 is out of the window: up to 9, limited to max(8, 8)


def test_a_spec_out_of_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="min <= max"):
        HpaSpec(5, 4)
    with pytest.raises(ValueError, match="target"):
        average_value_proposal(1.0, 0.0, current=1)
