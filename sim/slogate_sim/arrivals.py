"""The simulator's arrivals: Poisson at a constant rate, at a rate that varies in time, or a trace.

A time-varying rate λ(t) is a ``RateCurve`` (piecewise linear between knots; two knots at
one time make a step), drawn by thinning (Lewis and Shedler, 1979): candidates at the
curve's peak rate λ*, each kept with probability λ(t) / λ*, which is a non-homogeneous
Poisson process of intensity λ(t).

One RNG stream per quantity, spawned from the seed, so that every front and every
autoscaler sees the same arrivals (the router's is a fifth stream); thinning draws its
candidates and their coins from the times stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from slogate_sim.scenario import SimulationConfig

CHUNK = 4096
"""Arrivals drawn per batch from each RNG stream."""
NO_SERVICE = -1.0
"""An arrival's service when the pod it reaches decides it (T_prefill of that pod's curve)."""


@dataclass(frozen=True, slots=True)
class RateCurve:
    """λ(t), linear between knots and constant beyond the last; a step is two knots at one time."""

    times_s: tuple[float, ...]
    """Knot times, non-decreasing, the first 0."""
    rates_rps: tuple[float, ...]
    """λ at each knot (requests per second, >= 0)."""

    def __post_init__(self) -> None:
        if len(self.times_s) != len(self.rates_rps) or not self.times_s:
            raise ValueError("a rate curve needs as many rates as times, at least one")
        if self.times_s[0] != 0.0 or any(b < a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise ValueError(f"knot times must start at 0 and not decrease, got {self.times_s}")
        if min(self.rates_rps) < 0 or not max(self.rates_rps) > 0:
            raise ValueError(f"rates must be >= 0 and some > 0, got {self.rates_rps}")

    @property
    def peak_rps(self) -> float:
        """λ*, the thinning's candidate rate."""
        return max(self.rates_rps)

    def at(self, t: float | np.ndarray) -> np.ndarray:
        """λ(t); at a step's time, the rate after it."""
        # np.interp takes the last of equal knots from the left: the step has happened.
        return np.asarray(np.interp(t, self.times_s, self.rates_rps), dtype=np.float64)

    def mean_rps(self, start_s: float, end_s: float, step_s: float = 1.0) -> float:
        """The mean of λ over [start, end] (midpoint rule on a grid of ``step_s``)."""
        grid = np.arange(start_s + step_s / 2, end_s, step_s)
        return float(np.mean(self.at(grid))) if len(grid) else float(self.at(start_s))


def arrivals(config: SimulationConfig) -> Iterator[tuple[float, int, int, float]]:
    """(time, prompt tokens, output tokens, exponential service or ``NO_SERVICE``) of each
    arrival in [0, duration]: the trace's, else Poisson at ``arrival_rate_rps`` or at
    ``rate_curve``'s λ(t)."""
    if config.trace is not None:
        yield from ((a.at_s, a.prompt_tokens, a.max_tokens, NO_SERVICE) for a in config.trace)
        return
    wl = config.workload
    times_rng, prompt_rng, output_rng, service_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(4)
    )
    curve = config.rate_curve
    rate = curve.peak_rps if curve is not None else config.arrival_rate_rps
    exponential = wl.service == "exponential"
    t = 0.0
    while t <= config.duration_s:
        times = t + np.cumsum(times_rng.exponential(1.0 / rate, size=CHUNK))
        t = float(times[-1])
        if curve is not None:  # thinning: keep each candidate with probability λ(t) / λ*
            times = times[times_rng.random(CHUNK) * rate < curve.at(times)]
        count = int(np.searchsorted(times, config.duration_s, side="right"))
        prompts = wl.prompt_tokens.draw(prompt_rng, CHUNK)[:count]
        outputs = wl.output_tokens.draw(output_rng, CHUNK)[:count]
        if exponential:  # the whole service is one Exp(mean) stretch of work, no decode
            services: list[float] = service_rng.exponential(wl.exponential_mean_s, size=CHUNK)[:count].tolist()
            outputs = [0] * count
        else:
            services = [NO_SERVICE] * count
        arrival_times: list[float] = times[:count].tolist()
        yield from zip(arrival_times, prompts, outputs, services, strict=True)
