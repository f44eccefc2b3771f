"""The token-denominated time-to-first-token predicate.

Spec: "Deriving the admission threshold from the SLO". A new arrival waits for the
prefill work queued ahead of it, then its own prefill:

    TTFT(r) ≈ queued_tokens / prefill_rate + T_prefill(n_in)

Tracking one scalar (queued tokens) and dividing by the measured rate is the
right unit when request sizes vary 100x; counting requests is not.
"""

from __future__ import annotations

from slogate_admission._checks import require_non_negative, require_positive


def queue_wait_s(queued_tokens: float, prefill_tokens_per_s: float) -> float:
    """Expected queue delay = queued prefill tokens / measured prefill rate (seconds)."""
    require_non_negative("queued_tokens", queued_tokens)
    require_positive("prefill_tokens_per_s", prefill_tokens_per_s)
    return queued_tokens / prefill_tokens_per_s


def predicted_ttft_s(queued_tokens: float, prefill_tokens_per_s: float, own_prefill_s: float) -> float:
    """TTFT(r) ≈ queued / rate + T_prefill(n_in)."""
    require_non_negative("own_prefill_s", own_prefill_s)
    return queue_wait_s(queued_tokens, prefill_tokens_per_s) + own_prefill_s


def token_budget(ttft_budget_s: float, prefill_tokens_per_s: float) -> float:
    """Queued tokens an empty request could still wait behind: TTFT_SLO · rate.

    Computed once per class when thresholds are derived (and again only when the
    live rate moves); each arrival then subtracts its own prefill, an O(1) step.
    """
    require_positive("ttft_budget_s", ttft_budget_s)
    require_positive("prefill_tokens_per_s", prefill_tokens_per_s)
    return ttft_budget_s * prefill_tokens_per_s


def max_queued_tokens(ttft_budget_s: float, own_prefill_s: float, prefill_tokens_per_s: float) -> float:
    """Max queued tokens for this request: (TTFT_SLO − T_prefill(n_in)) · rate.

    Negative when the request's own prefill alone exceeds the SLO: it can never be
    admitted on time, however empty the queue. Worked example: (2.0 − 0.67) · 1200 ≈ 1,600.
    """
    require_non_negative("own_prefill_s", own_prefill_s)
    return token_budget(ttft_budget_s, prefill_tokens_per_s) - own_prefill_s * prefill_tokens_per_s


def ttft_admits(queued_tokens: float, max_queued: float) -> bool:
    """admit ⇔ queued ≤ max queued tokens ⇔ queue wait + own prefill ≤ TTFT_SLO."""
    return queued_tokens <= max_queued
