"""Reading a calibration Job: running, done with a valid profile, or failed and why. Pure.

The result travels in the calibrator container's termination message (the compact
profile, under 4 KiB); on failure the message is the tail of its log (the one-line
error of `slogate calibrate`), because the container's terminationMessagePolicy is
FallbackToLogsOnError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from slogate_admission.schema import CalibrationProfile
from slogate_admission.validation import first_problem
from slogate_operator import names
from slogate_operator.timestamps import parse_time


class JobState(StrEnum):
    """Where a calibration Job is."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class FailureReason(StrEnum):
    """Why an attempt failed: the Degraded condition's reason."""

    FAILED = "CalibrationFailed"
    TIMED_OUT = "CalibrationTimedOut"
    INVALID_RESULT = "CalibrationResultInvalid"
    REJECTED = "CalibrationJobRejected"
    """The API server refused to create the Job (422 Invalid, 403 Forbidden, a quota...)."""


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a look at the Job and its pods found."""

    state: JobState
    profile: CalibrationProfile | None = None
    reason: FailureReason | None = None
    message: str = ""
    waiting: tuple[str, str] | None = None
    """While running: (reason, message) of what holds its pod back (Unschedulable,
    ImagePullBackOff...), so a Pending Job says why instead of timing out in silence."""


@dataclass(frozen=True, slots=True)
class Finished:
    """How Kubernetes ended a Job."""

    succeeded: bool
    reason: str
    message: str


def finished(job: Mapping[str, Any]) -> Finished | None:
    """How the Job ended, by its terminal condition (Complete or Failed, status True); None
    while it has not. SuccessCriteriaMet and FailureTarget come first, while the Job's pods
    still terminate: until its terminal condition it still holds a calibration slot, and a
    stop must still delete it."""
    true = [c for c in (job.get("status") or {}).get("conditions") or () if c.get("status") == "True"]
    for kind, succeeded in (("Complete", True), ("Failed", False)):
        condition = next((c for c in true if c.get("type") == kind), None)
        if condition is not None:
            return Finished(succeeded, str(condition.get("reason") or kind), str(condition.get("message") or ""))
    return None


def job_pods(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Job's pods: owned by its uid, or labelled with its name."""
    name = job["metadata"]["name"]
    uid = job["metadata"].get("uid")
    mine = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        owned = any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or ()) if uid else False
        if owned or labels.get("batch.kubernetes.io/job-name") == name or labels.get("job-name") == name:
            mine.append(pod)
    return mine


def calibrator_termination(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The calibrator container's terminated state in a pod, if it has ended."""
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        if status.get("name") == names.CALIBRATOR_CONTAINER:
            terminated = (status.get("state") or {}).get("terminated")
            return dict(terminated) if terminated else None
    return None


def job_outcome(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, now: datetime, deadline: timedelta
) -> JobOutcome:
    """Judge a Job: its conditions first, the calibrator's termination for the details.

    ``deadline``: an unfinished Job older than this is timed out even if Kubernetes has
    not failed it yet (normally activeDeadlineSeconds does, a little earlier).
    """
    ended = [t for t in (calibrator_termination(p) for p in job_pods(job, pods)) if t is not None]
    end = finished(job)
    if end is not None and end.succeeded:
        for terminated in ended:
            if terminated.get("exitCode") == 0:
                return _read_profile(str(terminated.get("message") or ""))
        return JobOutcome(
            JobState.FAILED,
            reason=FailureReason.INVALID_RESULT,
            message="the Job completed but no calibrator pod with a result is left (deleted?)",
        )
    if end is not None:
        detail = next((str(t.get("message") or "").strip() for t in ended if t.get("exitCode") != 0), "")
        text = f"Job {job['metadata']['name']} failed ({end.reason}: {end.message or 'no message'})"
        if detail:
            text += f"; calibrator said: {detail.splitlines()[-1][:400]}"
        reason = FailureReason.TIMED_OUT if end.reason == "DeadlineExceeded" else FailureReason.FAILED
        return JobOutcome(JobState.FAILED, reason=reason, message=text)
    created = parse_time(job["metadata"].get("creationTimestamp"))
    if created is not None and now - created > deadline:
        return JobOutcome(
            JobState.FAILED,
            reason=FailureReason.TIMED_OUT,
            message=f"Job {job['metadata']['name']} has not finished {deadline.total_seconds():g} s after its creation",
        )
    mine = job_pods(job, pods)
    if not mine and created is not None and now - created > NO_POD_GRACE:
        name = job["metadata"]["name"]
        return JobOutcome(JobState.RUNNING, waiting=("PodNotCreated", (
            f"the Job has made no pod in {NO_POD_GRACE.total_seconds():g} s: a ResourceQuota, LimitRange or "
            f"PodSecurity level of the namespace may refuse it (kubectl describe job {name}: FailedCreate events)"
        )))  # fmt: skip
    return JobOutcome(JobState.RUNNING, waiting=pod_waiting(mine))


NO_POD_GRACE = timedelta(seconds=30)
"""How long a Job may be without a pod before the status says why it may be (the Job
controller creates one within seconds; a refused create leaves only an event on the Job)."""


STUCK_CONTAINER_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)
"""Container waiting reasons that will not clear by themselves (``ContainerCreating`` will)."""


def pod_waiting(pods: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """Why the first held-back pod of a Job is not running: unschedulable, or a stuck container."""
    for pod in pods:
        status = pod.get("status") or {}
        for condition in status.get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("reason") or "Unschedulable"), str(condition.get("message") or "")
        for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_CONTAINER_REASONS:
                detail = f"container {container.get('name')}: {waiting.get('message') or waiting['reason']}"
                return str(waiting["reason"]), detail
    return None


def _read_profile(message: str) -> JobOutcome:
    try:
        profile = CalibrationProfile.model_validate_json(message)
    except ValidationError as invalid:
        return JobOutcome(
            JobState.FAILED,
            reason=FailureReason.INVALID_RESULT,
            message=f"the calibrator's result is not a valid profile: {first_problem(invalid, root='(message)')} "
            f"({len(message)} bytes)",
        )
    return JobOutcome(JobState.SUCCEEDED, profile=profile)


def retry_delay(attempts: int, base_s: float, max_s: float) -> timedelta:
    """Backoff after ``attempts`` failures: base, 2·base, 4·base, ... capped at max."""
    return timedelta(seconds=min(max_s, base_s * 2 ** max(0, attempts - 1)))
