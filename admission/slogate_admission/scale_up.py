"""The scale-up stabilization window that buys pods only for demand that lasts (issue 28.4).

A pod the autoscaler asks for serves nothing until it is ready, ``startup_s`` later, and is
then held through the scale-down window (Kubernetes' default 300 s). Demand that ends
before a new pod is ready is served by the pods already there or shed by their gates
(429 with a Retry-After), whatever the autoscaler does: buying pods for it only costs
their start-up and the scale-down window. Pods are for demand that outlasts a start-up.

The HPA's scale-up stabilization window W makes it scale up to the *least* recommendation
of the last W seconds, so it follows a rise only once every recommendation over W shows it.
A burst of length D reads above the baseline in a rate over R seconds for D + R, and the
HPA records one recommendation per sync interval P. So with

    W = startup + R + P

a burst no longer than a pod's start-up never holds a higher recommendation over the whole
window, and buys no pod; demand that lasts is followed W later than with no window. The
simulated fleet measures both sides on the same arrivals (`make bench-autoscale`,
docs/autoscaling.md, "Spikes: the scale-up window").
"""

from __future__ import annotations

import math

from slogate_admission._checks import require_non_negative, require_positive

__all__ = ["MAX_WINDOW_S", "lasting_demand_window_s"]

MAX_WINDOW_S = 3600
"""The HPA's own bound on stabilizationWindowSeconds."""


def lasting_demand_window_s(startup_s: float, rate_window_s: float, interval_s: float) -> int:
    """W = startup + R + P in whole seconds (rounded up, at most the HPA's 3600): the
    scale-up window over which demand must last before the autoscaler buys a pod for it."""
    require_non_negative("startup_s", startup_s)
    require_positive("rate_window_s", rate_window_s)
    require_positive("interval_s", interval_s)
    return min(MAX_WINDOW_S, math.ceil(startup_s + rate_window_s + interval_s))
