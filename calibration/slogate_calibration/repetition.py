"""How often to time one thing: until its median is known well enough, within limits.

The stopping rule. Each measured point (a prompt length, a number of concurrent streams)
is the median of its timings, and its *uncertainty* is the relative standard error of
that median, estimated robustly::

    spread      = 1.4826 · b_n · MAD / median     (one timing's relative standard deviation)
    uncertainty = 1.2533 · spread / √n            (the median's relative standard error)

A point is timed again while its uncertainty exceeds the tolerance, until it has
``max_timings`` timings or the time allowed for extra timings is used up.

Why this rule, and not another:

* The median, not the mean, because a neighbour's burst of CPU use slows one timing by
  half or doubles it: the median of three ignores that one, a mean does not.
* The MAD (median absolute deviation from the median), not the standard deviation or
  the range, for the same reason: with (1.00, 1.01, 1.50) s the MAD is 0.01 s, so one
  disturbed timing costs one more timing and is then outvoted. A range or a
  standard deviation would keep repeating a point that one outlier made look noisy.
* 1.4826 turns a MAD into a standard deviation for Gaussian noise, and ``b_n`` (Croux and
  Rousseeuw, 1992) corrects it for two to nine values, where the plain MAD is biased low:
  without it, three timings that happen to agree would claim far too much.
* Divided by √n, because the question is not "is this machine noisy" (on a shared
  2-core VM it always is: single timings scatter by several percent) but "is the median
  known": more timings narrow it. A rule on the spread alone would repeat every point of
  a noisy machine to the maximum and still not be satisfied. 1.2533 is the median's
  standard error over the mean's for Gaussian noise (large n; smaller n is a little
  less, so the factor errs on the careful side).

The uncertainty describes the noise *within* one run. A machine that is slower this
hour than the last (another tenant, another host) moves every timing together; no
number of repetitions sees that, and the profile honestly records the slower machine.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

MAD_TO_SIGMA = 1.4826
"""A Gaussian's standard deviation over its median absolute deviation."""
MEDIAN_OVER_MEAN_ERROR = 1.2533
"""The standard error of a median over that of a mean (√(π/2)), Gaussian noise."""
_SMALL_SAMPLE = {2: 1.196, 3: 1.495, 4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129, 9: 1.107}
"""Croux and Rousseeuw's factors b_n making the MAD unbiased for n values; n/(n − 0.8) beyond."""

Clock = Callable[[], float]
"""Seconds, monotonic: time.monotonic, or a test's fake."""


def relative_spread(values: Sequence[float]) -> float:
    """One value's robust relative standard deviation: 1.4826 · b_n · MAD / median (0 for one value)."""
    n = len(values)
    if n < 2:
        return 0.0
    middle = statistics.median(values)
    mad = statistics.median(abs(v - middle) for v in values)
    factor = _SMALL_SAMPLE.get(n, n / (n - 0.8))
    return MAD_TO_SIGMA * factor * mad / middle


def median_uncertainty(values: Sequence[float]) -> float:
    """The median's relative standard error: 1.2533 · spread / √n; infinite below two values."""
    if len(values) < 2:
        return math.inf
    return MEDIAN_OVER_MEAN_ERROR * relative_spread(values) / math.sqrt(len(values))


@dataclass(frozen=True, slots=True)
class RepeatRule:
    """How many timings a point gets, and when it has enough."""

    tolerance: float
    """Stop once the median's uncertainty is at most this (relative, 0.03 = 3%)."""
    max_timings: int
    """Never more than this many timings of one point, however noisy."""


@dataclass(slots=True)
class Repeated:
    """One point timed repeatedly: its values, what each timing cost, and how to time it again."""

    key: int
    """What is measured: a prompt length, or a number of concurrent streams."""
    again: Callable[[], Awaitable[float]]
    """Takes one more timing and returns its value (seconds, or tokens/s)."""
    rule: RepeatRule
    min_timings: int
    """Timings it gets whatever they say, while the budget allows (``repeat_unsettled``)."""
    required: int = 1
    """Timings a profile cannot do without (``time_required``): one, or two for a point the
    profile states its confidence on (an uncertainty needs two values)."""
    values: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    """Wall-clock seconds of each timing: what one more will likely cost."""

    async def time_once(self, clock: Clock) -> None:
        """One more timing, and its cost on ``clock``."""
        began = clock()
        self.values.append(await self.again())
        self.costs.append(clock() - began)

    @property
    def median(self) -> float:
        """The point's value."""
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """One timing's relative spread (see ``relative_spread``)."""
        return relative_spread(self.values)

    @property
    def uncertainty(self) -> float:
        """The median's relative standard error (see ``median_uncertainty``)."""
        return median_uncertainty(self.values)

    @property
    def next_cost(self) -> float:
        """The dearest timing so far: a careful guess of what one more costs."""
        return max(self.costs, default=0.0)

    def wants_more(self) -> bool:
        """Below its minimum, or unsettled and below its maximum."""
        if len(self.values) < self.min_timings:
            return True
        return len(self.values) < self.rule.max_timings and not self.settled

    @property
    def settled(self) -> bool:
        """Its median is as well known as its rule asks."""
        return self.uncertainty <= self.rule.tolerance


@dataclass(frozen=True, slots=True)
class Allowance:
    """Until when extra timings may start: each must be expected to end by ``deadline``."""

    deadline: float
    """On ``clock``; past it, the run's remaining budget is headroom, not for repetitions."""
    clock: Clock = time.monotonic

    def allows(self, cost_s: float) -> bool:
        """One more timing expected to take ``cost_s`` would end in time."""
        return self.clock() + cost_s <= self.deadline


async def time_required(points: Sequence[Repeated], clock: Clock, tick: Callable[[], None]) -> None:
    """The timings a profile cannot do without, in passes (pass k times every point that
    requires a k-th): the rest of each point's minimum comes from ``repeat_unsettled``, within
    the budget, so a busy machine ends with fewer timings and says so instead of failing.

    Passes, not one point after another, so that a slow spell of the machine disturbs one
    timing of several points rather than every timing of one."""
    for depth in range(max((p.required for p in points), default=0)):
        for point in points:
            if depth < point.required:
                await point.time_once(clock)
                tick()


async def repeat_unsettled(
    points: Sequence[Repeated],
    allowance: Allowance,
    tick: Callable[[], None],
    planned: Callable[[int], None] = lambda _n: None,
    *,
    stop_in_s: float | None = None,
) -> int:
    """More timings for the points below their minimum or unsettled, round by round; returns
    how many were taken.

    Each round times every point that still wants more once, cheapest first, so that
    when the allowance runs out the cheap points (short prompts, few streams) have had
    their repetitions and only the dear ones go without. A point is skipped when its
    next timing would not end before the allowance's deadline. ``planned`` is told how
    many timings each round will take at most (for a progress display).

    ``stop_in_s`` is a hard stop (the event loop's clock): a timing still running then,
    because the machine slowed down past every estimate, is dropped, and the points keep
    the timings they have. Repetitions are optional; they must never fail a run."""
    taken = 0
    try:
        async with asyncio.timeout(stop_in_s):
            while True:
                wanted = sorted((p for p in points if p.wants_more()), key=lambda p: p.next_cost)
                if not wanted:
                    return taken
                planned(len(wanted))
                timed = 0
                for point in wanted:
                    if allowance.allows(point.next_cost):
                        await point.time_once(allowance.clock)
                        tick()
                        timed += 1
                taken += timed
                if timed == 0:
                    return taken
    except TimeoutError:
        return taken
