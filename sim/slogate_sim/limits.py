"""The baselines' settings, and how a careful operator would pick them from a calibration.

One count cap and one rate limit, read by both the real proxies (``baselines``) and the
simulated fronts (``fronts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CountCap:
    """A request-count cap: forwarded at once, and waiting in FIFO order behind them."""

    concurrency: int
    """Requests forwarded at once, at most."""
    queue: int
    """Requests waiting in front, at most; any more are refused at once."""

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.queue < 0:
            raise ValueError(f"a count cap needs concurrency >= 1 and queue >= 0, got {self}")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket: ``rate_rps`` tokens per second, at most ``burst`` saved up."""

    rate_rps: float
    """Tokens per second."""
    burst: int
    """The bucket's size: requests that may pass at once after a quiet spell."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_rps) and self.rate_rps > 0) or self.burst < 1:
            raise ValueError(f"a rate limit needs a rate > 0 and a burst >= 1, got {self}")


def fair_count_cap(slots: int, slo_s: float, mean_service_s: float) -> CountCap:
    """The count cap a careful operator would pick from the same SLO and calibration.

    concurrency = slots (the server's parallel sequences, 4 here): more would only
    queue inside llama-server, fewer would idle slots.

    queue = floor(slots · SLO / S), with S the calibrated mean service time, the time
    a request holds a slot (prefill + decode while sharing the server with the other
    slots). By Little's law the slots complete slots / S requests per second, so the
    request at queue position q waits about q · S / slots before it starts; the deepest
    queue whose last request still starts within the SLO is slots · SLO / S.

    From a calibrated capacity μ (requests per second for the whole server, see
    ``capacity``) S = slots / μ, so queue = floor(SLO · μ). The operator counts
    requests, not tokens: the same depth is used for every prompt size.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, not {slots}")
    if slo_s <= 0 or mean_service_s <= 0:
        raise ValueError("the SLO and the mean service time must be positive")
    return CountCap(slots, math.floor(slots * slo_s / mean_service_s))


def fair_rate_limit(capacity_rps: float, slots: int) -> RateLimit:
    """The static rate limit tuned on the calibrated capacity μ of the workload.

    rate = μ: any higher and the server's queue grows without bound; lower wastes it.
    burst = slots: as many requests at once as the server can start in parallel.
    """
    if capacity_rps <= 0 or slots < 1:
        raise ValueError("capacity must be positive and slots >= 1")
    return RateLimit(capacity_rps, slots)
