"""Conservative n_out: the output length is unknown at arrival, so we bound it.

Spec: "LLM twist 1" and "Pitfalls" (budget with a conservative quantile of n_out,
not its mean). Three estimates, chosen by policy: the client's max_tokens (the
worst case), a per-route streaming quantile learned from responses, or a default.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from enum import StrEnum

from slogate_admission._checks import require_fraction, require_positive


class OutputTokenEstimate(StrEnum):
    """How the gate bounds a request's output tokens."""

    MAX_TOKENS = "MaxTokens"
    ROUTE_QUANTILE = "RouteQuantile"
    DEFAULT = "Default"


class SlidingQuantile:
    """Exact quantiles over the last ``window`` observations.

    Why not a sketch (t-digest, DDSketch): a sketch summarises all history with
    bounded *relative* error, but n_out is small integers whose distribution drifts
    when a route's prompts change, and the gate must forget old behaviour. A window
    of a few hundred samples gives exact order statistics of recent traffic, in
    O(window) memory, an O(log w + w) update (a bisect and a memmove of a few
    hundred pointers, off the decision path) and an O(1) read. No dependency.
    """

    __slots__ = ("_arrival", "_sorted", "window")

    def __init__(self, window: int = 512) -> None:
        require_positive("window", window)
        self.window = window
        self._arrival: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._arrival)

    def observe(self, value: float) -> None:
        """Add one sample; the oldest leaves once the window is full."""
        if not math.isfinite(value):
            raise ValueError(f"sample must be finite, got {value!r}")
        if len(self._arrival) == self.window:
            oldest = self._arrival.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._arrival.append(value)
        bisect.insort(self._sorted, value)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (nearest rank, never interpolated below a real sample); None if empty.

        Nearest rank = the smallest sample with at least q of the samples at or below
        it: with q = 0.95 at least 95% of recent outputs fit in the estimate.
        """
        require_fraction("q", q, allow_zero=False)
        if not self._sorted:
            return None
        rank = math.ceil(q * len(self._sorted))
        return self._sorted[max(rank, 1) - 1]


def estimate_output_tokens(
    policy: OutputTokenEstimate,
    *,
    max_tokens: int | None,
    default: int,
    route_quantile: float | None = None,
) -> int:
    """The n_out the gate reserves for.

    - MaxTokens: the client's max_tokens (worst case); ``default`` if it sent none.
    - RouteQuantile: the route's learned quantile, capped by max_tokens (the server
      never generates more); falls back to the MaxTokens rule until learned.
    - Default: ``default``, capped by max_tokens.
    A cap of max_tokens is always safe: the server stops there.
    """
    require_positive("default", default)
    if max_tokens is not None and max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    worst_case = max_tokens if max_tokens is not None else default
    if policy is OutputTokenEstimate.MAX_TOKENS:
        return worst_case
    if policy is OutputTokenEstimate.ROUTE_QUANTILE:
        if route_quantile is None:
            return worst_case
        learned = math.ceil(route_quantile)
        return learned if max_tokens is None else min(learned, max_tokens)
    return default if max_tokens is None else min(default, max_tokens)
