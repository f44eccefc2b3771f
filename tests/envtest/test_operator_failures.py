"""The real operator (kopf) against a real API server: failures are visible, never silent, and the
last good thresholds stay in force."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from counting_sidecars import CountingSidecars
from kopf.testing import KopfRunner
from operator_flows import (
    ARGS_T1,
    apply_and_calibrate,
    current_job,
    events,
    policy,
    roll_out,
    slower,
    status_of,
    thresholds_in,
)

from api_cluster import DEPLOYMENTS, JOBS, PODS, POLICIES, ApiError, Cluster
from canned_profiles import smollm2_profile
from kopf_thread import running_operator, settle
from kube_faults import Fault
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from slogate_calibration.output import compact_json
from slogate_operator import handlers
from slogate_operator.context import Runtime, utc_now
from workload_controllers import complete_job, fail_job, gate_of, job_names, run_pods, write_deployment_status

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread

# ------------------------------------------------------------------------------ failures are visible


def test_a_failed_calibration_keeps_the_last_thresholds_warns_and_retries(
    cluster: Cluster, operator: KopfRunner
) -> None:
    apply_and_calibrate(cluster)
    old = thresholds_in(cluster)
    roll_out(cluster, ARGS_T1)
    job = current_job(cluster)
    said = "slogate calibrate: error: calibration exceeded its 90 s budget in stage 'decode'"
    fail_job(cluster, job, said)
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "CalibrationFailed"
    assert said in degraded["message"]
    assert thresholds_in(cluster) == old  # the last good thresholds stay in force
    assert policy(cluster)["status"]["thresholds"]["calibrationId"] == old.calibration_id
    assert status_of(cluster, "Ready") == "False"
    warning = eventually(lambda: events(cluster, "CalibrationFailed"))
    assert warning[0]["type"] == "Warning"
    assert said in warning[0]["message"]
    # After the backoff (1 s in tests) the failed Job makes way for a second attempt.
    # Counted once stored (cluster.created): the proxy notes a POST when it arrives, before the server has it.
    eventually(lambda: [p for p, _ in cluster.created].count("jobs") == 3, what="the retry's Job, stored")
    retried = cluster.get(JOBS, job)
    assert retried is not None
    assert not (retried.get("status") or {}).get("conditions")
    assert policy(cluster)["status"]["calibrating"]["attempts"] == 1
    complete_job(cluster, job, compact_json(slower(smollm2_profile(), 2.0, "cal-retried")))
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert status_of(cluster, "Degraded") == "False"
    assert thresholds_in(cluster).calibration_id == "cal-retried"


def test_a_calibration_past_its_deadline_is_timed_out(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster))
    fail_job(cluster, job, "", reason="DeadlineExceeded")  # Kubernetes enforced activeDeadlineSeconds
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "CalibrationTimedOut"
    assert eventually(lambda: events(cluster, "CalibrationTimedOut"))[0]["type"] == "Warning"


@dataclass(eq=False)
class SkewedRuntime(Runtime):
    """The operator's runtime with its clock (injected for this) SKEW ahead of the wall clock."""

    clock: Callable[[], datetime] = field(default=lambda: utc_now() + SKEW[0])


SKEW = [timedelta(0)]


def test_a_job_that_never_finishes_is_stopped_by_the_operators_own_clock(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers, "Runtime", SkewedRuntime)
    cluster.create(DEPLOYMENTS, llama_deployment())
    with running_operator(cluster):
        cluster.create(POLICIES, admission_policy(calibration={"timeoutSeconds": 30, "budgetSeconds": 20}))
        eventually(lambda: job_names(cluster))
        # An hour later, by the operator's clock, and Kubernetes never failed it (no Job controller).
        SKEW[0] = timedelta(hours=1)
        degraded = eventually(
            lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
        )
        assert degraded["reason"] == "CalibrationTimedOut"
        assert "has not finished" in degraded["message"]
        assert len(cluster.calls("DELETE", "jobs")) >= 1  # stopped, not left to burn CPU


def test_a_result_that_is_no_profile_is_a_failure_too(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster))
    complete_job(cluster, job, json.dumps({"id": "truncated"}))
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "CalibrationResultInvalid"
    assert thresholds_in(cluster) is None
    assert condition(policy(cluster), "ThresholdsPushed")["reason"] == "NoThresholds"


def test_a_missing_target_is_reported_and_picked_up_when_it_appears(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(POLICIES, admission_policy())
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "TargetNotFound"
    assert "smollm2" in degraded["message"]
    assert status_of(cluster, "Ready") == "False"
    assert eventually(lambda: events(cluster, "TargetNotFound"))[0]["type"] == "Warning"
    settle("smollm2")
    assert job_names(cluster) == []
    cluster.create(DEPLOYMENTS, llama_deployment())
    eventually(lambda: job_names(cluster), what="a Job once the Deployment exists")
    eventually(lambda: status_of(cluster, "Degraded") == "False")


def test_a_restarted_operator_finds_the_running_calibration(cluster: Cluster) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    with running_operator(cluster):
        (job,) = eventually(lambda: job_names(cluster))
    with running_operator(cluster):
        settle("smollm2", more=3)
        assert job_names(cluster) == [job]
        assert len(cluster.calls("POST", "jobs")) == 1  # never a duplicate
        complete_job(cluster, job, compact_json(smollm2_profile()))
        eventually(lambda: status_of(cluster, "Ready") == "True")


def test_pushes_that_fail_are_visible(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster, sidecar={"adminPort": 9})  # nothing listens on port 9
    run_pods(cluster, "smollm2", ["127.0.0.1"])
    # Pushes run beside the pass: first "under way", then the reason the attempts met.
    found = eventually(
        lambda: (
            (p := policy(cluster))["status"].get("sidecars", {}).get("behind")
            and p["status"]["sidecars"]["behind"][0]["reason"].startswith("unreachable")
            and p
        ),
        what="the push's failure in the status",
    )
    assert condition(found, "ThresholdsPushed")["reason"] == "PushPending"
    assert found["status"]["pushed"] == "0/1"
    assert status_of(cluster, "Ready") == "False"


INVALID_SPECS = [
    ({"classes": [{"name": "a"}, {"name": "a"}]}, "Duplicate value", "unique"),
    ({"concurrency": {"max": 2}, "classes": [{"name": "a", "reservedSlots": 2}, {"name": "b"}]},
     "leaving the lowest class none", "no slot"),
    ({"slo": {"ttftSeconds": -1}}, "should be greater than 0", "greater than 0"),
]  # fmt: skip
"""(change, the API server's refusal, the operator's own words): each refused by the CRD's
schema or CEL rules today, and found by the operator's own check in a policy stored before."""
IDS = ["repeated class name", "reserved slots leave none", "negative SLO"]


@pytest.mark.parametrize(("change", "refusal", "words"), INVALID_SPECS, ids=IDS)
def test_the_api_server_refuses_an_invalid_spec(cluster: Cluster, change: dict[str, Any], refusal: str,
                                                words: str) -> None:  # fmt: skip
    with pytest.raises(ApiError) as refused:
        cluster.create(POLICIES, admission_policy(**change))
    assert refused.value.status == 422
    assert refusal in refused.value.body


@pytest.mark.parametrize(("change", "refusal", "words"), INVALID_SPECS, ids=IDS)
def test_an_invalid_spec_stored_under_an_older_crd_is_invalid(
    cluster: Cluster, operator: KopfRunner, change: dict[str, Any], refusal: str, words: str
) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    with cluster.policy_crd_without_rules():  # as a CRD before these rules were added would
        cluster.create(POLICIES, admission_policy(**change))
    invalid = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Invalid")).get("status") == "True" and c
    )
    assert invalid["reason"] == "InvalidSpec"
    assert words in invalid["message"]
    assert status_of(cluster, "Ready") == "False"
    assert eventually(lambda: events(cluster, "InvalidSpec"))[0]["type"] == "Warning"
    settle("smollm2")
    assert job_names(cluster) == []
    assert gate_of(cluster, "smollm2") is None
    # Fixed, it proceeds.
    cluster.patch(POLICIES, "smollm2", {"spec": admission_policy()["spec"] | {"classes": None, "concurrency": None}})
    eventually(lambda: job_names(cluster), what="a Job once the spec is valid")
    # The pass that creates the Job writes the status after it: the condition follows.
    eventually(lambda: status_of(cluster, "Invalid") == "False", what="Invalid cleared once the spec is valid")


def test_a_container_that_does_not_exist_is_invalid(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy(container="server"))
    invalid = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Invalid")).get("status") == "True" and c
    )
    assert invalid["reason"] == "TargetUnusable"
    assert "server" in invalid["message"]
    settle("smollm2")
    assert job_names(cluster) == []


def test_api_conflicts_and_errors_are_retried(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.faults += [Fault("PATCH", "deployments", 409), Fault("POST", "jobs", 500, times=5)]
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster), what="a Job despite the errors")
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: gate_of(cluster, "smollm2") is not None)
    assert all(f.times == 0 for f in cluster.faults)  # every fault was met
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert cluster.forbidden == []  # the re-read after the 409 is within the operator's RBAC


def test_pods_that_serve_without_the_gate_keep_the_policy_not_ready(cluster: Cluster, operator: KopfRunner) -> None:
    """The second review's case: a rollout stuck (FailedCreate, CrashLoopBackOff) keeps old,
    ungated pods serving while the gated ones acknowledged everything; Ready said True."""
    fleet = CountingSidecars(cluster, 1)
    try:
        apply_and_calibrate(cluster, sidecar={"adminPort": fleet.port})
        run_pods(cluster, "smollm2", fleet.ips)
        write_deployment_status(cluster, "smollm2", replicas=1)
        eventually(lambda: policy(cluster)["status"].get("pushed") == "1/1", what="the gated pod acknowledged")
        eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready with every pod gated")
        # The controller counts a second pod the gate is not in (an old ReplicaSet's).
        write_deployment_status(cluster, "smollm2", replicas=2)
        found = eventually(
            lambda: (c := condition(policy(cluster), "ThresholdsPushed")).get("reason") == "UngatedPods" and c
        )
        assert found["message"] == "Deployment smollm2: 1 of its 2 pods run without the gate"
        assert status_of(cluster, "Ready") == "False"
        write_deployment_status(cluster, "smollm2", replicas=1)
        eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready once the old pod is gone")
        # No pod at all while one is wanted (a Recreate rollout whose new pod is never created).
        for pod in cluster.list(PODS):
            cluster.request("DELETE", f"{PODS.format(ns='llm')}/{pod['metadata']['name']}?gracePeriodSeconds=0")
        write_deployment_status(cluster, "smollm2", replicas=0, ready_replicas=0)
        none_runs = "Deployment smollm2: no gated pod runs (1 wanted)"
        eventually(lambda: condition(policy(cluster), "ThresholdsPushed").get("message") == none_runs, what=none_runs)
        assert condition(policy(cluster), "ThresholdsPushed")["reason"] == "UngatedPods"
        assert status_of(cluster, "Ready") == "False"
    finally:
        fleet.close()


def test_calibrations_run_at_most_max_calibrations_at_once(cluster: Cluster) -> None:
    """The second review's case: an upgrade that changed every fingerprint started every
    policy's Job within seconds. Three policies at once, at most two Jobs: the third waits,
    says so, and starts when one ends."""
    for name in ("one", "two", "three"):
        cluster.create(DEPLOYMENTS, llama_deployment(name))
    with running_operator(cluster, MAX_CALIBRATIONS="2", RESYNC_SECONDS="0.5"):
        for name in ("one", "two", "three"):
            cluster.create(POLICIES, admission_policy(name))
        started = eventually(lambda: found if len(found := job_names(cluster)) == 2 else None, what="two Jobs")
        (queued,) = {"one", "two", "three"} - {j.split("-cal-")[0] for j in started}
        waits = eventually(
            lambda: (c := condition(policy(cluster, queued), "Calibrated")).get("reason") == "Queued" and c
        )
        assert "2 calibrations run already, at most 2 at once" in waits["message"]
        settle(queued, more=3)
        assert len(job_names(cluster)) == 2  # still two: it waited
        complete_job(cluster, started[0], compact_json(smollm2_profile()))
        eventually(lambda: any(j.startswith(f"{queued}-cal-") for j in job_names(cluster)), what="the third Job")
        # The proxy notes a create once its answer is read, a moment after the Job is listed.
        created = lambda: [name for plural, name in cluster.created if plural == "jobs"]  # noqa: E731
        eventually(lambda: len(created()) == 3, what="three creates answered")
        settle(queued)
        assert len(created()) == 3
