"""What the sidecar learns from each request's outcomes; subscribed to the gate.

Each learner hears the leases' three outcomes (lease.Learner) and, for the metrics, the
gate's own events (gate.GateObserver): nothing reaches back from the gate to the sidecar.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slogate_admission.decision import Decision
from slogate_admission.output_tokens import SlidingQuantile
from slogate_llama.routes import Route
from slogate_sidecar.lease import Lease, Usage
from slogate_sidecar.metrics import DeferralResult, SidecarMetrics
from slogate_sidecar.rates import TtftErrorTracker


@dataclass(slots=True)
class PromptCountError:
    """How far n_in counts were from what llama-server reported (relative error samples)."""

    estimate: SlidingQuantile = field(default_factory=lambda: SlidingQuantile(512))
    counted: SlidingQuantile = field(default_factory=lambda: SlidingQuantile(512))


@dataclass(slots=True, eq=False)
class TtftLearner:
    """Predicted against actual TTFT, for /state and the benchmarks. (The correction the gate
    applies is the gate's own: ``GateMachine.errors``, learned on the same first tokens.)"""

    tracker: TtftErrorTracker = field(default_factory=TtftErrorTracker)

    def first_token(self, lease: Lease) -> None:
        """Judge the prediction."""
        assert lease.ttft_s is not None
        self.tracker.record(lease.decision.predicted_ttft_s, lease.ttft_s, lease.ttft_slo_s)

    def completed(self, lease: Lease, usage: Usage) -> None:
        """Nothing to learn about TTFT at the end."""

    def abandoned(self, lease: Lease) -> None:
        """Nothing to learn about TTFT at the end."""


@dataclass(slots=True, eq=False)
class UsageLearner:
    """llama-server's token counts: n_out per route (the RouteQuantile estimate), n_in error."""

    output_tokens: dict[Route, SlidingQuantile] = field(
        default_factory=lambda: {route: SlidingQuantile(512) for route in Route}
    )
    """Per route: completion tokens of recent responses."""
    prompt_error: PromptCountError = field(default_factory=PromptCountError)

    def first_token(self, lease: Lease) -> None:
        """Usage comes at the end."""

    def completed(self, lease: Lease, usage: Usage) -> None:
        """Learn n_out for the route; and how far the n_in estimate and count were."""
        if usage.completion_tokens is not None:
            self.output_tokens[lease.origin.route].observe(usage.completion_tokens)
        actual = usage.prompt_tokens
        if actual and not lease.origin.prompt_given_as_tokens:
            self.prompt_error.estimate.observe((lease.origin.estimated_prompt_tokens - actual) / actual)
            self.prompt_error.counted.observe((lease.origin.counted_prompt_tokens - actual) / actual)

    def abandoned(self, lease: Lease) -> None:
        """An unfinished request says nothing of its length."""


@dataclass(slots=True, eq=False)
class MetricsLearner:
    """Every decision, deferral end and first token, into the Prometheus metrics."""

    metrics: SidecarMetrics

    def decided(self, decision: Decision, seconds: float) -> None:
        """An arrival's first decision, and its compute time."""
        self.metrics.record_decision(decision, seconds)

    def deferral_ended(self, first: Decision, final: Decision, result: DeferralResult) -> None:
        """A deferred request's end; a refusal's Retry-After is observed as for any rejection."""
        self.metrics.record_deferral(result, first.class_name, first.cost_quartile)
        if result == "timed_out" and final.retry_after_s is not None:
            self.metrics.retry_after.observe(final.retry_after_s)

    def first_token(self, lease: Lease) -> None:
        """Predicted and actual TTFT, and whether the SLO was met."""
        assert lease.ttft_s is not None
        d = lease.decision
        self.metrics.record_ttft(d.class_name, d.predicted_ttft_s, lease.ttft_s, lease.ttft_slo_s)

    def completed(self, lease: Lease, usage: Usage) -> None:
        """Counted by the upstream-side metrics already."""

    def abandoned(self, lease: Lease) -> None:
        """Counted by the upstream-side metrics already."""
