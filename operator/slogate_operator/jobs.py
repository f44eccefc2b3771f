"""Driving calibration Jobs: create one per fingerprint, read its outcome, retry with backoff.

The record of the calibration under way lives in ``status.calibrating`` (job, attempts,
last failure, when the next attempt may start), so a restarted operator picks up where
the last one stopped: it finds the Job by its deterministic name instead of creating
a second one, and honours the backoff it had set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slogate_admission.schema import CalibrationProfile
from slogate_operator import builders, metrics, names
from slogate_operator.calibration import FailureReason, JobState, finished, job_outcome, retry_delay
from slogate_operator.client import JOBS, PODS, AlreadyExistsError, ApiError
from slogate_operator.context import Runtime
from slogate_operator.selectors import labelled
from slogate_operator.spec import AdmissionPolicySpec
from slogate_operator.targets import Target
from slogate_operator.timestamps import format_time, parse_time

log = logging.getLogger("slogate.operator")
_OUTCOME_LABEL = {
    FailureReason.FAILED: "failed",
    FailureReason.TIMED_OUT: "timed_out",
    FailureReason.INVALID_RESULT: "invalid_result",
    FailureReason.REJECTED: "rejected",
}


@dataclass(frozen=True, slots=True)
class Progress:
    """Where the calibration of one fingerprint stands after this pass."""

    state: JobState
    record: dict[str, Any] | None
    """The new ``status.calibrating`` (None once a profile is in hand)."""
    profile: CalibrationProfile | None = None
    started: bool = False
    wake_at: datetime | None = None
    """When the next attempt may start, if waiting out a backoff."""
    waiting: tuple[str, str] | None = None
    """(reason, message): what holds a running Job's pod back (Unschedulable...)."""

    @property
    def failure(self) -> Mapping[str, Any] | None:
        """The last failure of this fingerprint, while no attempt has succeeded."""
        return (self.record or {}).get("lastFailure")


async def advance(  # noqa: PLR0911 (each outcome of a Job returns its own progress)
    rt: Runtime,
    policy: builders.PolicyRef,
    *,
    spec: AdmissionPolicySpec,
    target: Target,
    key: str,
    previous: Mapping[str, Any] | None,
) -> Progress:
    """One step of the calibration of ``key`` (the container fingerprint) for ``target``."""
    now = rt.clock()
    job_name = names.calibration_job_name(policy.name, key)
    same = previous is not None and previous.get("containerFingerprint") == key
    record: dict[str, Any] = dict(previous) if same and previous else {"containerFingerprint": key, "attempts": 0}
    record |= {"job": job_name, "deployment": target.name}
    job = await rt.client.get(JOBS, policy.namespace, job_name)
    if job is None:
        wait_until = parse_time(record.get("nextAttemptAt"))
        if wait_until is not None and now < wait_until:
            return Progress(JobState.FAILED, record, wake_at=wait_until)
        return await _start(rt, policy, spec=spec, target=target, key=key, record=record, now=now)

    pods = await rt.client.list(PODS, policy.namespace, label_selector=labelled("job-name", job_name).query())
    deadline = timedelta(seconds=spec.operator.calibration.timeout_seconds + rt.settings.calibration_grace_seconds)
    outcome = job_outcome(job, pods, now=now, deadline=deadline)
    if outcome.state is JobState.RUNNING:
        return Progress(JobState.RUNNING, record, waiting=outcome.waiting)
    if outcome.state is JobState.SUCCEEDED:
        metrics.calibrations.labels(policy.namespace, policy.name, "succeeded").inc()
        log.info(
            "calibration %s of %s/%s succeeded: %s",
            job_name,
            policy.namespace,
            policy.name,
            outcome.profile.id if outcome.profile else "?",
        )
        return Progress(JobState.SUCCEEDED, None, profile=outcome.profile)

    assert outcome.reason is not None
    uid = job["metadata"].get("uid")
    last = record.get("lastFailure") or {}
    if last.get("jobUid") != uid:
        progress = _failed(rt, policy, record, outcome.reason, outcome.message, now=now, job_uid=uid)
        if finished(job) is None:
            await rt.client.delete(JOBS, policy.namespace, job_name)  # timed out by our clock: stop it
        return progress
    wait_until = parse_time(record.get("nextAttemptAt"))
    if wait_until is not None and now < wait_until:
        return Progress(JobState.FAILED, record, wake_at=wait_until)
    # Backoff over: the failed Job (kept until now for its logs) makes way for the next attempt.
    await rt.client.delete(JOBS, policy.namespace, job_name)
    return await _start(rt, policy, spec=spec, target=target, key=key, record=record, now=now)


async def _start(
    rt: Runtime,
    policy: builders.PolicyRef,
    *,
    spec: AdmissionPolicySpec,
    target: Target,
    key: str,
    record: dict[str, Any],
    now: datetime,
) -> Progress:
    """Start the Job, unless ``max_calibrations`` run already (then it waits, ``Queued``)."""
    calibration = spec.operator.calibration
    body = builders.calibration_job(
        builders.CalibrationRequest(
            policy=policy,
            deployment=target.name,
            llama=target.llama,
            container_fingerprint=key,
            image=spec.operator.sidecar.image or rt.settings.image,
            timeout_seconds=calibration.timeout_seconds,
            budget_seconds=calibration.budget_seconds,
            ttl_seconds=rt.settings.job_ttl_seconds,
        )
    )
    # Counted and created under one lock, so the passes of this process never start more.
    async with rt.calibration_starts:
        running, limit = await calibrations_running(rt), rt.settings.max_calibrations
        if running >= limit:
            return Progress(JobState.RUNNING, record, waiting=("Queued", (
                f"{running} calibrations run already, at most {limit} at once (the operator's "
                "max_calibrations): this one starts when one of them ends"
            )))  # fmt: skip
        try:
            await rt.client.create(JOBS, policy.namespace, body)
        except AlreadyExistsError:
            # The previous one is still being deleted (or another writer created it): next pass.
            return Progress(JobState.RUNNING, record)
        except ApiError as refused:
            if refused.status == 0 or refused.status >= 500:
                raise  # the API server is unwell, not the Job: the pass fails and backs off
            why = f"the API server refused the Job: {refused}"
            return _failed(rt, policy, record, FailureReason.REJECTED, why, now=now)
    record = {k: v for k, v in record.items() if k != "nextAttemptAt"} | {"startedAt": format_time(now)}
    metrics.calibrations.labels(policy.namespace, policy.name, "started").inc()
    log.info(
        "calibration Job %s started for %s/%s (Deployment %s, fingerprint %s)",
        body["metadata"]["name"],
        policy.namespace,
        policy.name,
        target.name,
        key,
    )
    return Progress(JobState.RUNNING, record, started=True)


async def calibrations_running(rt: Runtime) -> int:
    """Unfinished calibration Jobs in the namespaces this operator serves (one list each, or
    one for all; only when a Job is about to start)."""
    served: list[str | None] = list(rt.settings.namespaces) or [None]
    found = 0
    for namespace in served:
        listed = await rt.client.list(JOBS, namespace, label_selector=labelled(names.LABEL_POLICY).query())
        found += sum(1 for job in listed if finished(job) is None)
    return found


def _failed(
    rt: Runtime,
    policy: builders.PolicyRef,
    record: dict[str, Any],
    reason: FailureReason,
    message: str,
    *,
    now: datetime,
    job_uid: str | None = None,
) -> Progress:
    """Count a failed attempt, and back off before the next one."""
    attempts = int(record.get("attempts", 0)) + 1
    settings = rt.settings
    retry_at = now + retry_delay(attempts, settings.calibration_retry_seconds, settings.calibration_retry_max_seconds)
    record = record | {
        "attempts": attempts,
        "lastFailure": {
            "reason": reason.value,
            "message": f"attempt {attempts}: {message}",
            "at": format_time(now),
            "jobUid": job_uid,
        },
        "nextAttemptAt": format_time(retry_at),
    }
    metrics.calibrations.labels(policy.namespace, policy.name, _OUTCOME_LABEL[reason]).inc()
    log.warning(
        "calibration %s of %s/%s failed (attempt %d), next attempt after %s: %s",
        record.get("job"),
        policy.namespace,
        policy.name,
        attempts,
        record["nextAttemptAt"],
        message,
    )
    return Progress(JobState.FAILED, record, wake_at=retry_at)


async def stop_obsolete(rt: Runtime, policy: builders.PolicyRef, keep: str | None) -> list[str]:
    """Delete this policy's unfinished Jobs for other fingerprints (a newer rollout won)."""
    mine = labelled(names.LABEL_POLICY, builders.policy_label_value(policy.name))
    jobs = await rt.client.list(JOBS, policy.namespace, label_selector=mine.query())
    stopped = []
    for job in jobs:
        labels = job["metadata"].get("labels") or {}
        if not mine.matches(labels) or labels.get(names.LABEL_FINGERPRINT) == keep:
            continue
        if finished(job) is None:
            await rt.client.delete(JOBS, policy.namespace, job["metadata"]["name"])
            stopped.append(job["metadata"]["name"])
    return stopped
