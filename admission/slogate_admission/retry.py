"""The reject path's arithmetic: when to come back, and what retries cost.

Spec: "Retry amplification: pricing the rejection itself".
"""

from __future__ import annotations

import math

from slogate_admission._checks import require_fraction, require_non_negative, require_positive


def retry_after_s(queued_tokens: float, admissible_queued_tokens: float, prefill_tokens_per_s: float) -> float:
    """Seconds until the live queue has drained to what this request may wait behind.

    (queued − max_queued) / rate, floored at 0: the server's estimate of when capacity
    exists, which turns a rejection into a deferral the client can act on. With
    ``admissible_queued_tokens`` = 0 this is the spec's rough queued / throughput.
    Non-decreasing in the queue, never negative.
    """
    require_non_negative("queued_tokens", queued_tokens)
    require_positive("prefill_tokens_per_s", prefill_tokens_per_s)
    return max(queued_tokens - max(admissible_queued_tokens, 0.0), 0.0) / prefill_tokens_per_s


def retry_after_whole_s(seconds: float) -> int:
    """The Retry-After a client is told: whole seconds (the header's unit), rounded up, and
    never 0, which would invite an instant retry storm. The sidecar sends it; the simulator's
    retrying clients wait it."""
    return max(1, math.ceil(seconds))


def retry_amplification(reject_fraction: float) -> float:
    """1 / (1 − p) = 1 + p + p² + …: arrivals per original request when every rejection retries.

    Rejecting 50% of traffic that retries at once doubles arrivals.
    """
    require_fraction("reject_fraction", reject_fraction)
    return 1.0 / (1.0 - reject_fraction)


def effective_arrival_rate(arrival_rate: float, reject_fraction: float) -> float:
    """λ_eff = λ · (1 + p + p² + …) = λ / (1 − p) with immediate retries."""
    require_non_negative("arrival_rate", arrival_rate)
    return arrival_rate * retry_amplification(reject_fraction)


def retry_budget_allows(retries: int, requests: int, budget_fraction: float = 0.1) -> bool:
    """Client-side retry budget: one more retry only while retries ≤ fraction · requests.

    Caps amplification at 1 + fraction whatever the server does.
    """
    require_non_negative("retries", retries)
    require_non_negative("requests", requests)
    require_non_negative("budget_fraction", budget_fraction)
    return retries + 1 <= math.floor(budget_fraction * requests)
