"""What one simulation counts as it runs, and the ``SimulationResult`` assembled from it.

The event loop (``engine``) adds to a ``Tally`` at each arrival, refusal, first token,
completion and departure; ``Tally.result`` turns the counts into the run's answer over the
arrival window [0, duration_s]: rates per second of it, Little's L as the time average of
the requests inside (``area`` / duration), TTFT quantiles over every first token. When the
arrivals name tenants (a trace's ``Traced.tenant``), each request's outcomes are also counted
under its tenant (``tenants``); otherwise that costs the event loop one test of None.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from slogate_sim.fleet import FleetRecord
from slogate_sim.pod import SimulatedPod
from slogate_sim.scenario import SimulationConfig, SimulationResult, TenantCounts


class Tally:
    """A run's running counts (``SimulationResult`` documents each)."""

    __slots__ = (
        "admitted",
        "area",
        "completed",
        "completed_in_window",
        "deferred",
        "entered",
        "inside",
        "offered",
        "rejected",
        "sojourn_count",
        "sojourn_sum",
        "tenants",
        "timed_out",
        "tries",
        "ttfts",
        "within",
    )

    def __init__(self) -> None:
        self.offered = self.admitted = self.deferred = self.rejected = self.tries = 0
        self.timed_out = self.completed = self.within = self.entered = 0
        self.completed_in_window = 0
        self.inside = 0
        """Requests inside now (not refused on the spot, not yet left)."""
        self.area = 0.0
        """∫ inside dt over [0, duration_s]: Little's L times the duration."""
        self.sojourn_sum = 0.0
        self.sojourn_count = 0
        self.ttfts: array[float] = array("d")
        self.tenants: dict[str | None, TenantCounts] | None = None
        """Per tenant (None: requests naming none); None when the arrivals name no tenant."""

    def tenant(self, name: str | None) -> TenantCounts:
        """``name``'s counts (made at its first arrival); only when ``tenants`` is kept."""
        assert self.tenants is not None
        counts = self.tenants.get(name)
        if counts is None:
            counts = self.tenants[name] = TenantCounts()
        return counts

    def result(
        self, config: SimulationConfig, pods: Sequence[SimulatedPod], fleet: FleetRecord | None
    ) -> SimulationResult:
        """The run's answer, once every request has left."""
        duration = config.duration_s
        ttfts = np.frombuffer(self.ttfts, dtype=np.float64) if len(self.ttfts) else None
        p50 = p99 = None
        if ttfts is not None:
            p50, p99 = (float(q) for q in np.quantile(ttfts, [0.5, 0.99]))
        return SimulationResult(
            gate=config.front.name,
            arrival_rate_rps=config.arrival_rate_rps,
            capacity_rps=config.capacity_rps,
            duration_s=duration,
            offered=self.offered,
            admitted=self.admitted,
            deferred=self.deferred,
            rejected=self.rejected,
            timed_out=self.timed_out,
            completed=self.completed,
            completed_within_slo=self.within,
            throughput_rps=self.completed_in_window / duration,
            goodput_rps=self.within / duration,
            ttft_p50_s=p50,
            ttft_p99_s=p99,
            mean_time_in_system_s=self.sojourn_sum / self.sojourn_count if self.sojourn_count else None,
            mean_in_system=self.area / duration,
            entered=self.entered,
            utilization=sum(pod.busy for pod in pods) / len(pods) / duration,
            replicas=len(pods),
            routing=str(config.routing),
            tries=self.tries,
            fleet=fleet,
            tenants=self.tenants,
        )
