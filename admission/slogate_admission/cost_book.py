"""What recent arrivals cost: the book the cost order judges by (``shedding.order: cost``).

A request's cost is the server-seconds it holds a pod (``demand.offered_work_s``: its prefill
on the calibrated curve plus its booked output at the batch cap), the price the clairvoyant
sheds by and the autoscaler sums. The book keeps, for the arrivals that an idle gate would
serve, an exponentially decayed histogram of those costs, and from it three facts about a
new arrival (docs/admission-math.md, "Cost order"):

- **pressure** ρ̂: the offered work per second of one pod. At ρ̂ ≤ 1 nothing needs shedding
  and every arrival is cheap.
- **costly**: the arrival is not among the cheapest requests that would on their own keep
  the pod busy (the fractional-knapsack optimum for a value of one per completion).
- **owed**: its cost quartile was admitted at less than ``floor_share`` of the share arrival
  order would give it (min(1, 1/ρ̂)); then it is treated as cheap. This is the starvation
  bound, enforced.

Cost: ``observe`` is O(1) (one bucket, weights that grow with time instead of all buckets
decaying); the summary the verdicts read (boundary bucket, quartile bounds, owed flags) is
rebuilt in O(K) at most once per ``refresh_s``, so a decision costs O(1) amortized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BUCKETS_PER_OCTAVE = 4
"""Quarter-octave buckets: a boundary is known within 19%."""
LOWEST_COST_S = 2.0**-10
"""The lowest bucket's lower edge, about 1 ms (cheaper requests share it)."""
BUCKETS = 20 * BUCKETS_PER_OCTAVE
"""1 ms to 1,024 s of server time."""
_RENORMALIZE_AFTER = 50.0
"""Weights grow as e^(t/τ); rebased when the exponent passes this (e^50 keeps 15 digits)."""


def bucket_of(cost_s: float) -> int:
    """The histogram bucket of a cost in server-seconds."""
    if cost_s <= LOWEST_COST_S:
        return 0
    return min(BUCKETS - 1, int(math.log2(cost_s / LOWEST_COST_S) * BUCKETS_PER_OCTAVE))


def bucket_floor_s(bucket: int) -> float:
    """The lowest cost in server-seconds that falls in ``bucket`` (0 for the first)."""
    return 0.0 if bucket <= 0 else LOWEST_COST_S * 2.0 ** (bucket / BUCKETS_PER_OCTAVE)


@dataclass(frozen=True, slots=True)
class CostSummary:
    """The book read at one instant: what every verdict until the next refresh uses."""

    pressure: float
    """ρ̂: decayed offered work over the decayed time span, per pod; 0 while cold."""
    costly_from: int
    """The first bucket that is costly; ``BUCKETS`` when none is (cold, or ρ̂ ≤ 1)."""
    quartile_from: tuple[int, int, int]
    """The first bucket of quartiles 2, 3 and 4 by count (a bucket's quartile is that of its middle)."""
    owed: tuple[bool, bool, bool, bool]
    """Quartiles admitted below the floor: their arrivals are treated as cheap."""

    @property
    def warm(self) -> bool:
        """The book has seen enough arrivals to rank them."""
        return self.quartile_from[0] < BUCKETS

    @property
    def boundary_s(self) -> float | None:
        """c*: costs from here on are costly; None when none is (cold, or ρ̂ ≤ 1)."""
        return None if self.costly_from >= BUCKETS else bucket_floor_s(self.costly_from)

    @property
    def quartile_bounds_s(self) -> tuple[float, ...]:
        """The lowest cost of quartiles 2, 3 and 4 (those that exist), server-seconds."""
        return tuple(bucket_floor_s(b) for b in self.quartile_from if b < BUCKETS)

    def quartile(self, cost_s: float) -> int:
        """The cost quartile, 0 (cheapest) to 3, of a request costing ``cost_s``."""
        return self.quartile_of(bucket_of(cost_s))

    def costly(self, cost_s: float) -> bool:
        """Above the boundary, and its quartile is not owed."""
        return self.costly_at(bucket_of(cost_s))

    def quartile_of(self, bucket: int) -> int:
        """``quartile`` of a cost already bucketed (the gate buckets each arrival once)."""
        q2, q3, q4 = self.quartile_from
        return (bucket >= q2) + (bucket >= q3) + (bucket >= q4)

    def costly_at(self, bucket: int) -> bool:
        """``costly`` of a cost already bucketed."""
        return bucket >= self.costly_from and not self.owed[self.quartile_of(bucket)]


_COLD = CostSummary(0.0, BUCKETS, (BUCKETS, BUCKETS, BUCKETS), (False, False, False, False))


@dataclass(slots=True)
class CostBook:
    """Decayed counts, admissions and work by cost bucket, with the summary read from them."""

    half_life_s: float = 20.0
    """How fast the book forgets. Cost selection measured alike with windows of 10 to 60 s
    (docs/admission-math.md); 20 s follows a load change within a minute."""
    floor_share: float = 0.5
    """The starvation bound: a quartile admitted below this share of what arrival order would
    give it is owed, and its arrivals count as cheap. 0.5 is issue 28's bound itself."""
    warm_arrivals: float = 16.0
    """Decayed arrivals the book needs before it judges anyone; before, all are cheap."""
    refresh_s: float = 1.0
    """The summary is rebuilt at most this often (a few percent of the half-life)."""
    _count: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)
    _admitted: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)
    _work: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)
    _base: float | None = None
    """The instant weights are relative to (a weight is e^((t − base)/τ))."""
    _first: float | None = None
    _summary: CostSummary = _COLD
    _summary_at: float = -math.inf

    @property
    def _tau(self) -> float:
        return self.half_life_s / math.log(2)

    def observe(self, cost_s: float, admitted: bool, now: float, bucket: int | None = None) -> None:
        """One eligible arrival (an idle gate would serve it): its cost (``bucket``: its
        ``bucket_of``, when the caller has it), and whether it got in (admitted or deferred)."""
        if self._base is None or self._first is None:
            self._base = self._first = now
        exponent = (now - self._base) / self._tau
        if exponent > _RENORMALIZE_AFTER:
            self._rebase(now)
            exponent = 0.0
        weight = math.exp(exponent)
        b = bucket_of(cost_s) if bucket is None else bucket
        self._count[b] += weight
        self._work[b] += weight * cost_s
        if admitted:
            self._admitted[b] += weight

    def summary(self, now: float) -> CostSummary:
        """The book's reading, rebuilt when older than ``refresh_s``."""
        if now - self._summary_at >= self.refresh_s:
            self._summary = self._read(now)
            self._summary_at = now
        return self._summary

    def _rebase(self, now: float) -> None:
        assert self._base is not None
        shrink = math.exp(-(now - self._base) / self._tau)
        for values in (self._count, self._admitted, self._work):
            for i, v in enumerate(values):
                values[i] = v * shrink
        self._base = now

    def _read(self, now: float) -> CostSummary:
        if self._base is None or self._first is None:
            return _COLD
        tau = self._tau
        now_weight = math.exp((now - self._base) / tau)
        total = sum(self._count) / now_weight
        if total < self.warm_arrivals:
            return _COLD
        # The decayed span the book has seen: τ(1 − e^(−age/τ)), so ρ̂ is unbiased from the start.
        span = tau * -math.expm1(-(now - self._first) / tau)
        work = sum(self._work) / now_weight
        pressure = work / span if span > 0 else 0.0
        counts = self._count
        quartile_from = _quartile_starts(counts)
        if pressure <= 1.0:
            return CostSummary(pressure, BUCKETS, quartile_from, (False, False, False, False))
        # The cheapest buckets whose work alone fills the span: beyond them, costly.
        costly_from, filled = BUCKETS, 0.0
        for b, w in enumerate(self._work):
            filled += w / now_weight
            if filled >= span:
                costly_from = b + 1
                break
        # Arrival order admits each quartile alike, about min(1, 1/ρ̂) of it when the pod is full.
        floor = self.floor_share * min(1.0, 1.0 / pressure)
        starts = (0, *quartile_from)
        ends = (*quartile_from, BUCKETS)
        owed = tuple(
            sum(self._admitted[start:end]) < floor * sum(counts[start:end])
            for start, end in zip(starts, ends, strict=True)
        )
        return CostSummary(pressure, costly_from, quartile_from, (owed[0], owed[1], owed[2], owed[3]))


def _quartile_starts(counts: list[float]) -> tuple[int, int, int]:
    """The first bucket of quartiles 2, 3 and 4 by count: a bucket belongs to the quartile of
    its middle arrival (``BUCKETS`` for a quartile no bucket starts)."""
    starts: list[int] = []
    total, seen = sum(counts), 0.0
    for b, c in enumerate(counts):
        middle = (seen + c / 2) / total
        while len(starts) < 3 and middle >= (len(starts) + 1) / 4:
            starts.append(b)
        seen += c
    starts += [BUCKETS] * (3 - len(starts))
    return starts[0], starts[1], starts[2]
