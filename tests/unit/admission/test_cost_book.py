"""The cost book: pressure, the boundary of the cheap, quartiles and the starvation floor."""

from __future__ import annotations

import pytest

from slogate_admission.cost_book import BUCKETS, CostBook, bucket_of

CHEAP, DEAR = 0.3, 1.0
"""Five cheap arrivals a second offer more than a pod on their own: the dear are beyond c*."""


def fed(book: CostBook, per_second: int, seconds: int, *, dear_admitted: bool = True) -> CostBook:
    """``per_second`` cheap and as many dear arrivals each second, all cheap ones admitted."""
    for t in range(seconds):
        for _ in range(per_second):
            book.observe(CHEAP, True, float(t))
            book.observe(DEAR, dear_admitted, float(t))
    return book


def test_buckets_are_ordered_by_cost_and_bounded() -> None:
    costs = [0.0, 1e-4, 0.01, 0.1, 1.0, 10.0, 1e6]
    buckets = [bucket_of(c) for c in costs]
    assert buckets == sorted(buckets)
    assert buckets[0] == buckets[1] == 0
    assert buckets[-1] == BUCKETS - 1
    assert bucket_of(0.1) < bucket_of(0.12) < bucket_of(0.2)  # quarter-octave: 19% apart


def test_a_cold_book_ranks_nobody() -> None:
    book = CostBook()
    for i in range(10):
        book.observe(DEAR, True, i * 0.1)
    summary = book.summary(1.0)
    assert not summary.warm
    assert not summary.costly(DEAR)


def test_below_one_pod_of_work_nothing_is_costly_but_quartiles_are_known() -> None:
    book = CostBook()
    for t in range(120):  # 0.3 + 1.0 / 4 = 0.55 server-seconds per second
        book.observe(CHEAP, True, float(t))
        if t % 4 == 0:
            book.observe(DEAR, True, t + 0.5)
    summary = book.summary(120.0)
    assert summary.warm
    assert summary.pressure == pytest.approx(0.55, rel=0.1)
    assert not summary.costly(DEAR)
    assert summary.quartile(CHEAP) < summary.quartile(DEAR) == 3


def test_under_pressure_the_dear_are_costly_and_the_cheap_are_not() -> None:
    book = fed(CostBook(), per_second=5, seconds=60)
    summary = book.summary(60.0)
    assert summary.pressure == pytest.approx(6.5, rel=0.05)
    assert summary.costly(DEAR)
    assert not summary.costly(CHEAP)
    assert summary.quartile(CHEAP) == 1  # half the arrivals: Q1 and Q2 share one bucket
    assert summary.quartile(DEAR) == 3


def test_a_quartile_admitted_below_the_floor_is_owed_and_counts_as_cheap() -> None:
    book = fed(CostBook(), per_second=5, seconds=60, dear_admitted=False)
    summary = book.summary(60.0)
    assert summary.owed[3]
    assert not summary.costly(DEAR)
    # Admitted at 10% of their arrivals, above half of arrival order's 1/ρ̂ (4%): not owed.
    book = CostBook()
    for t in range(60):
        for i in range(10):
            book.observe(CHEAP, True, float(t))
            book.observe(DEAR, i == 0, float(t))
    summary = book.summary(60.0)
    assert summary.pressure > 10
    assert not summary.owed[3]
    assert summary.costly(DEAR)


def test_the_summary_is_rebuilt_at_most_once_per_refresh() -> None:
    book = fed(CostBook(), per_second=5, seconds=30)
    first = book.summary(30.0)
    for _ in range(1000):
        book.observe(DEAR, True, 30.5)
    assert book.summary(30.9) is first
    assert book.summary(31.0).pressure > first.pressure


def test_a_long_run_forgets_and_stays_finite() -> None:
    """Weights grow as e^(t/τ) and are rebased: an hour in, the book reads the last minute."""
    book = CostBook()
    for t in range(3600):
        book.observe(CHEAP if t < 3000 else DEAR, True, float(t))
    summary = book.summary(3600.0)
    assert summary.pressure == pytest.approx(DEAR, rel=0.05)  # one dear arrival a second
    assert summary.quartile(CHEAP) == 0 < summary.quartile(DEAR)  # the cheap are forgotten
