"""Every sidecar metric, on a registry of its own (several sidecars may share a process).

docs/metrics.md lists each metric with its meaning and the PromQL to use it. The metric
objects are public attributes; the methods below cover the updates that touch several
series at once or need a mapping from the core's types.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from slogate_admission.decision import Decision, LiveState, Outcome
from slogate_admission.demand import Capacity, reference_capacity
from slogate_admission.schema import Thresholds
from slogate_sidecar.rates import RateEstimator

__all__ = [
    "CAPACITY_PROMPT_TOKENS",
    "CAPACITY_REQUESTS",
    "DEFERRED_REQUESTS",
    "DEGRADE",
    "INFLIGHT_STREAMS",
    "DeferralResult",
    "SidecarMetrics",
    "UpstreamErrorKind",
    "metric_outcome",
]

DEFERRED_REQUESTS = "slogate_deferred_requests"
"""Requests in the deferral queue: also the routing signal of requests waiting (routing_signals)."""
INFLIGHT_STREAMS = "slogate_inflight_streams"
"""Admitted, unfinished requests: also the routing signal of requests running (routing_signals)."""

CAPACITY_REQUESTS = "slogate_capacity_requests_per_second"
"""μ_ref: what this pod sustains at the SLO, in reference requests/s (a number to read: the
autoscaling query prices each request instead, ``slogate_offered_work_seconds_total``)."""
CAPACITY_PROMPT_TOKENS = "slogate_capacity_prompt_tokens_per_second"
"""μ · n_ref: the same in prompt tokens/s."""

DEGRADE = "degrade"
"""The metric outcome of an admission whose max_tokens was clamped to fit the KV cache."""

DeferralResult = Literal["admitted", "timed_out", "cancelled"]
UpstreamErrorKind = Literal["unreachable", "timeout", "status_5xx", "aborted"]

_OUTCOMES = (Outcome.ADMIT.value, DEGRADE, Outcome.DEFER.value, Outcome.REJECT.value)
_DEFERRAL_RESULTS: tuple[DeferralResult, ...] = ("admitted", "timed_out", "cancelled")
_UPSTREAM_ERRORS: tuple[UpstreamErrorKind, ...] = (
    "unreachable",
    "timeout",
    "status_5xx",
    "aborted",
)
_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60)
_ERROR_RATIO_BUCKETS = (-0.9, -0.75, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1, 2, 4)
_RETRY_AFTER_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
_DECISION_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2)


def _ended(admitted: bool) -> str:
    """The ``result`` label of ``slogate_cost_quartile_requests_total``."""
    return "admitted" if admitted else "refused"


def metric_outcome(decision: Decision) -> str:
    """The ``outcome`` label: the core's outcome, or ``degrade`` for a clamped admission."""
    if decision.outcome is Outcome.ADMIT and decision.clamped:
        return DEGRADE
    return decision.outcome.value


class SidecarMetrics:
    """The sidecar's metrics, registered on ``self.registry``.

    Label values are passed positionally, in the order each metric declares its labels
    (``class`` is a Python keyword).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        counter = partial(Counter, registry=r)
        gauge = partial(Gauge, registry=r)
        histogram = partial(Histogram, registry=r)
        klass = ("class",)

        # Decisions
        self.decisions = counter(
            "slogate_decisions_total",
            "Decisions, one series per failed predicate (reason=none for admits).",
            ("outcome", "reason", "class"),
        )
        self.requests = counter("slogate_requests_total", "Arrivals, one per request.", ("outcome", "class"))
        self.deferral_outcomes = counter("slogate_deferral_outcomes_total", "How deferrals ended.", ("result", "class"))
        self.cost_quartiles = counter(
            "slogate_cost_quartile_requests_total",
            "Requests by their cost's quartile among recent arrivals (1 cheapest, server-seconds) and how "
            "they ended at the gate: admitted or refused (a deferral when it ends). Counted once the "
            "gate's cost book is warm; never-fitting requests are not ranked.",
            ("quartile", "result"),
        )
        self.retry_after = histogram(
            "slogate_retry_after_seconds",
            "Retry-After sent with rejections.",
            buckets=_RETRY_AFTER_BUCKETS,
        )
        self.decision_duration = histogram(
            "slogate_decision_duration_seconds",
            "Time spent deciding one arrival.",
            buckets=_DECISION_BUCKETS,
        )

        # Live accounting
        self.queued_prefill_tokens = gauge("slogate_queued_prefill_tokens", "Admitted prompt tokens awaiting prefill.")
        self.inflight_streams = gauge(INFLIGHT_STREAMS, "Admitted, unfinished requests.")
        self.deferred_requests = gauge(DEFERRED_REQUESTS, "Requests being deferred.")
        self.kv_reserved_tokens = gauge("slogate_kv_reserved_tokens", "KV cells reserved.")
        self.kv_capacity_tokens = gauge("slogate_kv_capacity_tokens", "KV cells of the server.")
        self.draining = gauge("slogate_draining", "1 while the sidecar drains (admits nothing; streams finish).")
        self.drain_refusals = counter(
            "slogate_drain_refusals", "Requests refused with 429 slogate_draining because the sidecar was draining."
        )

        # TTFT
        self.ttft_predicted = histogram(
            "slogate_ttft_predicted_seconds",
            "Predicted TTFT of admitted requests that got a first token.",
            klass,
            buckets=_TTFT_BUCKETS,
        )
        self.ttft_actual = histogram(
            "slogate_ttft_actual_seconds",
            "Measured TTFT of the same requests.",
            klass,
            buckets=_TTFT_BUCKETS,
        )
        self.ttft_error_ratio = histogram(
            "slogate_ttft_prediction_error_ratio",
            "(actual - predicted) / predicted TTFT; > 0: the gate was optimistic.",
            buckets=_ERROR_RATIO_BUCKETS,
        )
        self.slo_requests = counter(
            "slogate_slo_requests_total",
            "Admitted requests whose first token met or missed the class TTFT SLO.",
            ("class", "result"),
        )

        # Upstream and clients
        self.upstream_errors = counter("slogate_upstream_errors_total", "Failed upstream exchanges.", ("kind",))
        self.client_disconnects = counter("slogate_client_disconnects_total", "Clients gone before the response ended.")
        self.upstream_up = gauge("slogate_upstream_up", "1 if the last upstream scrape worked.")

        # Thresholds and rates
        self.token_budget = gauge(
            "slogate_threshold_token_budget",
            "Queued prompt tokens an arrival may wait behind.",
            klass,
        )
        self.ttft_budget = gauge("slogate_threshold_ttft_budget_seconds", "Admit-now TTFT budget.", klass)
        self.concurrency_cap = gauge("slogate_threshold_concurrency_cap", "Streams the class may fill.", klass)
        self.prefill_rate = gauge("slogate_prefill_rate_tokens_per_second", "Prefill tokens/s.", ("source",))
        self.decode_rate = gauge("slogate_decode_rate_tokens_per_second", "Per-stream decode tokens/s.", ("source",))
        self.rate_age = gauge("slogate_rate_age_seconds", "Age of the live rate's last sample.", ("kind",))
        self.thresholds_info = Info("slogate_thresholds", "Where the enforced thresholds come from.", registry=r)
        self.thresholds_loaded = gauge("slogate_thresholds_loaded", "1 once thresholds loaded.")
        self.threshold_updates = counter("slogate_threshold_updates_total", "Threshold updates by result.", ("result",))

        # Offered demand and capacity: the autoscaling signal (offered_demand, slogate_admission.demand)
        self.offered_requests = counter(
            "slogate_offered_requests",
            "First tries of the arrivals the gate decided on (admitted, deferred or refused); retries apart.",
        )
        self.offered_prompt_tokens = counter(
            "slogate_offered_prompt_tokens",
            "Prompt tokens of the same first tries, as the gate knew them when it decided (counted or estimated).",
        )
        self.offered_work = counter(
            "slogate_offered_work_seconds",
            "Server-seconds the same first tries cost this pod on its calibrated curves "
            "(T_prefill(n_in) + n_out / (B r_decode(B)), n_out as booked): summed over pods, the autoscaling signal.",
        )
        self.retried_requests = counter(
            "slogate_retried_requests",
            "Arrivals the gate decided on that were recognised as retries (not in slogate_offered_requests_total).",
        )
        self.capacity = CapacityCollector()
        """What the enforced thresholds say one pod sustains; exported once thresholds are loaded."""
        r.register(self.capacity)

        self._classes: frozenset[str] = frozenset()
        for kind in _UPSTREAM_ERRORS:
            self.upstream_errors.labels(kind=kind)
        for result in ("applied", "rejected"):
            self.threshold_updates.labels(result=result)

    # ------------------------------------------------------------------ thresholds

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """Publish newly applied thresholds; drop the series of classes that disappeared.

        Counters of a vanished class are kept (their history is still true); its threshold
        gauges are removed, so dashboards show only limits actually enforced.
        """
        names = frozenset(c.name for c in thresholds.classes)
        for gone in self._classes - names:
            for gauge in (self.token_budget, self.ttft_budget, self.concurrency_cap):
                gauge.remove(gone)
        self._classes = names
        for c in thresholds.classes:
            self.token_budget.labels(c.name).set(c.token_budget)
            self.ttft_budget.labels(c.name).set(c.ttft_budget_seconds)
            self.concurrency_cap.labels(c.name).set(c.concurrency_cap)
            # Zero series from the start, so rate() and ratios work before the first event.
            for outcome in _OUTCOMES:
                self.requests.labels(outcome, c.name)
            for result in _DEFERRAL_RESULTS:
                self.deferral_outcomes.labels(result, c.name)
            for slo_result in ("met", "missed"):
                self.slo_requests.labels(c.name, slo_result)
        for quartile in ("1", "2", "3", "4"):
            for ended in ("admitted", "refused"):
                self.cost_quartiles.labels(quartile, ended)
        self.kv_capacity_tokens.set(thresholds.kv_capacity_tokens)
        self.prefill_rate.labels(source="calibrated").set(thresholds.prefill_tokens_per_second)
        curve = thresholds.decode_tokens_per_second
        at_cap = curve[min(thresholds.concurrency_cap, len(curve)) - 1]
        self.decode_rate.labels(source="calibrated").set(at_cap)
        self.thresholds_info.info(
            {
                "calibration_id": thresholds.calibration_id,
                "fingerprint": thresholds.fingerprint,
                "model": thresholds.model,
                "quantization": thresholds.quantization,
            }
        )
        self.capacity.capacity = reference_capacity(thresholds)
        self.thresholds_loaded.set(1)
        self.threshold_updates.labels(result="applied").inc()

    def reject_thresholds(self) -> None:
        """Count an update that failed validation (the previous thresholds stay)."""
        self.threshold_updates.labels(result="rejected").inc()

    # ------------------------------------------------------------------ per request

    def record_decision(self, decision: Decision, seconds: float) -> None:
        """Count one arrival's first decision and how long it took.

        Call once per arrival: ``slogate_requests_total`` counts requests. A deferred
        request's fate is reported by `record_deferral`, not by a second decision.
        A degraded (clamped) admission is counted with reason ``kv``: the KV predicate
        failed for the max_tokens asked.
        """
        outcome = metric_outcome(decision)
        klass = decision.class_name
        self.requests.labels(outcome, klass).inc()
        if decision.reasons:
            reasons: tuple[str, ...] = tuple(r.value for r in decision.reasons)
        else:
            reasons = ("kv",) if outcome == DEGRADE else ("none",)
        for reason in reasons:
            self.decisions.labels(outcome, reason, klass).inc()
        if decision.outcome is Outcome.REJECT and decision.retry_after_s is not None:
            self.retry_after.observe(decision.retry_after_s)
        if decision.cost_quartile is not None and decision.outcome is not Outcome.DEFER:
            self.cost_quartiles.labels(str(decision.cost_quartile), _ended(decision.outcome is Outcome.ADMIT)).inc()
        self.decision_duration.observe(seconds)

    def record_deferral(self, result: DeferralResult, class_name: str, cost_quartile: int | None = None) -> None:
        """How one deferral ended; ``cost_quartile``: the arrival's, to count its end by cost."""
        self.deferral_outcomes.labels(result, class_name).inc()
        if cost_quartile is not None and result != "cancelled":
            self.cost_quartiles.labels(str(cost_quartile), _ended(result == "admitted")).inc()

    def record_ttft(self, class_name: str, predicted_s: float, actual_s: float, slo_s: float) -> None:
        """An admitted request's first token: both histograms see the same requests."""
        self.ttft_predicted.labels(class_name).observe(predicted_s)
        self.ttft_actual.labels(class_name).observe(actual_s)
        if predicted_s > 0:
            self.ttft_error_ratio.observe((actual_s - predicted_s) / predicted_s)
        result = "met" if actual_s <= slo_s else "missed"
        self.slo_requests.labels(class_name, result).inc()

    def record_upstream_error(self, kind: UpstreamErrorKind) -> None:
        """One failed upstream exchange."""
        self.upstream_errors.labels(kind=kind).inc()

    # ------------------------------------------------------------------ live state

    def set_accounting(self, state: LiveState) -> None:
        """The gate's live accounting (the state decisions are made against)."""
        self.queued_prefill_tokens.set(state.queued_prefill_tokens)
        self.inflight_streams.set(state.streams)
        self.deferred_requests.set(state.deferred)
        self.kv_reserved_tokens.set(state.reserved_kv_tokens)

    def set_rates(self, rates: RateEstimator, now: float, max_age_s: float) -> None:
        """Live rates and their ages; a live series is absent while there is none."""
        pairs = (
            (self.prefill_rate, "prefill", rates.prefill_tokens_per_s, rates.prefill_age_s),
            (self.decode_rate, "decode", rates.decode_tokens_per_s, rates.decode_age_s),
        )
        for gauge, kind, value_of, age_of in pairs:
            value = value_of(now, max_age_s)
            if value is None:
                gauge.remove("live")  # a no-op when absent
            else:
                gauge.labels(source="live").set(value)
            age = age_of(now)
            if age is None:
                self.rate_age.remove(kind)
            else:
                self.rate_age.labels(kind=kind).set(age)

    # ------------------------------------------------------------------ exposition

    def exposition(self) -> tuple[bytes, str]:
        """The body and content type of a ``/metrics`` answer."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class CapacityCollector:
    """The two capacity gauges, absent until thresholds are loaded.

    A gauge at 0 before then would read as a pod that sustains nothing (and divide by 0 in
    any ratio a dashboard makes of it); absent, the pod is simply not yet sized.
    """

    def __init__(self) -> None:
        self.capacity: Capacity | None = None
        """From the thresholds in force (``demand.reference_capacity``); None before the first load."""

    def collect(self) -> Iterator[Metric]:
        """The gauges, read at scrape time."""
        if self.capacity is None:
            return
        yield GaugeMetricFamily(
            CAPACITY_REQUESTS,
            "Reference requests/s this pod sustains at the SLO (throughputRps of the enforced thresholds).",
            value=self.capacity.requests_per_second,
        )
        yield GaugeMetricFamily(
            CAPACITY_PROMPT_TOKENS,
            "Prompt tokens/s this pod sustains at the SLO: throughputRps x the reference prompt's tokens.",
            value=self.capacity.prompt_tokens_per_second,
        )
