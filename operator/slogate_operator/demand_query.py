"""The autoscaling query: a workload's offered demand in pods' worth of its own capacity.

    ρ = Σ over the workload's pods of rate(slogate_offered_work_seconds_total[W])

Each sidecar prices every first try at the server-seconds it costs one pod on that pod's
calibrated curves (``slogate_admission.demand.offered_work_s``: T_prefill(n_in) +
n_out / (B · r_decode(B)), the cost whose mean defines μ). A pod supplies one server-second per
second, so the sum is demand over per-pod capacity, λ / μ, for whatever mix arrives: the
capacity is in each request's price, taken from the thresholds the pod enforces, so a
recalibration (new model, quantization, CPU limit) re-prices the demand and moves the scaling
with no number edited anywhere. Retries are not demand (the sidecar counts first tries only).
The autoscaler's target (the ScaledObject's threshold, the HPA's averageValue) is the only
number, and it lives there, not here. With no demand, or no sidecar scraped yet, the query
yields 0 (``or vector(0)``), so the autoscaler falls to minReplicas rather than erring.

The series is the sidecar's (docs/metrics.md), labelled by the chart's PodMonitor with
``namespace`` and ``workload`` (the Deployment).
"""

from __future__ import annotations

OFFERED_WORK = "slogate_offered_work_seconds_total"
DEFAULT_WINDOW_S = 60
"""The rate window: four scrapes at the PodMonitor's 15 s interval, enough for rate() to
have two samples after a missed scrape."""


def label_matchers(namespace: str, workload: str) -> str:
    """The selector every series of the query carries."""
    return f'namespace="{namespace}",workload="{workload}"'


def ratio_query(matchers: str, window_s: int) -> str:
    """ρ over the series that ``matchers`` selects (a PromQL label-matcher list, no braces)."""
    if window_s < 1:
        raise ValueError(f"the rate window must be at least 1 s, got {window_s}")
    return f"sum(rate({OFFERED_WORK}{{{matchers}}}[{window_s}s])) or vector(0)"


def demand_query(namespace: str, workload: str, window_s: int = DEFAULT_WINDOW_S) -> str:
    """ρ of one Deployment: what the ScaledObject's Prometheus trigger asks."""
    return ratio_query(label_matchers(namespace, workload), window_s)
