"""The scale-up window that buys pods only for demand that lasts (slogate_admission.scale_up)."""

from __future__ import annotations

import math

import pytest

from slogate_admission.scale_up import MAX_WINDOW_S, lasting_demand_window_s


def test_the_window_is_start_up_plus_rate_window_plus_one_sync_rounded_up() -> None:
    assert lasting_demand_window_s(30.0, 60, 15) == 105
    assert lasting_demand_window_s(0.0, 60, 15) == 75
    assert lasting_demand_window_s(30.01, 60, 15) == 106
    assert lasting_demand_window_s(4000.0, 60, 15) == MAX_WINDOW_S


@pytest.mark.parametrize(("startup", "rate", "interval"), [(-1.0, 60, 15), (math.nan, 60, 15), (30.0, 0, 15),
                                                           (30.0, 60, 0), (math.inf, 60, 15)])  # fmt: skip
def test_nonsense_quantities_are_refused_by_name(startup: float, rate: float, interval: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number"):
        lasting_demand_window_s(startup, rate, interval)
