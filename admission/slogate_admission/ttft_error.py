"""How wrong the TTFT prediction is: a bias by load, a margin per class, learned from first tokens.

Spec: "Deriving the admission threshold from the SLO" predicts TTFT(r) ≈ queued / R +
T_prefill(n_in): a median, at best. A promise about admitted requests ("the SLO's
quantile q of their TTFT is within it") needs the prediction's error, and the gate sees
that error on every admitted request's first token. Two parts, both pure, each read in
O(1) by a decision:

- **Bias by load.** The prediction is off in a way that depends on what the server is
  doing: measured on llama-server at 3x (the demo's overload), the median of actual /
  predicted was about 1.15 with no other stream in service and 0.8 with the other three
  slots busy (llama.cpp prefills the queued prompts of several slots in one batch,
  so a full queue drains faster than one prompt alone is processed; decode tokens of
  resident streams share every batch with a prompt). So the correction is kept per
  number of streams in service at the decision, B: factor_B <- clamp(factor_B x
  median(actual / predicted) over its last ``batch`` first tokens). Predictions made with
  the factor in force are judged, so a right factor stays (median ratio 1) and a wrong
  one moves geometrically toward right; the clamp keeps one bad batch from switching
  protection off (or everything away). The gate divides its prefill rate by factor_B.
- **Margin for the quantile.** What is left, ρ = actual / predicted with the bias
  corrected, is spread (HTTP, scheduling, batching, prompt-count error) with a heavy
  tail: measured, a few ratios of 2 or 3 among tens near 1. Over a class's last
  ``window`` first tokens, sorted ρ_(1) ≤ … ≤ ρ_(n), the distribution-free one-sided
  prediction bound for the next request's ρ at level q is the order statistic

      margin_q = ρ_(k),  k = ⌈q · (n + 1)⌉

  (P(ρ_next ≤ ρ_(k)) = k / (n + 1) ≥ q for any continuous distribution: no shape is
  assumed, so a heavy tail is neither ignored nor blown up by a fitted variance). With
  fewer than q / (1 − q) samples no order statistic reaches q; the largest seen is
  used (coverage n / (n + 1)), the best the data can say. The gate admits when
  waited + margin_q · (queue wait + own prefill) ≤ SLO, which holds the q-th quantile of
  the actual TTFT within the SLO. Only predictions of at least a quarter of the class's
  SLO are judged for the margin: it matters where a request is admitted near the SLO,
  and ratios of tiny predictions measure a fixed overhead (tens of ms of HTTP) that would
  inflate a multiplicative margin where it does not apply. The margin never drops below
  the prior, the calibration's own timing noise at the same quantile
  (``derivation.ttft_margin_prior``), nor below 1.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from slogate_admission._checks import require_positive

__all__ = ["BiasByLoad", "Margin", "TtftErrorModel"]

MIN_JUDGED_PREDICTION_S = 0.05
"""Predictions under 50 ms are too small to judge: the HTTP round trip alone is that big."""


@dataclass(slots=True)
class BiasByLoad:
    """Per streams-in-service B: the factor the predicted TTFT is multiplied by."""

    buckets: int
    """B = 0 .. buckets − 1; a larger B shares the last bucket."""
    batch: int = 8
    """First tokens per update of one bucket's factor."""
    lo: float = 0.5
    hi: float = 2.0
    factors: list[float] = field(default_factory=list)
    _ratios: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {self.buckets}")
        self.factors = [1.0] * self.buckets
        self._ratios = [[] for _ in range(self.buckets)]

    def bucket(self, streams: int) -> int:
        return min(max(streams, 0), self.buckets - 1)

    def factor(self, streams: int) -> float:
        return self.factors[self.bucket(streams)]

    def observe(self, streams: int, ratio: float) -> None:
        """One first token of a request decided with ``streams`` in service."""
        b = self.bucket(streams)
        ratios = self._ratios[b]
        ratios.append(ratio)
        if len(ratios) >= self.batch:
            self.factors[b] = min(max(self.factors[b] * statistics.median(ratios), self.lo), self.hi)
            ratios.clear()


@dataclass(slots=True)
class Margin:
    """One class's q-quantile margin over its recent residual ratios (see the module)."""

    quantile: float
    prior: float = 1.0
    window: int = 256
    _recent: deque[float] = field(default_factory=deque)
    _sorted: list[float] = field(default_factory=list)
    value: float = 1.0
    """The margin in force (>= 1: the gate never admits beyond its median prediction)."""

    def __post_init__(self) -> None:
        require_positive("prior", self.prior)
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        self.value = max(1.0, self.prior)

    @property
    def samples(self) -> int:
        return len(self._recent)

    def observe(self, ratio: float) -> None:
        """One judged ratio: the window slides, the order statistic is read again (O(window))."""
        self._recent.append(ratio)
        bisect.insort(self._sorted, ratio)
        if len(self._recent) > self.window:
            self._sorted.pop(bisect.bisect_left(self._sorted, self._recent.popleft()))
        n = len(self._sorted)
        k = min(n, math.ceil(self.quantile * (n + 1)))
        self.value = max(1.0, self.prior, self._sorted[k - 1])


@dataclass(slots=True)
class TtftErrorModel:
    """The gate's knowledge of its own TTFT error: bias by load, margin per class."""

    quantile: float
    """The SLO's quantile: the share of admitted requests whose TTFT is to be within it."""
    prior: float
    """The margin before a class has ``min_samples`` judged first tokens."""
    bias: BiasByLoad
    margins: dict[str, Margin] = field(default_factory=dict)

    @classmethod
    def fresh(cls, quantile: float, prior: float, max_streams: int) -> TtftErrorModel:
        """Nothing learned yet: factor 1 at every B, the prior margin in every class."""
        return cls(quantile, prior, BiasByLoad(buckets=max_streams + 1))

    def margin(self, class_name: str) -> float:
        m = self.margins.get(class_name)
        return m.value if m is not None else max(1.0, self.prior)

    def observe(self, class_name: str, slo_s: float, streams: int, predicted_s: float, actual_s: float) -> None:
        """One admitted request's first token.

        ``predicted_s``: what the gate predicted for the time from its decision to the
        first token (queue wait + own prefill, the bias in force); ``actual_s``: that time.
        """
        if predicted_s < MIN_JUDGED_PREDICTION_S or actual_s <= 0:
            return
        ratio = actual_s / predicted_s
        self.bias.observe(streams, ratio)
        if predicted_s >= slo_s / 4:
            margin = self.margins.get(class_name)
            if margin is None:
                margin = self.margins[class_name] = Margin(self.quantile, self.prior)
            margin.observe(ratio)
