"""The Horizontal Pod Autoscaler's algorithm, pure and clock-injected, and the signals it may read.

Kubernetes' documentation ("Horizontal Pod Autoscaling", algorithm details) and its
controller (``pkg/controller/podautoscaler``: ``replica_calculator.go``, ``horizontal.go``),
one sync every ``interval`` (the controller's ``--horizontal-pod-autoscaler-sync-period``,
15 s):

1. **Proposal** from the metric (``utilization_proposal``, ``average_value_proposal``):
   ratio = metric / target; within the tolerance (|ratio − 1| ≤ 0.1) the current count
   stays; else desired = ⌈ratio · current⌉, which for an External metric with an
   AverageValue target is ⌈total / target⌉. For a Resource utilization (CPU), the ratio is
   over the ready pods with metrics; when it asks for more and some pods are not ready,
   those count as using nothing and the ratio is taken again over all of them (the
   controller's "missing metrics" rule: a starting pod does not make it scale further).
2. **Stabilization** (``Hpa.step``): every proposal is remembered; the result is the current
   count brought within [min of the proposals over the scale-up window, max of the proposals
   over the scale-down window] (defaults 0 s and 300 s).
3. **Rate policies**: scale up by at most max(100 %, 4 pods) per 15 s, down by at most
   100 % per 15 s (the defaults; for each policy the replicas added (removed) within its
   period are subtracted (added back) first); then min/max replicas.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "SIGNALS",
    "Hpa",
    "HpaSpec",
    "RatePolicy",
    "Signal",
    "average_value_proposal",
    "utilization_proposal",
]

Signal = Literal["cpu", "waiting", "slogate", "slogate-all-tries", "slogate-reference"]
SIGNALS: tuple[Signal, ...] = ("cpu", "waiting", "slogate", "slogate-all-tries", "slogate-reference")
"""What an autoscaler reads (``fleet`` measures each):

- ``cpu``: a pod's CPU utilisation, HPA's default Resource metric (target 70 %);
- ``waiting``: llama-server's waiting requests plus the gate's deferred, an External
  AverageValue (target 5 per pod);
- ``slogate``: the operator's query, Σ rate(``slogate_offered_work_seconds_total``): the
  offered first tries' server-seconds per second, each priced by ``demand.offered_work_s``
  on its pod's gate config (target 0.7 per pod);
- ``slogate-all-tries``: the same with every try counted as demand (retries included);
- ``slogate-reference``: not a signal of the product, kept as the measured evidence for why:
  the request ratio max(λ / μ_ref, λ_tokens / (μ_ref · n_ref)) of the first tries against the
  policy's reference request (``demand.reference_capacity``), target 0.7 per pod.
"""
DEFAULT_TOLERANCE = 0.1
"""The controller's ``--horizontal-pod-autoscaler-tolerance``."""


@dataclass(frozen=True, slots=True)
class RatePolicy:
    """One scaling policy: at most ``value`` pods (or percent) per ``period_s``."""

    kind: Literal["Pods", "Percent"]
    """Pods: a count; Percent: of the replicas at the period's start."""
    value: int
    """How many pods, or what percentage."""
    period_s: float = 15.0
    """The window over which the policy's changes add up."""


@dataclass(frozen=True, slots=True)
class HpaSpec:
    """An HPA's bounds and behaviour (the defaults are Kubernetes' own)."""

    min_replicas: int
    """Never fewer."""
    max_replicas: int
    """Never more."""
    interval_s: float = 15.0
    """The controller's sync period."""
    tolerance: float = DEFAULT_TOLERANCE
    """No change while |metric / target − 1| is within it."""
    up_window_s: float = 0.0
    """scaleUp.stabilizationWindowSeconds."""
    down_window_s: float = 300.0
    """scaleDown.stabilizationWindowSeconds."""
    up_policies: tuple[RatePolicy, ...] = (RatePolicy("Percent", 100), RatePolicy("Pods", 4))
    """scaleUp.policies, selectPolicy Max (the most permissive applies)."""
    down_policies: tuple[RatePolicy, ...] = (RatePolicy("Percent", 100),)
    """scaleDown.policies, selectPolicy Max."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min <= max replicas, got {self.min_replicas}, {self.max_replicas}")
        if not self.interval_s > 0:
            raise ValueError(f"interval must be > 0, got {self.interval_s}")


def _within(ratio: float, tolerance: float) -> bool:
    return abs(ratio - 1.0) <= tolerance


def average_value_proposal(total: float, target: float, current: int, tolerance: float = DEFAULT_TOLERANCE) -> int:
    """An External metric with an AverageValue target: ratio = total / (target · current),
    desired = ⌈total / target⌉ unless the ratio is within the tolerance."""
    if not target > 0:
        raise ValueError(f"target must be > 0, got {target}")
    if current > 0 and _within(total / (target * current), tolerance):
        return current
    return math.ceil(total / target)


def utilization_proposal(
    ready_usages: list[float], unready: int, target: float, current: int, tolerance: float = DEFAULT_TOLERANCE
) -> int:
    """A Resource utilization target over the pods: ``ready_usages`` of the ready pods with
    metrics (fractions), ``unready`` pods without (starting). replica_calculator.go's
    GetResourceReplicas: ratio = mean(ready) / target; no change within the tolerance; when
    it would scale up with unready pods, those count as 0 and the ratio is taken again (no
    change if it then falls within the tolerance or turns to a scale-down)."""
    if not target > 0:
        raise ValueError(f"target must be > 0, got {target}")
    if not ready_usages:
        return current  # no metrics at all: the controller skips the sync
    ratio = sum(ready_usages) / len(ready_usages) / target
    if unready == 0 or ratio <= 1.0:
        if _within(ratio, tolerance):
            return current
        return math.ceil(ratio * len(ready_usages))
    if _within(ratio, tolerance):
        return current
    rebalanced = sum(ready_usages) / (len(ready_usages) + unready) / target
    if _within(rebalanced, tolerance) or rebalanced < 1.0:
        return current
    return math.ceil(rebalanced * (len(ready_usages) + unready))


class Hpa:
    """One HPA's memory (proposals and scale events) and its step; the caller passes ``now``."""

    def __init__(self, spec: HpaSpec) -> None:
        self.spec = spec
        self._proposals: deque[tuple[float, int]] = deque()
        self._events: deque[tuple[float, int]] = deque()
        """(time, replicas changed: + up, − down)."""

    def step(self, now: float, proposal: int, current: int) -> int:
        """The replicas to run after this sync, from the metric's ``proposal``."""
        spec = self.spec
        horizon = max(spec.up_window_s, spec.down_window_s)
        while self._proposals and self._proposals[0][0] <= now - horizon:
            self._proposals.popleft()
        up = down = proposal
        for at, value in self._proposals:
            if at > now - spec.up_window_s:  # the controller's timestamp.After(cutoff)
                up = min(up, value)
            if at > now - spec.down_window_s:
                down = max(down, value)
        self._proposals.append((now, proposal))
        longest = max((p.period_s for p in (*spec.up_policies, *spec.down_policies)), default=0.0)
        while self._events and self._events[0][0] <= now - longest:
            self._events.popleft()
        stabilized = min(max(current, up), down)
        desired = self._rate_limited(now, stabilized, current)
        if desired != current:
            self._events.append((now, desired - current))
        return desired

    def _rate_limited(self, now: float, desired: int, current: int) -> int:
        spec = self.spec
        if desired > current:
            limits = []
            for p in spec.up_policies:
                start = current - self._changed(now, p.period_s, up=True)
                limits.append(start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100)))
            limit = max(*limits, current)
            return min(desired, limit, spec.max_replicas)
        if desired < current:
            limits = []
            for p in spec.down_policies:
                start = current + self._changed(now, p.period_s, up=False)
                limits.append(start - p.value if p.kind == "Pods" else math.ceil(start * (1 - p.value / 100)))
            limit = min(*limits, current)
            return max(desired, limit, spec.min_replicas)
        return min(max(desired, spec.min_replicas), spec.max_replicas)

    def _changed(self, now: float, period_s: float, *, up: bool) -> int:
        """Replicas added (``up``) or removed within the last ``period_s``."""
        return sum(abs(change) for at, change in self._events if at > now - period_s and (change > 0) == up)
