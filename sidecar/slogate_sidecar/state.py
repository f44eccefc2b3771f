"""What one sidecar holds: settings, the gate, live rates, learners, metrics, the upstream."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiohttp

from slogate_admission.output_tokens import SlidingQuantile
from slogate_sidecar.gate import Gate
from slogate_sidecar.metrics import SidecarMetrics
from slogate_sidecar.rates import RateEstimator, TtftErrorTracker
from slogate_sidecar.requests import Route
from slogate_sidecar.settings import SidecarSettings


@dataclass(slots=True)
class PromptCountError:
    """How far n_in counts were from what llama-server reported (relative error samples)."""

    estimate: SlidingQuantile = field(default_factory=lambda: SlidingQuantile(512))
    counted: SlidingQuantile = field(default_factory=lambda: SlidingQuantile(512))


@dataclass(slots=True, eq=False)
class Sidecar:
    """The state one sidecar's handlers share (all on one event loop)."""

    settings: SidecarSettings
    gate: Gate
    rates: RateEstimator
    metrics: SidecarMetrics
    ttft: TtftErrorTracker = field(default_factory=TtftErrorTracker)
    output_tokens: dict[Route, SlidingQuantile] = field(
        default_factory=lambda: {route: SlidingQuantile(512) for route in Route}
    )
    """Per route: completion tokens of recent responses (the RouteQuantile n_out estimate)."""
    prompt_error: PromptCountError = field(default_factory=PromptCountError)
    upstream_up: bool = False
    """Set by the poller and by failed connections; readiness and fast 503s follow it."""
    started_at: float = field(default_factory=time.monotonic)
    session: aiohttp.ClientSession | None = None

    @property
    def client(self) -> aiohttp.ClientSession:
        """The upstream session (created at startup)."""
        if self.session is None:
            raise RuntimeError("sidecar not started")
        return self.session

    def live_prefill_rate(self, now: float) -> float | None:
        """The counter-derived prefill rate while fresh; None falls back to calibration."""
        return self.rates.prefill_tokens_per_s(now, self.settings.rate_max_age_s)
