"""The autoscaling bench's load shapes, its oracle, and what a run is judged by.

Loads are in units of the starting fleet's: 1x = λ₀ = N₀ · target · μ, what the oracle
serves with N₀ pods, μ the chat mix's true capacity per pod (``capacity.capacity_rps``,
the mean over the measured pods) and target 0.7, the signals' own.

- ``step``: 1x, then 3x from the end of the warm-up to the end;
- ``spike``: 1x, 3x for 30 s after the warm-up, 1x again;
- ``daily``: a day's cosine from a 1x trough to a 3x peak and back, over a real 24 hours (not
  compressed: the autoscaler's clocks, 15 s syncs, 30 s start-ups and a 300 s scale-down
  window, meet the ramp a real day has; the simulation costs seconds).

Each starts with ``WARMUP_S`` at 1x, not measured, so that every signal starts from its own
steady state.

The **oracle** knows λ(t) in advance: replicas(t) = max(min, ⌈λ(t) / (target · μ)⌉), each
ready exactly when needed; its pod-seconds are the integral of that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slogate_sim.arrivals import RateCurve

WARMUP_S = 600.0
"""1x before anything is measured: each signal settles to its own fleet."""
STEP_AFTER_S = 1200.0
"""The step scenario's 3x, measured."""
SPIKE_S, SPIKE_AFTER_S = 30.0, 870.0
"""The spike's length, and the 1x measured after it."""
DAY_S = 24 * 3600.0
"""A day, not compressed."""
PEAK = 3.0
"""The step's, spike's and day's peak, in units of 1x."""
RECOVERY_WINDOW_S = 60.0
"""The sliding window of the refused share that decides recovery."""
RECOVERED_BELOW = 0.02
"""Recovered: every window from then on refuses less than this share."""


@dataclass(frozen=True, slots=True)
class Shape:
    """A load shape in units of 1x."""

    name: str
    """``step``, ``spike`` or ``daily``."""
    times_s: tuple[float, ...]
    """Knots (``arrivals.RateCurve``)."""
    loads: tuple[float, ...]
    """The load at each knot, x λ₀."""
    duration_s: float
    """Arrivals in [0, duration_s]; measured from ``WARMUP_S``."""
    change_s: float
    """When the load first changes (the step, the spike, the day's start)."""
    description: str
    """In words, for the report."""

    def curve(self, base_rps: float) -> RateCurve:
        """λ(t) at λ₀ = ``base_rps``."""
        return RateCurve(self.times_s, tuple(base_rps * x for x in self.loads))


def shapes() -> tuple[Shape, ...]:
    """The three scenarios."""
    w = WARMUP_S
    step = Shape(
        "step", (0.0, w, w), (1.0, 1.0, PEAK), w + STEP_AFTER_S, w,
        f"1x, then {PEAK:g}x from t = {w:g} s for {STEP_AFTER_S:g} s",
    )  # fmt: skip
    spike = Shape(
        "spike", (0.0, w, w, w + SPIKE_S, w + SPIKE_S), (1.0, 1.0, PEAK, PEAK, 1.0), w + SPIKE_S + SPIKE_AFTER_S, w,
        f"1x, {PEAK:g}x for {SPIKE_S:g} s at t = {w:g} s, then 1x for {SPIKE_AFTER_S:g} s",
    )  # fmt: skip
    minutes = np.arange(0.0, DAY_S + 1.0, 60.0)  # the cosine, linear between minutes
    day = 1.0 + (PEAK - 1.0) * (1.0 - np.cos(2 * math.pi * minutes / DAY_S)) / 2.0
    daily = Shape(
        "daily", (0.0, *(w + minutes).tolist()), (1.0, *day.tolist()), w + DAY_S, w,
        f"a day from a 1x trough to a {PEAK:g}x peak and back (a cosine, linear between minutes), over a real "
        f"{DAY_S / 3600:g} h (not compressed)",
    )  # fmt: skip
    return step, spike, daily


def oracle_replicas(rate_rps: np.ndarray, target: float, mu_rps: float, min_replicas: int) -> np.ndarray:
    """max(min, ⌈λ(t) / (target · μ)⌉) per instant (a hair below each integer is that integer)."""
    return np.maximum(min_replicas, np.ceil(rate_rps / (target * mu_rps) - 1e-9)).astype(int)


def seconds_grid(start_s: float, end_s: float) -> np.ndarray:
    """The midpoints of each second of [start, end)."""
    return np.arange(math.floor(start_s), math.ceil(end_s)) + 0.5


def ready_per_second(pods: Sequence[tuple[float, float, float, float]], grid: np.ndarray) -> np.ndarray:
    """Pods routable at each instant of ``grid``: ready, and not yet told to stop."""
    count = np.zeros(len(grid), dtype=int)
    for _, ready, stop, _ in pods:
        if math.isnan(ready):
            continue
        end = math.inf if math.isnan(stop) else stop
        count += (grid >= ready) & (grid < end)
    return count


def pod_seconds(pods: Sequence[tuple[float, float, float, float]], start_s: float, end_s: float) -> float:
    """Each pod from its creation to its end (gone after draining), within [start, end]."""
    total = 0.0
    for created, _, _, ended in pods:
        until = end_s if math.isnan(ended) else min(ended, end_s)
        total += max(0.0, until - max(created, start_s))
    return total


def steady_mask(ready: np.ndarray, oracle: np.ndarray, before: int) -> np.ndarray:
    """Seconds in steady state: not between a change of the oracle's count (``before``: its
    count the second before the first) and the first second the ready pods reach it again
    (each catch-up after a load change is excluded; a fleet that never reaches it never is)."""
    steady = np.ones(len(ready), dtype=bool)
    catching_up = False
    previous = before
    for i in range(len(ready)):
        if oracle[i] != previous:
            catching_up = True
        previous = oracle[i]
        if catching_up and ready[i] >= oracle[i]:
            catching_up = False
        steady[i] = not catching_up
    return steady


def recovery_s(arrivals_s: np.ndarray, refused: np.ndarray, change_s: float, end_s: float) -> float | None:
    """From ``change_s`` to the end of the last sliding ``RECOVERY_WINDOW_S`` window (1 s
    steps) whose refused share is at least ``RECOVERED_BELOW``; 0 if none is; None if the
    last window of the run still is (never recovered)."""
    edges = np.arange(math.floor(change_s), math.ceil(end_s) + 1)
    offered = np.histogram(arrivals_s, bins=edges)[0]
    shed = np.histogram(arrivals_s[refused], bins=edges)[0]
    width = int(RECOVERY_WINDOW_S)
    if len(offered) < width:
        return None
    kernel = np.ones(width)
    offered_w = np.convolve(offered, kernel, mode="valid")
    shed_w = np.convolve(shed, kernel, mode="valid")
    bad = np.nonzero((offered_w > 0) & (shed_w >= RECOVERED_BELOW * offered_w))[0]
    if len(bad) == 0:
        return 0.0
    if bad[-1] == len(offered_w) - 1:
        return None
    return float(bad[-1] + width)  # the bad window's end, in seconds after the change
