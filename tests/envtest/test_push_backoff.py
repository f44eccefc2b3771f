"""Sidecars that cannot be pushed to cost a policy passes that thin out, not a pass a second.

The e2e suite's 200-pod rollout on kwok nodes found it: every failed push woke the policy,
whose pass started the pushes again at once, so 200 unreachable sidecars kept the operator
in a pass every second and a half, each listing the 200 pods, and logging ten warnings a
second. A push now wakes the policy only when it changed what the status says, and a sidecar
that failed waits a backoff that doubles (from the attempts' own) up to the resync period.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from datetime import UTC, datetime

import aiohttp
import pytest
from operator_flows import apply_and_calibrate, policy

from api_cluster import Cluster
from canned_profiles import smollm2_profile
from kopf_thread import passes, running_operator
from polling import eventually
from ports import free_ports
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds
from slogate_operator.push import RETRY_SLACK_S, PushSettings, PushTracker, SidecarEndpoint
from workload_controllers import run_pods

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread

SETTINGS = PushSettings(attempts=2, backoff_s=0.05, timeout_s=1.0, retry_max_s=30.0)
ONE_ATTEMPT = PushSettings(attempts=1, backoff_s=4.0, timeout_s=1.0, retry_max_s=30.0)
"""A first backoff (4 s) longer than RETRY_SLACK_S, and no sleep between attempts."""


class Clock:
    """The tracker's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def closed_port() -> str:
    """A loopback address where nothing listens: every connection is refused at once."""
    (port,) = free_ports()
    return f"http://127.0.0.1:{port}"


def test_the_backoff_doubles_from_the_attempts_up_to_the_resync() -> None:
    waits = [SETTINGS.retry_after(n) for n in range(1, 12)]
    assert waits[0] == 0.1  # the attempts' next step: they waited 0.05 s
    assert all(b == min(2 * a, SETTINGS.retry_max_s) for a, b in itertools.pairwise(waits))
    assert waits[-1] == SETTINGS.retry_max_s


def test_a_repeated_failure_wakes_no_pass_and_waits_out_its_backoff(closed_port: str, calibrated: Thresholds) -> None:
    clock, woken = Clock(), []
    tracker = PushTracker(clock=clock)
    found = [SidecarEndpoint("pod-a", closed_port, "uid-a/0")]

    async def round_(pods: list[SidecarEndpoint] = found) -> int:
        async with aiohttp.ClientSession() as session:
            started = tracker.start(session, pods, calibrated, "token", ONE_ATTEMPT, done=lambda: woken.append(1))
            await asyncio.gather(*tracker.inflight.values())
            return started

    assert asyncio.run(round_()) == 1
    assert woken == [1]  # the first failure is news: the status must say it
    assert tracker.problems["uid-a/0"].startswith("unreachable")
    assert tracker.next_retry() == clock.now + ONE_ATTEMPT.retry_after(1)
    assert asyncio.run(round_()) == 0  # within the backoff: not tried
    clock.now = tracker.next_retry() - RETRY_SLACK_S  # its backoff about to end: tried with the others
    assert asyncio.run(round_()) == 1
    assert woken == [1]  # the same failure again: no pass for it
    assert tracker.failures["uid-a/0"][0] == 2
    assert tracker.next_retry() == clock.now + ONE_ATTEMPT.retry_after(2)
    assert asyncio.run(round_([])) == 0
    assert tracker.failures == {}  # the pod left: forgotten
    assert tracker.next_retry() is None


@pytest.fixture
def calibrated() -> Thresholds:
    policy = Policy.model_validate({"slo": {"ttftSeconds": 2.0}})
    return derive_thresholds(policy, smollm2_profile(), derived_at=datetime(2026, 12, 5, tzinfo=UTC))


def test_unreachable_sidecars_cost_passes_that_thin_out(cluster: Cluster) -> None:
    """Three running pods whose sidecars refuse every connection, and nothing else changes
    (resync an hour): over a window W the passes follow the doubling backoff, about log2 of
    W over the first wait, where each failed round used to wake the next pass at once."""
    (port,) = free_ports()  # nothing listens there
    with running_operator(cluster, RESYNC_SECONDS="3600"):
        apply_and_calibrate(cluster, sidecar={"adminPort": port})
        run_pods(cluster, "smollm2", [f"127.0.3.{i}" for i in (1, 2, 3)])
        eventually(
            lambda: (
                len(((policy(cluster).get("status") or {}).get("sidecars") or {}).get("behind") or []) == 3
                and all(b["reason"].startswith("unreachable") for b in policy(cluster)["status"]["sidecars"]["behind"])
            ),
            what="three sidecars reported unreachable",
        )
        first = PushSettings(attempts=2, backoff_s=0.05).retry_after(1)  # the tests' operator settings
        before, started = passes("smollm2"), time.monotonic()
        time.sleep(4.0)  # a window to count passes in, not a wait for anything
        window, made = time.monotonic() - started, passes("smollm2") - before
    # A noisy machine makes fewer passes, never more: the bound holds however slow the run.
    assert made <= math.log2(window / first) + 4, f"{made} passes in {window:.1f} s"
    assert made >= 1  # the sidecars are still retried
