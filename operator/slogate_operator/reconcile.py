"""One reconcile pass of one AdmissionPolicy: level-triggered and idempotent.

Read the policy; validate its spec; find its Deployments and their llama.cpp
container fingerprints; keep the admin token Secret and the thresholds ConfigMap;
inject (or remove) the sidecar; calibrate when the fingerprint has no profile yet;
derive thresholds when the profile or the policy changed; push them to every running
sidecar; write the status and post events for what went wrong. Every step reads
the cluster as it is now, so running a pass twice changes nothing the second time,
and a pass interrupted anywhere (operator restart) is simply run again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slogate_admission.derivation import DerivationError, derive_thresholds
from slogate_admission.schema import CalibrationProfile
from slogate_operator import builders, jobs, metrics, names, stores, targets
from slogate_operator.calibration import JobState, parse_time
from slogate_operator.client import DEPLOYMENTS, PODS, POLICIES
from slogate_operator.context import Runtime
from slogate_operator.injection import SidecarConfig, TargetClaimedError, injected_template, removed_template
from slogate_operator.push import PushReport, endpoints, push_all
from slogate_operator.spec import AdmissionPolicySpec, SpecError, parse_spec
from slogate_operator.status import (
    Condition,
    ConditionType,
    calibration_summary,
    condition_dicts,
    newly_true,
    ready_condition,
    thresholds_summary,
)

C = ConditionType


@dataclass(frozen=True, slots=True)
class PassResult:
    """What the loop needs to know after a pass."""

    gone: bool = False
    """The policy no longer exists (or is being deleted): stop."""
    wake_at: datetime | None = None
    """Run again no later than this (a calibration backoff ends)."""


async def reconcile(rt: Runtime, namespace: str, name: str) -> PassResult:
    """One pass; API errors propagate (the loop backs off and tries again)."""
    body = await rt.client.get(POLICIES, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return PassResult(gone=True)
    meta = body["metadata"]
    policy = builders.PolicyRef(name=name, namespace=namespace, uid=str(meta.get("uid", "")))
    previous: dict[str, Any] = dict(body.get("status") or {})
    generation = int(meta.get("generation") or 1)
    try:
        spec = parse_spec(body.get("spec"))
    except SpecError as error:
        # What is in force stays in force, and the status keeps saying so.
        status = {k: v for k, v in previous.items() if k not in ("conditions", "observedGeneration")}
        status["observedGeneration"] = generation
        judged = [Condition(C.INVALID, True, "InvalidSpec", str(error))] + [
            Condition(kind, False, "InvalidSpec", "the spec is invalid: the thresholds in force are kept")
            for kind in (C.DEGRADED, C.CALIBRATED, C.THRESHOLDS_PUSHED)
        ]
        judged = [ready_condition(judged), *judged]
        await _finish(rt, policy, previous=previous, status=status, judged=judged, events=[])
        return PassResult()
    recalibrate = str((meta.get("annotations") or {}).get(names.ANNOTATION_RECALIBRATE) or "")
    run = Pass(rt, policy, spec, previous, recalibrate, {"observedGeneration": generation})
    await run.execute()
    judged = run.judge()
    await _finish(rt, policy, previous=previous, status=run.status, judged=judged, events=run.events)
    _export(policy, spec, run, judged)
    return PassResult(wake_at=run.wake_at)


@dataclass(slots=True)
class Pass:
    """The steps of a pass over a valid spec, and what they found."""

    rt: Runtime
    policy: builders.PolicyRef
    spec: AdmissionPolicySpec
    previous: Mapping[str, Any]
    recalibrate: str
    status: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    degraded: list[tuple[str, str]] = field(default_factory=list)
    calibrated: Condition | None = None
    report: PushReport | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    wake_at: datetime | None = None

    async def execute(self) -> None:
        rt, policy = self.rt, self.policy
        deployments = await rt.client.list(DEPLOYMENTS, policy.namespace)
        scan = targets.scan(policy.name, self.spec, deployments, self.recalibrate or None)
        self.problems += scan.problems
        self.status["target"] = self.spec.target_text()
        self.status["targets"] = [t.name for t in scan.targets]
        token = await stores.ensure_token(rt.client, policy, rt.settings.admin_token_secret)
        stored = await stores.load_stored(rt.client, policy)
        await self.inject(scan)
        key = self.calibration_key(scan)
        self.status["containerFingerprint"] = key
        await jobs.stop_obsolete(rt, policy, keep=key)
        stored, fresh = await self.calibrate(scan, key, stored)
        stored, fresh = self.derive(stored, fresh)
        if fresh:
            await stores.save_stored(rt.client, policy, stored)
        if stored.profile is not None:
            self.status["calibration"] = calibration_summary(
                stored.profile, stored.container_fingerprint or "", stored.job
            )
        if stored.thresholds is not None:
            self.status["thresholds"] = thresholds_summary(
                stored.thresholds, names.thresholds_configmap_name(policy.name)
            )
            if scan.targets:
                self.report = await self.push(scan, stored, token)

    def calibration_key(self, scan: targets.TargetScan) -> str | None:
        """The one container fingerprint of the targets, or None (and why) if there is none."""
        if not scan.targets:
            if not scan.problems:
                where = f"in namespace {self.policy.namespace}"
                self.degraded.append(("TargetNotFound", f"no Deployment {self.spec.target_text()} {where}"))
            self.calibrated = Condition(C.CALIBRATED, False, "NoTarget", "no usable target Deployment")
            return None
        if len(scan.fingerprints) > 1:
            detail = ", ".join(f"{t.name}={t.fingerprint}" for t in scan.targets)
            self.degraded.append((
                "TargetsDiffer",
                f"selected Deployments run different llama.cpp containers ({detail}); "
                "a policy calibrates one model: use one policy per model",
            ))  # fmt: skip
            self.calibrated = Condition(C.CALIBRATED, False, "TargetsDiffer", detail)
            return None
        return scan.targets[0].fingerprint

    async def inject(self, scan: targets.TargetScan) -> None:
        """Sidecar into every target (with inject), out of strays and, without inject, of targets."""
        sidecar, client, namespace = self.spec.operator.sidecar, self.rt.client, self.policy.namespace
        for target in scan.targets:
            config = SidecarConfig(
                policy=self.policy.name,
                image=sidecar.image or self.rt.settings.image,
                port=sidecar.port,
                admin_port=sidecar.admin_port,
                upstream_port=target.llama.port(),
                prompt_counting=sidecar.prompt_counting,
                token_secret=self.rt.settings.admin_token_secret,
                resources=sidecar.resources.model_dump(exclude_defaults=True) if sidecar.resources else None,
            )

            def desired(template: Mapping[str, Any], config: SidecarConfig = config) -> dict[str, Any]:
                return injected_template(template, config) if sidecar.inject else removed_template(template)

            try:
                if await targets.apply_template(client, namespace, target.deployment, desired):
                    done = "injected into" if sidecar.inject else "removed from"
                    reason = "SidecarInjected" if sidecar.inject else "SidecarRemoved"
                    self.events.append(("Normal", reason, f"sidecar {done} Deployment {target.name}"))
            except TargetClaimedError as error:
                self.problems.append(f"Deployment {target.name}: {error}")
        for stray in scan.strays:
            if await targets.apply_template(client, namespace, stray, removed_template):
                what = f"sidecar removed from Deployment {stray['metadata']['name']} (no longer selected)"
                self.events.append(("Normal", "SidecarRemoved", what))

    async def calibrate(
        self, scan: targets.TargetScan, key: str | None, stored: stores.StoredCalibration
    ) -> tuple[stores.StoredCalibration, bool]:
        """Advance the calibration of ``key`` if it has no profile; True when one just arrived."""
        profile = stored.profile
        if key is None or (profile is not None and stored.container_fingerprint == key):
            if key is not None and profile is not None:
                self.calibrated = Condition(C.CALIBRATED, True, "Current", f"calibration {profile.id} of {key}")
            return stored, False
        if (
            profile is not None
            and not self.spec.operator.calibration.on_rollout
            and (stored.recalibrate == self.recalibrate)
        ):
            self.calibrated = Condition(
                C.CALIBRATED, False, "Stale",
                f"the target changed (fingerprint {key}) but calibration.onRollout is false: "
                f"calibration {profile.id} stays in force (annotate {names.ANNOTATION_RECALIBRATE} to recalibrate)",
            )  # fmt: skip
            return stored, False
        target = scan.targets[0]
        progress = await jobs.advance(
            self.rt, self.policy, spec=self.spec, target=target, key=key, previous=self.previous.get("calibrating")
        )
        self.wake_at = progress.wake_at
        job = names.calibration_job_name(self.policy.name, key)
        if progress.started:
            self.events.append(("Normal", "CalibrationStarted", f"Job {job} calibrates Deployment {target.name}"))
        if progress.state is JobState.SUCCEEDED and progress.profile is not None:
            return self.calibrated_now(progress.profile, key, job, stored), True
        self.status["calibrating"] = progress.record
        failure = progress.failure
        if failure:
            self.degraded.append((str(failure["reason"]), str(failure["message"])))
        self.calibrated = (
            Condition(C.CALIBRATED, False, "CalibrationFailed", str(failure["message"]))
            if progress.state is JobState.FAILED and failure
            else Condition(C.CALIBRATED, False, "Calibrating", f"Job {job} is measuring fingerprint {key}")
        )
        return stored, False

    def calibrated_now(
        self, profile: CalibrationProfile, key: str, job: str, stored: stores.StoredCalibration
    ) -> stores.StoredCalibration:
        self.events.append(("Normal", "CalibrationSucceeded", f"calibration {profile.id} from Job {job}"))
        self.calibrated = Condition(C.CALIBRATED, True, "Current", f"calibration {profile.id} of {key}")
        return dataclasses.replace(
            stored, profile=profile, container_fingerprint=key, job=job, recalibrate=self.recalibrate
        )

    def derive(self, stored: stores.StoredCalibration, fresh: bool) -> tuple[stores.StoredCalibration, bool]:
        """New thresholds when the profile or the policy changed; the old stay on failure."""
        profile, thresholds = stored.profile, stored.thresholds
        digest = stores.policy_digest(self.spec.policy)
        if profile is None or not (
            fresh or thresholds is None or thresholds.calibration_id != profile.id or stored.policy_digest != digest
        ):
            return stored, fresh
        try:
            derived = derive_thresholds(self.spec.policy, profile, derived_at=self.rt.clock())
        except DerivationError as error:
            self.degraded.append(("SLOUnattainable", f"calibration {profile.id}: {error}"))
            return stored, fresh
        budget = int(next(c.token_budget for c in derived.classes if c.name == derived.default_class))
        self.events.append((
            "Normal", "ThresholdsDerived",
            f"thresholds of calibration {profile.id}: token budget {budget}, concurrency cap {derived.concurrency_cap}",
        ))  # fmt: skip
        return dataclasses.replace(stored, thresholds=derived, policy_digest=digest), True

    async def push(self, scan: targets.TargetScan, stored: stores.StoredCalibration, token: str) -> PushReport:
        assert stored.thresholds is not None
        pods: dict[str, Mapping[str, Any]] = {}
        for target in scan.targets:
            query, matches = targets.pod_selector(target.deployment)
            for pod in await self.rt.client.list(PODS, self.policy.namespace, label_selector=query or None):
                if matches(pod):
                    pods[pod["metadata"]["name"]] = pod
        sidecar = self.spec.operator.sidecar
        found = endpoints(list(pods.values()), sidecar.admin_port, injected=sidecar.inject)
        report = await push_all(self.rt.http, found, stored.thresholds, token, self.rt.push_settings)
        self.status["pushed"] = report.text
        self.status["sidecars"] = {
            "targeted": report.targeted,
            "acknowledged": len(report.acknowledged),
            "behind": [{"pod": pod, "reason": why[:300]} for pod, why in report.behind[:10]],
        }
        return report

    def judge(self) -> list[Condition]:
        """The conditions, Ready first."""
        invalid = (
            Condition(C.INVALID, True, "TargetUnusable", "; ".join(self.problems))
            if self.problems
            else Condition(C.INVALID, False, "Valid", "the spec passed every check")
        )
        degraded = (
            Condition(C.DEGRADED, True, self.degraded[0][0], "; ".join(m for _, m in self.degraded))
            if self.degraded
            else Condition(C.DEGRADED, False, "AsExpected", "")
        )
        calibrated = self.calibrated or Condition(C.CALIBRATED, False, "NotCalibrated", "no calibration yet")
        report = self.report
        if "thresholds" not in self.status:
            pushed = Condition(C.THRESHOLDS_PUSHED, False, "NoThresholds", "no thresholds derived yet")
        elif report is None:
            pushed = Condition(C.THRESHOLDS_PUSHED, False, "NoTarget", "no target to push to")
        elif report.complete:
            calibration = self.status["thresholds"]["calibrationId"]
            text = f"{report.text} running sidecars serve calibration {calibration}"
            pushed = Condition(C.THRESHOLDS_PUSHED, True, "AllAcknowledged", text)
        else:
            behind = "; ".join(f"{pod}: {why}" for pod, why in report.behind[:3])
            pushed = Condition(C.THRESHOLDS_PUSHED, False, "PushPending", f"{report.text} acknowledged; {behind}")
        judged = [invalid, degraded, calibrated, pushed]
        return [ready_condition(judged), *judged]


async def _finish(
    rt: Runtime,
    policy: builders.PolicyRef,
    *,
    previous: Mapping[str, Any],
    status: dict[str, Any],
    judged: list[Condition],
    events: list[tuple[str, str, str]],
) -> None:
    """Write the status if it changed; post events for new trouble and for what was done."""
    before = list(previous.get("conditions") or [])
    status["conditions"] = condition_dicts(judged, before, now=rt.clock(), generation=status["observedGeneration"])
    status = {k: v for k, v in status.items() if v is not None}
    if status != previous:
        replace_status = [{"op": "add", "path": "/status", "value": status}]
        await rt.client.json_patch(POLICIES, policy.namespace, policy.name, replace_status, subresource="status")
    for condition in newly_true(judged, before):
        if condition.type in (C.DEGRADED, C.INVALID):
            await rt.post_event(policy, "Warning", condition.reason, condition.message)
    for kind, reason, message in events:
        await rt.post_event(policy, kind, reason, message)


def _export(policy: builders.PolicyRef, spec: AdmissionPolicySpec, run: Pass, judged: list[Condition]) -> None:
    labels = (policy.namespace, policy.name)
    for condition in judged:
        metrics.condition.labels(*labels, condition.type.value).set(1 if condition.status else 0)
    report = run.report
    metrics.sidecars.labels(*labels, "targeted").set(report.targeted if report else 0)
    metrics.sidecars.labels(*labels, "acknowledged").set(len(report.acknowledged) if report else 0)
    alerting = spec.operator.alerting
    metrics.rejection_ratio.labels(*labels, "warning").set(alerting.rejection_ratio_warning)
    metrics.rejection_ratio.labels(*labels, "critical").set(alerting.rejection_ratio_critical)
    measured = parse_time((run.status.get("calibration") or {}).get("measuredAt"))
    if measured is not None:
        metrics.calibrated_at.labels(*labels).set(measured.timestamp())
