"""How long the target's pods take from creation to Ready, as the API server recorded it.

The autoscaler's scale-up window is derived from it (``slogate_admission.scale_up``): a pod
bought for demand shorter than this arrives after the demand has gone. It is measured, never
configured: scheduling, the container's start, the model's load and the readiness probe are
all in it, on this cluster, for this model.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from slogate_operator.timestamps import parse_time


def startup_s(pod: Mapping[str, Any]) -> float | None:
    """Creation to Ready of a pod that became Ready once and stayed so: None for a pod not
    Ready, or whose containers restarted (its Ready time is the restart's, not the start's)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return None
    containers = [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
    if not containers or any(int(c.get("restartCount") or 0) > 0 for c in containers):
        return None
    ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        return None
    created, became = parse_time(meta.get("creationTimestamp")), parse_time(ready.get("lastTransitionTime"))
    if created is None or became is None or became < created:
        return None
    return (became - created).total_seconds()


def median_startup_s(pods: Iterable[Mapping[str, Any]]) -> float | None:
    """The median start-up of the pods that have one (one slow node does not set it); None
    when none has."""
    measured = [s for s in map(startup_s, pods) if s is not None]
    return statistics.median(measured) if measured else None


SETTLED = 0.2
"""A new measurement replaces the one in force only when it differs by more than this share:
pods come and go, and each small move of the median would rewrite every autoscaler."""


def settled(in_force: float | None, measured: float | None) -> float | None:
    """The start-up to use: the one in force (``status.autoscaling.podStartupSeconds``) unless
    ``measured`` moved from it by more than ``SETTLED``; the one in force when none was measured."""
    if measured is None:
        return in_force
    if in_force is not None and abs(measured - in_force) <= SETTLED * in_force:
        return in_force
    return measured
