"""Means with 95% confidence intervals over repeated runs, and when two of them separate.

Issue 14.2: one run per point cannot tell noise from a real difference. Each point of the
benchmark is run on several independent arrival schedules; its value is the mean of the
runs with the Student-t interval mean ± t_{0.975, n−1} · s / √n (s the runs' sample
standard deviation). A front is called ahead of another only where the two intervals do
not overlap: conservative (two intervals can overlap while the difference is
significant), so a claim made is one the data carries.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Student's t at 0.975 for few degrees of freedom, from the tables: the expansion below is
accurate from about 10 on, not at 2."""

Verdict = Literal["ahead", "behind", "not separated"]


def t_975(dof: int) -> float:
    """The two-sided 95% Student-t factor for ``dof`` degrees of freedom.

    Beyond the table, the Cornish-Fisher expansion in 1/ν from the normal quantile z
    (Abramowitz & Stegun 26.7.5) to the ν⁻³ term: within 0.1% from ν = 10 (no SciPy).
    """
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    if dof in T_975:
        return T_975[dof]
    z, v = statistics.NormalDist().inv_cdf(0.975), float(dof)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / v + g2 / v**2 + g3 / v**3


@dataclass(frozen=True, slots=True)
class Interval:
    """The mean of ``n`` values and the half-width of its 95% interval (nan with one value)."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def fmt(self, digits: int = 2, unit: str = "") -> str:
        """``1.12 ± 0.08/s``; a single run shows its value alone."""
        if math.isnan(self.half_width):
            return f"{self.mean:.{digits}f}{unit}"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}{unit}"


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean and its 95% interval; ValueError for no values."""
    if not values:
        raise ValueError("no values")
    n = len(values)
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, math.nan, 1)
    return Interval(mean, t_975(n - 1) * statistics.stdev(values) / math.sqrt(n), n)


def compare(a: Interval, b: Interval) -> Verdict:
    """``a`` against ``b``: ahead or behind only where the intervals do not overlap."""
    if math.isnan(a.half_width) or math.isnan(b.half_width):
        return "not separated"
    if a.low > b.high:
        return "ahead"
    if a.high < b.low:
        return "behind"
    return "not separated"
