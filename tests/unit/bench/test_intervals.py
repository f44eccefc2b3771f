"""Means with 95% intervals over repeated runs, and when a front is called ahead."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from slogate_bench.reports.intervals import Interval, compare, mean_interval, t_975


@pytest.mark.parametrize(("dof", "exact"), [(2, 4.303), (9, 2.262), (10, 2.228), (20, 2.086), (60, 2.000)])
def test_t_975_matches_the_tables(dof: int, exact: float) -> None:
    assert t_975(dof) == pytest.approx(exact, rel=0.001)


def test_an_interval_is_the_t_interval_of_the_mean() -> None:
    got = mean_interval([1.0, 2.0, 3.0])
    assert got.mean == 2.0
    assert got.half_width == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert got.fmt() == "2.00 ± 2.48"
    single = mean_interval([0.7])
    assert math.isnan(single.half_width)
    assert single.fmt(unit="/s") == "0.70/s"
    with pytest.raises(ValueError, match="no values"):
        mean_interval([])


def test_the_interval_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    rng = random.Random(3)
    covered = sum(
        1 for _ in range(4000) if (i := mean_interval([rng.gauss(1.0, 0.3) for _ in range(3)])).low <= 1.0 <= i.high
    )
    assert 0.93 < covered / 4000 < 0.97


def test_ahead_only_where_the_intervals_separate() -> None:
    low, high, overlapping = Interval(1.0, 0.1, 3), Interval(1.5, 0.1, 3), Interval(1.15, 0.1, 3)
    assert compare(high, low) == "ahead"
    assert compare(low, high) == "behind"
    assert compare(overlapping, low) == "not separated"
    assert compare(Interval(5.0, math.nan, 1), low) == "not separated"  # one run: no claim


def test_the_stdev_is_the_sample_one() -> None:
    values = [0.9, 1.1, 1.3, 0.7]
    got = mean_interval(values)
    assert got.half_width == pytest.approx(t_975(3) * statistics.stdev(values) / 2)
