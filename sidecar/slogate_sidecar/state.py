"""What one sidecar holds: settings, the gate, live rates, learners, metrics, the upstream."""

from __future__ import annotations

import statistics
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


@dataclass(slots=True)
class TtftCorrection:
    """A damped correction of the prefill rate from observed TTFTs.

    Counter deltas say how fast llama-server prefills; observed TTFTs say how right the
    whole prediction was (HTTP, batching, scheduling included). Every ``batch`` first
    tokens, factor <- clamp(factor x median(actual / predicted), lo, hi): predictions made
    with the factor in force are judged, so a right factor stays (ratio ~1) and a wrong
    one moves geometrically toward right. The median ignores stragglers; the clamp keeps
    one bad batch from switching protection off (or everything away).
    """

    factor: float = 1.0
    batch: int = 32
    lo: float = 0.5
    hi: float = 2.0
    _ratios: list[float] = field(default_factory=list)

    def observe(self, predicted_s: float, actual_s: float) -> None:
        """One admitted request's first token (predictions under 50 ms are too small to judge)."""
        if predicted_s < 0.05:
            return
        self._ratios.append(actual_s / predicted_s)
        if len(self._ratios) >= self.batch:
            self.factor = min(max(self.factor * statistics.median(self._ratios), self.lo), self.hi)
            self._ratios.clear()


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
    correction: TtftCorrection = field(default_factory=TtftCorrection)
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
        """The rate the predicate uses: live counters while fresh, else calibration, both
        divided by the TTFT correction (> 1 when the gate has been optimistic)."""
        live = self.rates.prefill_tokens_per_s(now, self.settings.rate_max_age_s)
        thresholds = self.gate.thresholds
        base = live if live is not None else (thresholds.prefill_tokens_per_second if thresholds else None)
        return None if base is None else base / self.correction.factor
