"""A pod's start-up as the API server recorded it (slogate_operator.pod_startup): creation to
the Ready condition's transition, only for pods that became Ready once; the median over the
pods; and a measurement that replaces the one in force only when it moved."""

from __future__ import annotations

from typing import Any

import pytest

from slogate_operator.pod_startup import SETTLED, median_startup_s, settled, startup_s


def pod(created: str = "2026-12-06T01:00:00Z", ready: str | None = "2026-12-06T01:00:31Z", *,
        status: str = "True", restarts: int = 0, deleting: bool = False) -> dict[str, Any]:  # fmt: skip
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": created}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": status, "lastTransitionTime": ready})
    meta: dict[str, Any] = {"name": "p", "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = ready
    containers = [{"name": "llama", "restartCount": 0}, {"name": "slogate", "restartCount": restarts}]
    return {"metadata": meta, "status": {"conditions": conditions, "containerStatuses": containers}}


def test_a_ready_pods_start_up_is_creation_to_ready() -> None:
    assert startup_s(pod()) == 31.0


@pytest.mark.parametrize(
    "unmeasured",
    [
        pod(ready=None),  # never Ready yet
        pod(status="False"),  # Ready flipped off: its transition time is not the start-up's
        pod(restarts=1),  # Ready again after a restart
        pod(deleting=True),
        pod(ready="2026-12-06T00:59:00Z"),  # a clock that went backwards is no measurement
        {"metadata": {"creationTimestamp": "2026-12-06T01:00:00Z"}, "status": {}},
    ],
)
def test_pods_that_did_not_start_once_and_stay_ready_are_not_measured(unmeasured: dict[str, Any]) -> None:
    assert startup_s(unmeasured) is None
    assert median_startup_s([unmeasured]) is None


def test_the_median_is_not_moved_by_one_slow_pod() -> None:
    pods = [pod(ready=f"2026-12-06T01:00:{s}Z") for s in ("30", "32", "34")]
    slow = pod(ready="2026-12-06T01:05:00Z")
    assert median_startup_s([*pods, slow, pod(ready=None)]) == 33.0
    assert median_startup_s([]) is None


def test_a_measurement_replaces_the_one_in_force_only_when_it_moved() -> None:
    assert settled(None, 31.0) == 31.0
    assert settled(30.0, None) == 30.0  # no pod measured in this pass: the one in force stays
    assert settled(None, None) is None
    assert settled(30.0, 30.0 * (1 + SETTLED)) == 30.0
    assert settled(30.0, 30.0 * (1 - SETTLED)) == 30.0
    assert settled(30.0, 37.0) == 37.0
    assert settled(30.0, 20.0) == 20.0
