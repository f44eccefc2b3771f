"""The real operator (kopf) against kmock: every path of the reconcile loop, with the tests
playing the Job and Deployment controllers. Profiles here are the builder's SmolLM2
shape; tests/integration/test_operator_sidecars.py runs the same flow on a profile
measured by the real `slogate calibrate`, with real sidecars receiving the pushes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from kopf.testing import KopfRunner

from builders import smollm2_profile
from operator_harness import (
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    JOBS,
    POLICIES,
    SCHEMA,
    SECRETS,
    Cluster,
    Fault,
    admission_policy,
    condition,
    eventually,
    job_names,
    llama_deployment,
    running_operator,
    settle,
)
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_calibration.output import compact_json
from slogate_operator import names, rbac
from slogate_operator.spec import parse_spec

ARGS_T1 = ["-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port", "8080",
           "-t", "1", "-np", "4", "-c", "8192", "--metrics"]  # fmt: skip


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    yield made
    made.close()


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    with running_operator(cluster) as runner:
        yield runner


def policy(cluster: Cluster, name: str = "smollm2") -> dict[str, Any]:
    found = cluster.get(POLICIES, name)
    assert found is not None
    return found


def status_of(cluster: Cluster, kind: str, name: str = "smollm2") -> str:
    return str(condition(cluster.get(POLICIES, name), kind).get("status"))


def thresholds_in(cluster: Cluster, name: str = "smollm2") -> Thresholds | None:
    cm = cluster.get(CONFIGMAPS, f"{name}-thresholds")
    text = ((cm or {}).get("data") or {}).get(names.THRESHOLDS_KEY)
    return Thresholds.model_validate_json(text) if text else None


def slower(profile: CalibrationProfile, factor: float, new_id: str) -> CalibrationProfile:
    """The same server at ``factor`` times the cost per token (e.g. one thread instead of two)."""
    prefill = profile.prefill.model_copy(
        update={"linear_s": profile.prefill.linear_s * factor, "quadratic_s": profile.prefill.quadratic_s * factor}
    )
    decode = tuple(p.model_copy(update={"tokens_per_second": p.tokens_per_second / factor}) for p in profile.decode)
    return profile.model_copy(update={"id": new_id, "fingerprint": "1" * 16, "prefill": prefill, "decode": decode})


def apply_and_calibrate(cluster: Cluster, profile: CalibrationProfile | None = None, **spec: Any) -> str:
    """Deployment + policy, then the first calibration completes with ``profile``."""
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy(**spec))
    (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
    cluster.complete_job(job, compact_json(profile or smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready")
    return job


def current_job(cluster: Cluster, name: str = "smollm2") -> str:
    """The Job of the calibration under way, once the status names it and it exists."""

    def found() -> str | None:
        job = ((policy(cluster, name).get("status") or {}).get("calibrating") or {}).get("job")
        return job if job in job_names(cluster) else None

    return eventually(found, what="the Job of the calibration under way")


def roll_out(cluster: Cluster, args: list[str], name: str = "smollm2") -> None:
    """A rollout that changes the llama.cpp container's arguments."""
    containers = cluster.get(DEPLOYMENTS, name)["spec"]["template"]["spec"]["containers"]
    containers[0]["args"] = args
    cluster.patch(DEPLOYMENTS, name, {"spec": {"template": {"spec": {"containers": containers}}}})


def events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.list(EVENTS) if e.get("reason") == reason]


def assert_status_fits_the_crd(found: dict[str, Any]) -> None:
    errors = list(jsonschema.Draft4Validator(SCHEMA["properties"]["status"]).iter_errors(found["status"]))
    assert errors == [], [e.message for e in errors]


# ------------------------------------------------------------------------------ the main path


def test_apply_injects_the_sidecar_and_starts_one_calibration(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
    containers = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["llama", names.SIDECAR_CONTAINER]
    assert cluster.get(CONFIGMAPS, "smollm2-thresholds") is not None  # mountable before the first thresholds
    assert cluster.get(SECRETS, "slogate-admin-token")["metadata"]["ownerReferences"][0]["name"] == "smollm2"
    found = eventually(
        lambda: (p := policy(cluster)) and condition(p, "Calibrated").get("reason") == "Calibrating" and p
    )
    assert found["status"]["calibrating"]["job"] == job
    assert status_of(cluster, "Ready") == "False"
    assert_status_fits_the_crd(found)
    assert {e["reason"] for e in cluster.list(EVENTS)} >= {"SidecarInjected", "CalibrationStarted"}
    assert len(cluster.calls("POST", "jobs")) == 1


def test_a_completed_calibration_puts_derived_thresholds_in_configmap_and_status(
    cluster: Cluster, operator: KopfRunner
) -> None:
    job = apply_and_calibrate(cluster)
    found = policy(cluster)
    expected = derive_thresholds(parse_spec(found["spec"]).policy, smollm2_profile(), derived_at=datetime.now(UTC))
    stored = thresholds_in(cluster)
    assert stored is not None
    assert stored.model_copy(update={"derived_at": expected.derived_at}) == expected
    assert found["status"]["thresholds"]["calibrationId"] == "cal-test"
    assert found["status"]["thresholds"]["tokenBudget"] == int(expected.classes[0].token_budget)
    assert found["status"]["calibration"]["job"] == job
    assert found["status"]["pushed"] == "0/0"  # no pod runs yet: the ConfigMap is what they will boot with
    assert "calibrating" not in found["status"]
    assert_status_fits_the_crd(found)
    cm = cluster.get(CONFIGMAPS, "smollm2-thresholds")
    assert CalibrationProfile.model_validate_json(cm["data"][names.PROFILE_KEY]) == smollm2_profile()
    assert {e["reason"] for e in cluster.list(EVENTS)} >= {"CalibrationSucceeded", "ThresholdsDerived"}


def test_a_new_quantization_or_thread_count_recalibrates_a_label_does_not(
    cluster: Cluster, operator: KopfRunner
) -> None:
    first = apply_and_calibrate(cluster)
    old = thresholds_in(cluster)
    # Only a label and the replica count: the fingerprint stays, nothing is calibrated.
    cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"labels": {"team": "ml"}}, "spec": {"replicas": 3}})
    cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"template": {"metadata": {"labels": {"rev": "2"}}}}})
    settle("smollm2")
    assert job_names(cluster) == [first]
    assert len(cluster.calls("POST", "jobs")) == 1
    assert thresholds_in(cluster) == old
    assert status_of(cluster, "Ready") == "True"
    # One thread instead of two: a new fingerprint, a new Job; the old thresholds stay in force meanwhile.
    deployment = cluster.get(DEPLOYMENTS, "smollm2")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    containers[0]["args"] = ARGS_T1
    cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"template": {"spec": {"containers": containers}}}})
    second = eventually(lambda: [j for j in job_names(cluster) if j != first], what="a second Job")[0]
    eventually(lambda: condition(cluster.get(POLICIES, "smollm2"), "Calibrated").get("reason") == "Calibrating")
    assert thresholds_in(cluster) == old
    assert policy(cluster)["status"]["thresholds"]["calibrationId"] == "cal-test"
    cluster.complete_job(second, compact_json(slower(smollm2_profile(), 2.0, "cal-one-thread")))
    new = eventually(lambda: (t := thresholds_in(cluster)) and t.calibration_id == "cal-one-thread" and t)
    # Half the prefill speed: about half the queued tokens fit in the same TTFT budget.
    assert new.classes[0].token_budget < 0.6 * old.classes[0].token_budget
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert policy(cluster)["status"]["calibration"]["id"] == "cal-one-thread"
    assert len(cluster.calls("POST", "jobs")) == 2


def test_without_on_rollout_only_the_annotation_recalibrates(cluster: Cluster, operator: KopfRunner) -> None:
    first = apply_and_calibrate(cluster, calibration={"onRollout": False})
    roll_out(cluster, ARGS_T1)
    stale = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Calibrated")).get("reason") == "Stale" and c
    )
    assert "onRollout is false" in stale["message"]
    settle("smollm2")
    assert job_names(cluster) == [first]
    assert thresholds_in(cluster).calibration_id == "cal-test"  # still in force, and said to be stale
    cluster.patch(POLICIES, "smollm2", {"metadata": {"annotations": {names.ANNOTATION_RECALIBRATE: "now"}}})
    second = current_job(cluster)
    assert second != first
    cluster.complete_job(second, compact_json(slower(smollm2_profile(), 2.0, "cal-asked-for")))
    eventually(lambda: status_of(cluster, "Calibrated") == "True")
    assert thresholds_in(cluster).calibration_id == "cal-asked-for"


def test_an_slo_the_server_cannot_meet_is_degraded(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    # 10 ms is below the measured fixed prefill cost (20 ms): no request could ever be admitted.
    cluster.create(POLICIES, admission_policy(slo={"ttftSeconds": 0.01}))
    (job,) = eventually(lambda: job_names(cluster))
    cluster.complete_job(job, compact_json(smollm2_profile()))
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "SLOUnattainable"
    assert "fixed prefill cost" in degraded["message"]
    assert thresholds_in(cluster) is None
    assert status_of(cluster, "Calibrated") == "True"  # the measurement is fine; the SLO is not
    # A reachable SLO derives from the stored profile, without measuring again.
    cluster.patch(POLICIES, "smollm2", {"spec": {"slo": {"ttftSeconds": 2.0}}})
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert len(cluster.calls("POST", "jobs")) == 1


def test_a_policy_created_again_adopts_its_configmap(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    old_uid = policy(cluster)["metadata"]["uid"]
    cluster.delete(POLICIES, "smollm2")
    eventually(lambda: cluster.get(POLICIES, "smollm2") is None)
    cluster.create(POLICIES, admission_policy())  # kmock collects no garbage: the ConfigMap is still there
    new_uid = eventually(lambda: policy(cluster)["metadata"]["uid"])
    assert new_uid != old_uid
    owners = eventually(
        lambda: (
            (o := cluster.get(CONFIGMAPS, "smollm2-thresholds")["metadata"]["ownerReferences"])[0]["uid"] == new_uid
            and o
        )
    )
    assert len(owners) == 1
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert len(cluster.calls("POST", "jobs")) == 1  # same container, same profile: not measured again


def test_a_policy_change_rederives_without_measuring_again(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    before = thresholds_in(cluster)
    cluster.patch(POLICIES, "smollm2", {"spec": {"slo": {"ttftSeconds": 4.0}}})
    after = eventually(lambda: (t := thresholds_in(cluster)) and t != before and t)
    assert after.classes[0].ttft_budget_seconds == 4.0
    assert after.calibration_id == before.calibration_id
    assert len(cluster.calls("POST", "jobs")) == 1
    eventually(lambda: policy(cluster)["status"]["observedGeneration"] == 2)


# ------------------------------------------------------------------------------ failures are visible


def test_a_failed_calibration_keeps_the_last_thresholds_warns_and_retries(
    cluster: Cluster, operator: KopfRunner
) -> None:
    apply_and_calibrate(cluster)
    old = thresholds_in(cluster)
    roll_out(cluster, ARGS_T1)
    job = current_job(cluster)
    said = "slogate calibrate: error: calibration exceeded its 90 s budget in stage 'decode'"
    cluster.fail_job(job, said)
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
    eventually(lambda: len(cluster.calls("POST", "jobs")) == 3, what="the retry's Job")
    retried = cluster.get(JOBS, job)
    assert retried is not None
    assert not (retried.get("status") or {}).get("conditions")
    assert policy(cluster)["status"]["calibrating"]["attempts"] == 1
    cluster.complete_job(job, compact_json(slower(smollm2_profile(), 2.0, "cal-retried")))
    eventually(lambda: status_of(cluster, "Ready") == "True")
    assert status_of(cluster, "Degraded") == "False"
    assert thresholds_in(cluster).calibration_id == "cal-retried"


def test_a_calibration_past_its_deadline_is_timed_out(cluster: Cluster, operator: KopfRunner) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster))
    cluster.fail_job(job, "", reason="DeadlineExceeded")  # Kubernetes enforced activeDeadlineSeconds
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "CalibrationTimedOut"
    assert eventually(lambda: events(cluster, "CalibrationTimedOut"))[0]["type"] == "Warning"


def test_a_job_that_never_finishes_is_stopped_by_the_operators_own_clock(
    cluster: Cluster, operator: KopfRunner
) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy(calibration={"timeoutSeconds": 30, "budgetSeconds": 20}))
    (job,) = eventually(lambda: job_names(cluster))
    # As if it had been created an hour ago and Kubernetes never failed it (no Job controller).
    cluster.patch(JOBS, job, {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}})
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
    cluster.complete_job(job, json.dumps({"id": "truncated"}))
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
        cluster.complete_job(job, compact_json(smollm2_profile()))
        eventually(lambda: status_of(cluster, "Ready") == "True")


def test_pushes_that_fail_are_visible(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster, sidecar={"adminPort": 9})  # nothing listens on port 9
    cluster.run_pods("smollm2", ["127.0.0.1"])
    pushed = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "smollm2"), "ThresholdsPushed")).get("status") == "False" and c
    )
    assert pushed["reason"] == "PushPending"
    found = policy(cluster)
    assert found["status"]["pushed"] == "0/1"
    assert found["status"]["sidecars"]["behind"][0]["reason"].startswith("unreachable")
    assert status_of(cluster, "Ready") == "False"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"classes": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"concurrency": {"max": 2}, "classes": [{"name": "a", "reservedSlots": 2}, {"name": "b"}]}, "no slot"),
        ({"slo": {"ttftSeconds": -1}}, "greater than 0"),
    ],
    ids=["repeated class name", "reserved slots leave none", "negative SLO"],
)
def test_a_spec_the_schema_let_through_is_invalid(
    cluster: Cluster, operator: KopfRunner, change: dict[str, Any], words: str
) -> None:
    cluster.create(DEPLOYMENTS, llama_deployment())
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
    assert len(cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["containers"]) == 1
    # Fixed, it proceeds.
    cluster.patch(POLICIES, "smollm2", {"spec": admission_policy()["spec"] | {"classes": None, "concurrency": None}})
    eventually(lambda: job_names(cluster), what="a Job once the spec is valid")
    assert status_of(cluster, "Invalid") == "False"


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
    cluster.emulator.faults += [Fault("PATCH", "deployments", 409), Fault("POST", "jobs", 500, times=5)]
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    (job,) = eventually(lambda: job_names(cluster), what="a Job despite the errors")
    eventually(lambda: len(cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["containers"]) == 2)
    assert all(f.times == 0 for f in cluster.emulator.faults)  # every fault was met
    cluster.complete_job(job, compact_json(smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready") == "True")


# ------------------------------------------------------------------------------ selection and removal


def test_deleting_the_policy_takes_the_sidecar_out(cluster: Cluster, operator: KopfRunner) -> None:
    original = llama_deployment()["spec"]["template"]
    apply_and_calibrate(cluster)
    cluster.delete(POLICIES, "smollm2")
    eventually(lambda: cluster.get(POLICIES, "smollm2") is None, what="the finalizer released")
    template = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]
    assert template == original


def test_a_selector_gates_every_matching_deployment_and_lets_go_of_others(
    cluster: Cluster, operator: KopfRunner
) -> None:
    for name in ("zone-a", "zone-b"):
        deployment = llama_deployment(name, labels={"model": "smollm2"})
        deployment["spec"]["template"]["spec"] = llama_deployment()["spec"]["template"]["spec"]
        cluster.create(DEPLOYMENTS, deployment)
    cluster.create(POLICIES, {**admission_policy("zones"), "spec": {"selector": {"matchLabels": {"model": "smollm2"}},
                                                                     "slo": {"ttftSeconds": 2}}})  # fmt: skip
    (job,) = eventually(lambda: job_names(cluster))  # same container: one calibration for both
    for name in ("zone-a", "zone-b"):
        eventually(lambda n=name: len(cluster.get(DEPLOYMENTS, n)["spec"]["template"]["spec"]["containers"]) == 2)
    cluster.complete_job(job, compact_json(smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready", "zones") == "True")
    assert policy(cluster, "zones")["status"]["targets"] == ["zone-a", "zone-b"]
    cluster.patch(DEPLOYMENTS, "zone-b", {"metadata": {"labels": {"model": "other"}}})
    eventually(lambda: len(cluster.get(DEPLOYMENTS, "zone-b")["spec"]["template"]["spec"]["containers"]) == 1)
    assert len(cluster.get(DEPLOYMENTS, "zone-a")["spec"]["template"]["spec"]["containers"]) == 2
    # A selected Deployment with another container: one policy cannot calibrate two models.
    other = llama_deployment("zone-c", labels={"model": "smollm2"}, args=ARGS_T1)
    cluster.create(DEPLOYMENTS, other)
    degraded = eventually(
        lambda: (c := condition(cluster.get(POLICIES, "zones"), "Degraded")).get("status") == "True" and c
    )
    assert degraded["reason"] == "TargetsDiffer"


def test_every_api_call_is_in_the_documented_rbac(cluster: Cluster, operator: KopfRunner) -> None:
    apply_and_calibrate(cluster)
    roll_out(cluster, ARGS_T1)
    cluster.fail_job(current_job(cluster), "boom")
    eventually(lambda: len(cluster.calls("POST", "jobs")) == 3, what="retry after a delete")
    cluster.delete(POLICIES, "smollm2")
    eventually(lambda: cluster.get(POLICIES, "smollm2") is None)
    used = cluster.verbs(exclude_agent="Python-urllib")
    assert ("batch", "jobs", "delete") in used
    assert ("", "secrets", "create") in used
    missing = sorted(v for v in used if not rbac.allows(*v))
    assert missing == []
