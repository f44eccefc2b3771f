"""How load-generator clients react to a 429/503: none, immediate, backoff with jitter
honouring Retry-After, or backoff within a retry budget (spec: "Retry amplification")."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

RetryKind = Literal["none", "immediate", "backoff", "budget"]
RETRY_KINDS: tuple[RetryKind, ...] = ("none", "immediate", "backoff", "budget")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a client reacts to a 429/503. Timeouts and errors are never retried."""

    kind: RetryKind = "none"
    max_attempts: int = 4
    """Attempts per request, the first included."""
    base_s: float = 0.5
    cap_s: float = 8.0
    budget_ratio: float = 0.1
    """``budget``: retries may not exceed this fraction of the requests sent so far."""

    def __post_init__(self) -> None:
        if self.kind not in RETRY_KINDS:
            raise ValueError(f"unknown retry behaviour {self.kind!r}: one of {', '.join(RETRY_KINDS)}")
        if self.max_attempts < 1 or self.base_s < 0 or self.cap_s < 0 or self.budget_ratio < 0:
            raise ValueError("max_attempts must be >= 1; delays and budget ratio non-negative")

    def delay(self, failed_attempts: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Seconds before the next attempt, after ``failed_attempts`` rejections.

        immediate: none. backoff and budget: exponential backoff with full jitter,
        uniform(0, min(cap, base · 2^(k−1))), and never less than the Retry-After.
        """
        if self.kind in ("none", "immediate"):
            return 0.0
        jittered = rng.uniform(0.0, min(self.cap_s, self.base_s * 2 ** (failed_attempts - 1)))
        return max(retry_after_s or 0.0, jittered)


NO_RETRY = RetryPolicy()


@dataclass(slots=True)
class RetryBudget:
    """A retry may be spent only while retries stay <= ratio x requests sent so far."""

    ratio: float = 0.1
    requests: int = 0
    retries: int = 0

    def request(self) -> None:
        self.requests += 1

    def try_spend(self) -> bool:
        if self.retries + 1 > self.ratio * self.requests:
            return False
        self.retries += 1
        return True


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in (possibly fractional) seconds; HTTP dates are not used by these servers."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
