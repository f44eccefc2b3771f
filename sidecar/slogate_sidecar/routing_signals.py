"""The routing signals: what an inference gateway's endpoint picker scrapes to choose a pod.

llm-d-router's picker (docs/routing.md) reads, per pod, a waiting-requests gauge, a
running-requests gauge, a KV-cache usage fraction and any other scalar it is told of. llama-server
has no KV metric, and its /metrics can block during a long decode while the picker counts
anything older than about 200 ms as saturated. So the sidecar answers from its own memory,
exactly one unlabelled series each:

| signal | series | from |
| --- | --- | --- |
| requests waiting | ``slogate_deferred_requests`` | the deferral queue (``SidecarMetrics``, set when scraped) |
| requests running | ``slogate_inflight_streams`` | the ledger's streams (``SidecarMetrics``, set when scraped) |
| KV usage, 0..1 | ``slogate_kv_usage_ratio`` | reserved / capacity (this collector) |
| queue wait | ``slogate_queue_wait_seconds`` | queued prefill / the rate decisions use (this collector) |
| room | ``slogate_admit_headroom_tokens`` | prompt tokens the default class could admit now (this collector) |

The last three come from the core's ``headroom.headroom`` at the moment of the scrape (a
collector, not gauges set by events), so they are exact then. A scrape reads memory only:
nothing is asked of llama-server. A gate that admits nothing (no thresholds yet, or the
sidecar draining) reads closed: KV usage 1, queue wait +Inf, no room.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from slogate_admission.headroom import Headroom, headroom
from slogate_sidecar.gate import Gate
from slogate_sidecar.metrics import DEFERRED_REQUESTS, INFLIGHT_STREAMS

__all__ = ["ADMIT_HEADROOM", "KV_USAGE", "QUEUE_WAIT", "ROUTING_SIGNALS", "RUNNING", "WAITING", "RoutingSignals"]

WAITING = DEFERRED_REQUESTS
"""Requests waiting: the picker's queued-requests spec."""
RUNNING = INFLIGHT_STREAMS
"""Requests running: the picker's running-requests spec."""
KV_USAGE = "slogate_kv_usage_ratio"
"""KV usage fraction 0..1: the picker's KV spec."""
QUEUE_WAIT = "slogate_queue_wait_seconds"
"""Predicted queue wait of an arrival now: a custom metric for a scorer (lower is better)."""
ADMIT_HEADROOM = "slogate_admit_headroom_tokens"
"""Prompt tokens the default class could still admit now: a custom metric (higher is better)."""
ROUTING_SIGNALS = (WAITING, RUNNING, KV_USAGE, QUEUE_WAIT, ADMIT_HEADROOM)
"""Every series a picker reads, in the order docs/routing.md lists them."""

_HELP = {
    KV_USAGE: "KV cells reserved by admitted requests / the server's KV cells (0..1; 1 when admitting nothing).",
    QUEUE_WAIT: "Predicted seconds an arrival would wait behind the queued prefill (+Inf when admitting nothing).",
    ADMIT_HEADROOM: "Prompt tokens the default class could still admit on its TTFT now (0 when admitting nothing).",
}


class RoutingSignals:
    """A Prometheus collector of the three signals the gate computes when scraped."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def register(self, registry: CollectorRegistry) -> RoutingSignals:
        """Add the signals to ``registry`` (the sidecar's own); returns self."""
        registry.register(self)
        return self

    def now(self) -> Headroom:
        """The gate's load and room at this instant, on the clock the gate decides with."""
        return headroom(self.gate.machine, self.gate.clock(), admitting=not self.gate.drain.active)

    def collect(self) -> Iterator[Metric]:
        """One unlabelled sample per signal, read from the gate's books now."""
        room = self.now()
        values = {KV_USAGE: room.kv_usage, QUEUE_WAIT: room.queue_wait_s, ADMIT_HEADROOM: room.admit_now_tokens}
        for name, value in values.items():
            yield GaugeMetricFamily(name, _HELP[name], value=value)

    def describe(self) -> Iterator[Metric]:
        """The names alone, so the registry refuses a second collector of the same series
        without computing anything."""
        for name, help_text in _HELP.items():
            yield GaugeMetricFamily(name, help_text)
