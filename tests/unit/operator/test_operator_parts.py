"""Pure parts: reading a calibration Job, backoff, conditions, summaries against the CRD's
status schema, settings from the environment, push eligibility."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import pytest

from canned_profiles import smollm2_profile
from manifests import admission_policy, llama_deployment
from project_files import SCHEMA
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_calibration.output import compact_json
from slogate_operator import names, targets
from slogate_operator.calibration import FailureReason, Finished, JobState, finished, job_outcome, retry_delay
from slogate_operator.fingerprint import llama_container
from slogate_operator.push import endpoints
from slogate_operator.settings import OperatorSettings, SettingsError
from slogate_operator.spec import parse_spec
from slogate_operator.status import (
    Condition,
    ConditionType,
    calibration_summary,
    condition_dicts,
    newly_true,
    ready_condition,
    thresholds_summary,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DEADLINE = timedelta(seconds=360)
C = ConditionType


def job(*conditions: dict[str, str], created: datetime = NOW) -> dict[str, Any]:
    return {
        "metadata": {"name": "p-cal-1", "uid": "job-uid", "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "status": {"conditions": list(conditions)},
    }


def pod(exit_code: int, message: str, *, owner: str = "job-uid") -> dict[str, Any]:
    return {
        "metadata": {"name": "p-cal-1-x", "ownerReferences": [{"uid": owner}]},
        "status": {"containerStatuses": [
            {"name": "llama", "state": {"running": {}}},
            {"name": names.CALIBRATOR_CONTAINER, "state": {"terminated": {"exitCode": exit_code, "message": message}}},
        ]},
    }  # fmt: skip


COMPLETE = {"type": "Complete", "status": "True"}


def test_a_complete_job_yields_its_validated_profile() -> None:
    outcome = job_outcome(job(COMPLETE), [pod(0, compact_json(smollm2_profile()))], now=NOW, deadline=DEADLINE)
    assert outcome.state is JobState.SUCCEEDED
    assert outcome.profile == smollm2_profile()


def test_a_result_that_is_not_a_profile_is_a_failed_attempt() -> None:
    outcome = job_outcome(job(COMPLETE), [pod(0, '{"id": "x"}')], now=NOW, deadline=DEADLINE)
    assert (outcome.state, outcome.reason) == (JobState.FAILED, FailureReason.INVALID_RESULT)
    assert "not a valid profile" in outcome.message
    gone = job_outcome(job(COMPLETE), [], now=NOW, deadline=DEADLINE)
    assert gone.reason is FailureReason.INVALID_RESULT
    # A pod of another Job is not this Job's result.
    other = job_outcome(
        job(COMPLETE), [pod(0, compact_json(smollm2_profile()), owner="other")], now=NOW, deadline=DEADLINE
    )
    assert other.state is JobState.FAILED


def test_a_failed_job_reports_the_calibrators_own_words() -> None:
    said = "slogate calibrate: error: calibration exceeded its 90 s budget in stage 'decode'"
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit"}
    outcome = job_outcome(job(failed), [pod(3, "progress...\n" + said)], now=NOW, deadline=DEADLINE)
    assert (outcome.state, outcome.reason) == (JobState.FAILED, FailureReason.FAILED)
    assert said in outcome.message
    assert "BackoffLimitExceeded" in outcome.message
    deadline = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too long"}
    assert job_outcome(job(deadline), [], now=NOW, deadline=DEADLINE).reason is FailureReason.TIMED_OUT


def test_an_unfinished_job_runs_until_our_deadline() -> None:
    assert job_outcome(job(), [], now=NOW, deadline=DEADLINE).state is JobState.RUNNING
    stuck = job_outcome(job(created=NOW - timedelta(seconds=361)), [], now=NOW, deadline=DEADLINE)
    assert (stuck.state, stuck.reason) == (JobState.FAILED, FailureReason.TIMED_OUT)


def test_a_job_ends_with_its_terminal_condition_only() -> None:
    """One reader of a Job's end (calibration.finished): SuccessCriteriaMet and FailureTarget
    come while its pods still terminate, so the Job still runs (holds a slot, is stopped)."""
    assert finished(job()) is None
    for early in ("SuccessCriteriaMet", "FailureTarget"):
        assert finished(job({"type": early, "status": "True"})) is None
        assert job_outcome(job({"type": early, "status": "True"}), [], now=NOW, deadline=DEADLINE).state is (
            JobState.RUNNING
        )
    assert finished(job({"type": "Failed", "status": "False"})) is None
    assert finished(job({"type": "SuccessCriteriaMet", "status": "True"}, COMPLETE)) == Finished(True, "Complete", "")
    failed = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too long"}
    assert finished(job({"type": "FailureTarget", "status": "True"}, failed)) == Finished(
        False, "DeadlineExceeded", "too long"
    )
    assert finished(job({"type": "Failed", "status": "True"})) == Finished(False, "Failed", "")


def test_a_job_that_never_made_a_pod_says_why_it_may_not_have() -> None:
    """The review: a Job whose pod is refused at creation (quota, LimitRange, PodSecurity) read
    "measuring" until its timeout; the refusal is only an event on the Job."""
    fresh = job_outcome(job(created=NOW - timedelta(seconds=5)), [], now=NOW, deadline=DEADLINE)
    assert (fresh.state, fresh.waiting) == (JobState.RUNNING, None)  # the controller is about to make it
    stuck = job_outcome(job(created=NOW - timedelta(seconds=31)), [], now=NOW, deadline=DEADLINE)
    assert stuck.state is JobState.RUNNING
    assert stuck.waiting is not None
    assert stuck.waiting[0] == "PodNotCreated"
    assert "kubectl describe job" in stuck.waiting[1]


def test_retry_backoff_doubles_up_to_its_cap() -> None:
    delays = [retry_delay(n, 60, 1800).total_seconds() for n in range(1, 8)]
    assert delays == [60, 120, 240, 480, 960, 1800, 1800]


def test_ready_follows_the_other_conditions() -> None:
    good = [
        Condition(C.INVALID, False, "Valid"),
        Condition(C.DEGRADED, False, "AsExpected"),
        Condition(C.CALIBRATED, True, "Current"),
        Condition(C.THRESHOLDS_PUSHED, True, "AllAcknowledged"),
    ]
    assert ready_condition(good).status is True
    for index, flipped_reason in enumerate(["TargetUnusable", "CalibrationFailed", "Calibrating", "PushPending"]):
        judged = list(good)
        old = judged[index]
        judged[index] = Condition(old.type, not old.status, flipped_reason, "why")
        ready = ready_condition(judged)
        assert (ready.status, ready.reason, ready.message) == (False, flipped_reason, "why")


def test_transition_time_moves_only_when_the_status_flips() -> None:
    first = condition_dicts([Condition(C.DEGRADED, True, "A", "m")], [], now=NOW, generation=1)
    later = NOW + timedelta(minutes=5)
    same = condition_dicts([Condition(C.DEGRADED, True, "B", "n")], first, now=later, generation=2)
    assert same[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert (same[0]["reason"], same[0]["observedGeneration"]) == ("B", 2)
    flipped = condition_dicts([Condition(C.DEGRADED, False, "AsExpected")], same, now=later, generation=2)
    assert flipped[0]["lastTransitionTime"] == "2026-12-02T12:05:00Z"
    # Events: new trouble, or the same trouble with a new message, is announced once.
    assert newly_true([Condition(C.DEGRADED, True, "A", "m")], first) == []
    assert newly_true([Condition(C.DEGRADED, True, "A", "m2")], first) != []
    assert newly_true([Condition(C.DEGRADED, True, "A", "m")], flipped) != []


def test_status_summaries_fit_the_crd_status_schema() -> None:
    profile = smollm2_profile()
    policy = Policy.model_validate(
        {"slo": {"ttftSeconds": 2}, "classes": [{"name": "a", "ttftSeconds": 1}, {"name": "b"}]}
    )
    thresholds = derive_thresholds(policy, profile, derived_at=NOW)
    status = {
        "observedGeneration": 3,
        "calibration": calibration_summary(profile, "0123456789abcdef", "p-cal-0123456789ab"),
        "thresholds": thresholds_summary(thresholds, "p-thresholds"),
        "conditions": condition_dicts([Condition(C.READY, True, "Ready", "ok")], [], now=NOW, generation=3),
        "pushed": "1/1",
        "sidecars": {"targeted": 1, "acknowledged": 1, "behind": []},
    }
    schema = SCHEMA["properties"]["status"]
    assert list(jsonschema.Draft4Validator(schema).iter_errors(status)) == []
    assert status["thresholds"]["tokenBudget"] == int(thresholds.classes[-1].token_budget)
    assert status["calibration"]["summary"] == "SmolLM2-135M-Instruct Q4_1"
    status["thresholds"]["concurrencyCap"] = "four"
    assert list(jsonschema.Draft4Validator(schema).iter_errors(status))


def test_settings_from_the_environment_and_refusals() -> None:
    env = {
        "SLOGATE_OPERATOR_NAMESPACES": "llm, chat",
        "SLOGATE_OPERATOR_STANDALONE": "yes",
        "SLOGATE_OPERATOR_RESYNC_SECONDS": "12.5",
        "SLOGATE_OPERATOR_PUSH_ATTEMPTS": "5",
        "SLOGATE_OPERATOR_IMAGE": "registry/slogate:1",
    }
    settings = OperatorSettings.from_env(env, push_attempts=None)
    assert (settings.namespaces, settings.standalone, settings.resync_seconds, settings.push_attempts) == (
        ("llm", "chat"), True, 12.5, 5,
    )  # fmt: skip
    assert OperatorSettings.from_env(env, image="other").image == "other"
    for bad in ({"SLOGATE_OPERATOR_RESYNC_SECONDS": "0"}, {"SLOGATE_OPERATOR_STANDALONE": "perhaps"},
                {"SLOGATE_OPERATOR_METRICS_PORT": "70000"}, {"SLOGATE_OPERATOR_PUSH_ATTEMPTS": "two"}):  # fmt: skip
        with pytest.raises(SettingsError):
            OperatorSettings.from_env(bad)
    rows = OperatorSettings.environment_variables()
    assert len(rows) == len(OperatorSettings.__dataclass_fields__)
    assert all(doc for _, _, doc in rows)  # every setting is documented in its docstring


@pytest.mark.parametrize(
    ("peers", "said"),
    [
        ("{not json", "must be JSON"),
        ('{"podSelector": {}}', "JSON list"),  # one peer, not a list of them
        ("[{}]", "JSON list"),  # an empty peer is every pod of the cluster
        ('[{"podSelector": {}, "ports": [8082]}]', "not ['ports']"),
    ],
)
def test_admin_peers_are_a_list_of_network_policy_peers(peers: str, said: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(said)):
        OperatorSettings.from_env({"SLOGATE_OPERATOR_ADMIN_PEERS": peers})
    good = '[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}]'
    assert OperatorSettings.from_env({"SLOGATE_OPERATOR_ADMIN_PEERS": good}).peers() == (
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}},
    )
    assert OperatorSettings().peers() == ()


def running_pod(name: str, ip: str | None, *, sidecar: str = "running", phase: str = "Running") -> dict[str, Any]:
    state = {sidecar: {}} if sidecar else {}
    return {
        "metadata": {"name": name},
        "status": {"phase": phase, "podIP": ip,
                   "containerStatuses": [{"name": names.SIDECAR_CONTAINER, "state": state}]},
    }  # fmt: skip


def test_pushes_go_to_running_sidecars_ready_or_not() -> None:
    pods = [
        running_pod("b", "10.0.0.2"),
        running_pod("a", "fd00::1"),
        running_pod("starting", "10.0.0.3", sidecar="waiting"),
        running_pod("pending", None, phase="Pending"),
        {**running_pod("leaving", "10.0.0.4"), "metadata": {"name": "leaving", "deletionTimestamp": "x"}},
    ]
    found = endpoints(pods, 8082, injected=True)
    assert [(e.pod, e.url) for e in found] == [("a", "http://[fd00::1]:8082"), ("b", "http://10.0.0.2:8082")]
    # A self-managed sidecar's container may be named anything: every running pod is pushed to.
    assert len(endpoints(pods, 8082, injected=False)) == 3


def test_a_native_sidecar_on_the_gates_port_is_a_clash() -> None:
    """The review: only regular containers' ports were checked; a native sidecar (an init
    container with restartPolicy Always) on the sidecar's port crash-looped the gated pod."""
    spec = parse_spec(admission_policy()["spec"])
    template = llama_deployment()["spec"]["template"]["spec"]
    template["initContainers"].append({"name": "proxy", "image": "envoy", "restartPolicy": "Always",
                                       "ports": [{"containerPort": 8081}]})  # fmt: skip
    clash = targets.port_clash(spec, llama_container(template, None), template)
    assert clash is not None
    assert "container proxy declares port 8081" in clash
    template["initContainers"][-1].pop("restartPolicy")  # a plain init container has exited before the gate starts
    assert targets.port_clash(spec, llama_container(template, None), template) is None
