"""What one sidecar holds: settings, the gate, live rates, learners, metrics, the upstream."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from slogate_sidecar.gate import Gate
from slogate_sidecar.learners import TtftLearner, UsageLearner
from slogate_sidecar.metrics import SidecarMetrics
from slogate_sidecar.offered_demand import DemandMeter
from slogate_sidecar.rates import RateEstimator
from slogate_sidecar.settings import SidecarSettings


@dataclass(slots=True, eq=False)
class Sidecar:
    """The state one sidecar's handlers share (all on one event loop)."""

    settings: SidecarSettings
    gate: Gate
    rates: RateEstimator
    metrics: SidecarMetrics
    ttft: TtftLearner
    """Predicted vs actual TTFT (the gate learns its own correction: GateMachine.errors)."""
    usage: UsageLearner
    """n_out per route (the RouteQuantile estimate) and the n_in count error."""
    demand: DemandMeter
    """Offered demand, first tries apart from retries (the autoscaling signal's numerator)."""
    upstream_up: bool = False
    """Set by the poller and by failed connections; readiness and fast 503s follow it."""
    session: aiohttp.ClientSession | None = None

    @property
    def client(self) -> aiohttp.ClientSession:
        """The upstream session (created at startup)."""
        if self.session is None:
            raise RuntimeError("sidecar not started")
        return self.session
