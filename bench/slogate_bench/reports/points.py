"""The suite's runs grouped into points (front x mix x load x retry), with intervals and the bound.

A point holds its runs, one per arrival schedule; its numbers are means with 95% intervals
over them (``intervals``). The clairvoyant bound (``clairvoyant.bound_for_trace``) is
computed from the very schedule each run was sent, re-drawn from its seed, so every front
is scored as a share of the goodput no gate could beat on the same traffic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_bench.reports.intervals import Interval, mean_interval
from slogate_sim.capacity import ServerModel
from slogate_sim.clairvoyant import Bound, bound_for_trace
from slogate_sim.workloads import preset, schedule

Key = tuple[str, str, float, str]
"""(workload, scenario, load, retry)."""
TraceKey = tuple[str, float, int]
"""(workload, load, seed): one arrival schedule, the same for every front."""


@dataclass(frozen=True)
class Point:
    """One front at one load of one mix, over its runs (one per schedule)."""

    key: Key
    runs: tuple[dict[str, Any], ...]
    bounds: tuple[Bound, ...] = field(default=())
    """The bound of each run's trace, in the runs' order (empty when not computed)."""

    @property
    def scenario(self) -> str:
        return self.key[1]

    def interval(self, name: str) -> Interval:
        """Mean and 95% interval of one summary number over the runs."""
        return mean_interval([float(r[name]) for r in self.runs])

    @property
    def goodput(self) -> Interval:
        return self.interval("goodput_rps")

    def total(self, name: str) -> int:
        """A count summed over the runs."""
        return int(sum(r[name] for r in self.runs))

    def pooled(self, name: str) -> list[float]:
        """A per-request list (TTFTs, rejection latencies) pooled over the runs, sorted."""
        return sorted(x for r in self.runs for x in r[name])

    @property
    def clairvoyant(self) -> Interval | None:
        return mean_interval([b.clairvoyant_goodput_rps for b in self.bounds]) if self.bounds else None

    @property
    def upper_bound(self) -> Interval | None:
        return mean_interval([b.upper_bound_goodput_rps for b in self.bounds]) if self.bounds else None

    @property
    def share_of_clairvoyant(self) -> Interval | None:
        """Per run, goodput / the clairvoyant's on its trace; mean and interval."""
        if not self.bounds:
            return None
        shares = [b.share(float(r["goodput_rps"])) for r, b in zip(self.runs, self.bounds, strict=True)]
        return mean_interval(shares)


def _key(run: dict[str, Any]) -> Key:
    return (run["workload"], run["scenario"], float(run["load"]), run["retry"])


def trace_bounds(raw: dict[str, Any], profile: CalibrationProfile, thresholds: Thresholds) -> dict[TraceKey, Bound]:
    """The bound of every distinct schedule the suite sent (no retries: a retry is not an arrival
    of the trace), each re-drawn from the run's rate and seed."""
    server = ServerModel.from_profile(profile)
    bounds: dict[TraceKey, Bound] = {}
    for run in raw["runs"]:
        key = (run["workload"], float(run["load"]), int(run.get("seed", 1)))
        if run["retry"] != "none" or key in bounds or "rate_rps" not in run:
            continue
        arrivals = schedule(run["rate_rps"], raw["seconds"], preset(run["workload"]), seed=run["schedule_seed"])
        bounds[key] = bound_for_trace(server, thresholds.concurrency_cap, arrivals, raw["slo_s"], raw["seconds"])
    return bounds


def points(raw: dict[str, Any], bounds: dict[TraceKey, Bound] | None = None) -> dict[Key, Point]:
    """Every point of the suite, its runs in seed order, with their traces' bounds when given."""
    grouped: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for run in raw["runs"]:
        grouped[_key(run)].append(run)
    result = {}
    for key, runs in grouped.items():
        runs.sort(key=lambda r: int(r.get("seed", 1)))
        found: Iterable[Bound | None] = (
            (bounds or {}).get((r["workload"], float(r["load"]), int(r.get("seed", 1)))) for r in runs
        )
        run_bounds = tuple(b for b in found if b is not None)
        result[key] = Point(key, tuple(runs), run_bounds if len(run_bounds) == len(runs) and key[3] == "none" else ())
    return result


def find(all_points: dict[Key, Point], workload: str, scenario: str, load: float, retry: str = "none") -> Point | None:
    return all_points.get((workload, scenario, float(load), retry))
