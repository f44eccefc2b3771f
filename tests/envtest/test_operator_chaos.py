"""The real operator (kopf) against a real API server under chaos: a seeded random share of its API
calls (and kopf's) answered 500 or 409, an operator stopped right after it created a
Job and before it could record it, a calibration that fails after the restart.

What must hold whatever was hit: one Job per fingerprint and attempt (never a second
create for the same one), the sidecar injected once, the thresholds of the latest
completed calibration in the ConfigMap and the status, the old ones kept in force until
a new calibration succeeds. The RNG is seeded, so the share and the mix of statuses are
reproducible; which calls they hit depends on the order the calls arrive in, so every
assertion is about the converged state and the counts, never about a particular call.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from operator_flows import (
    ARGS_T1,
    apply_and_calibrate,
    current_job,
    policy,
    roll_out,
    slower,
    status_of,
    thresholds_in,
)

from api_cluster import DEPLOYMENTS, JOBS, POLICIES, Cluster
from canned_profiles import smollm2_profile
from kopf_thread import running_operator, settle
from kube_faults import Fault, RandomFaults
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_calibration.output import compact_json
from slogate_operator import names
from slogate_operator.spec import parse_spec
from workload_controllers import complete_job, containers_of_a_new_pod, fail_job, job_names

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread

SHARE = 0.2
"""A fifth of the calls fail: enough that most passes meet at least one fault."""


def job_creates(cluster: Cluster) -> list[str]:
    """Names of the Jobs the API server created successfully, in order (failed POSTs excluded)."""
    return [name for plural, name in cluster.created if plural == "jobs"]


def sidecars_of_a_new_pod(cluster: Cluster) -> list[str]:
    """The sidecars a pod of the target gets at admission (the template keeps the user's containers)."""
    return [c for c in containers_of_a_new_pod(cluster, "smollm2") if c == names.SIDECAR_CONTAINER]


def status_calibration_id(cluster: Cluster) -> str | None:
    return ((policy(cluster).get("status") or {}).get("thresholds") or {}).get("calibrationId")


def in_force(cluster: Cluster, calibration_id: str) -> Thresholds | None:
    """The ConfigMap's thresholds once they and the status both name ``calibration_id``."""
    found: Thresholds | None = thresholds_in(cluster)
    if found is None or found.calibration_id != calibration_id or status_calibration_id(cluster) != calibration_id:
        return None
    return found


def expected_thresholds(cluster: Cluster, profile: CalibrationProfile, derived: Thresholds) -> Thresholds:
    """What derivation gives for the policy and ``profile`` (at the time the operator derived)."""
    spec = parse_spec(policy(cluster)["spec"])
    return derive_thresholds(spec.policy, profile, derived_at=derived.derived_at)


def statuses_met(chaos: RandomFaults) -> Counter[int]:
    met: Counter[int] = Counter()
    for (_, _, status), count in chaos.met.items():
        met[status] += count
    return met


def test_a_whole_lifecycle_converges_under_random_api_faults(cluster: Cluster) -> None:
    chaos = RandomFaults(share=SHARE, seed=8)
    cluster.chaos = chaos
    # Random 409s can only hit writes, a minority of the calls: these two are sure to happen.
    conflicts = [Fault("POST", "jobs", 409), Fault("PATCH", "configmaps", 409)]
    cluster.faults += conflicts
    first_profile = smollm2_profile()
    second_profile = slower(first_profile, 2.0, "cal-after-rollout")
    with running_operator(cluster):
        cluster.create(DEPLOYMENTS, llama_deployment())
        cluster.create(POLICIES, admission_policy())
        first = current_job(cluster)
        complete_job(cluster, first, compact_json(first_profile))
        first_thresholds = eventually(lambda: in_force(cluster, first_profile.id), what="the first thresholds")
        eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready after the first calibration")
        assert first_thresholds == expected_thresholds(cluster, first_profile, first_thresholds)

        roll_out(cluster, ARGS_T1)
        second = eventually(lambda: (job := current_job(cluster)) != first and job, what="the rollout's Job")
        assert thresholds_in(cluster) == first_thresholds  # in force until the new calibration completes
        complete_job(cluster, second, compact_json(second_profile))
        second_thresholds = eventually(lambda: in_force(cluster, second_profile.id), what="the rollout's thresholds")
        eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready after the rollout")
        settle("smollm2", more=3)  # converged: further passes change nothing

        assert job_creates(cluster) == [first, second]  # one Job per fingerprint, in order
        fingerprints = [cluster.get(JOBS, j) for j in (first, second)]
        keys = [j["metadata"]["labels"][names.LABEL_FINGERPRINT] for j in fingerprints if j is not None]
        assert len(set(keys)) == 2
        assert sidecars_of_a_new_pod(cluster) == [names.SIDECAR_CONTAINER]
        deployment = cluster.get(DEPLOYMENTS, "smollm2")
        assert deployment is not None
        llama = deployment["spec"]["template"]["spec"]["containers"][0]
        assert llama["args"] == ARGS_T1  # the rollout's change is kept
        assert thresholds_in(cluster) == second_thresholds
        assert second_thresholds == expected_thresholds(cluster, second_profile, second_thresholds)
        assert second_thresholds != first_thresholds
        assert status_of(cluster, "Degraded") == "False"
    # The faults were really met, on the operator's own writes too.
    assert all(fault.times == 0 for fault in conflicts)
    met = statuses_met(chaos)
    assert chaos.failed >= 10, chaos.met
    assert any(method != "GET" for method, _, _ in chaos.met), chaos.met
    print(f"\nlifecycle: {chaos.failed} calls failed at random {dict(met)}; Job creates {job_creates(cluster)}")


def test_an_operator_killed_after_creating_a_job_restarts_without_a_duplicate_or_lost_thresholds(
    cluster: Cluster,
) -> None:
    chaos = RandomFaults(share=SHARE, seed=9)
    cluster.chaos = chaos
    with running_operator(cluster):
        first = apply_and_calibrate(cluster)
        old = eventually(lambda: in_force(cluster, smollm2_profile().id), what="the first thresholds")
        # The operator "dies" the moment the recalibration's Job is created: every call it
        # makes after that fails, so it cannot record the Job in the status.
        chaos.blackout_after_create = "jobs"
        roll_out(cluster, ARGS_T1)
        eventually(lambda: chaos.blackout, what="the recalibration's Job created")
    (second,) = [job for job in job_names(cluster) if job != first]
    # Killed before it could record the start (a random 409 on an earlier POST may have left
    # a record of the attempt, never its start).
    recorded = policy(cluster)["status"].get("calibrating") or {}
    assert "startedAt" not in recorded, recorded
    assert thresholds_in(cluster) == old
    assert status_calibration_id(cluster) == old.calibration_id

    chaos.blackout_after_create, chaos.blackout = None, False
    failed_before_restart = chaos.failed
    retry_conflict = Fault("POST", "jobs", 409)  # the retry's create is answered "exists" once
    cluster.faults.append(retry_conflict)
    with running_operator(cluster):
        assert current_job(cluster) == second  # found by its name, not created again
        settle("smollm2", more=3)
        assert job_creates(cluster) == [first, second]
        assert thresholds_in(cluster) == old  # the old thresholds stay until the new Job completes
        assert status_calibration_id(cluster) == old.calibration_id
        assert condition(policy(cluster), "Calibrated")["reason"] == "Calibrating"

        said = "slogate calibrate: error: llama-server answered 503 in stage 'prefill'"
        fail_job(cluster, second, said)
        degraded: dict[str, Any] = eventually(
            lambda: (c := condition(policy(cluster), "Degraded")).get("status") == "True" and c,
            what="Degraded after the failed calibration",
        )
        assert degraded["reason"] == "CalibrationFailed"
        assert said in degraded["message"]
        assert thresholds_in(cluster) == old
        assert status_calibration_id(cluster) == old.calibration_id
        assert status_of(cluster, "Ready") == "False"

        # After the backoff the failed Job makes way for exactly one new attempt.
        eventually(lambda: job_creates(cluster) == [first, second, second], what="the retry's Job")
        assert thresholds_in(cluster) == old
        newer = slower(smollm2_profile(), 2.0, "cal-after-restart")
        complete_job(cluster, second, compact_json(newer))
        new = eventually(lambda: in_force(cluster, newer.id), what="the retry's thresholds")
        eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready after the retry")
        settle("smollm2", more=3)
        assert status_of(cluster, "Degraded") == "False"
        assert thresholds_in(cluster) == new
        assert new == expected_thresholds(cluster, newer, new)
        assert job_creates(cluster) == [first, second, second]  # a create per attempt, none twice
        assert sidecars_of_a_new_pod(cluster) == [names.SIDECAR_CONTAINER]
    assert chaos.failed > failed_before_restart, chaos.met  # the restarted operator met faults too
    assert retry_conflict.times == 0
    met = statuses_met(chaos)
    print(
        f"\nrestart: {chaos.failed} calls failed at random or blacked out {dict(met)}; Job creates {job_creates(cluster)}"
    )
