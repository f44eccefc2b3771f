"""One reconcile pass of one AdmissionPolicy: level-triggered and idempotent.

Read the policy; validate its spec; find its Deployments and their llama.cpp
container fingerprints; keep the admin token Secret, the thresholds ConfigMap and the
gated pods' NetworkPolicy; inject (or remove) the sidecar; calibrate when the fingerprint has no profile yet;
derive thresholds when the profile or the policy changed; push them to every running
sidecar; write the status and post events for what went wrong. Every step reads
the cluster as it is now, so running a pass twice changes nothing the second time,
and a pass interrupted anywhere (operator restart) is simply run again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from slogate_admission.derivation import DerivationError, derive_thresholds
from slogate_admission.drain_token import drain_token
from slogate_admission.schema import CalibrationProfile
from slogate_operator import autoscalers, builders, fence, gating, jobs, names, outcome, stores, targets
from slogate_operator.calibration import JobState
from slogate_operator.client import DEPLOYMENTS, PODS, POLICIES, ApiError
from slogate_operator.context import Runtime
from slogate_operator.fingerprint import FINGERPRINT_VERSION, LlamaContainer, container_digest
from slogate_operator.push import PushReport, endpoints, thresholds_version
from slogate_operator.spec import AdmissionPolicySpec, SpecError, parse_spec
from slogate_operator.status import (
    Condition,
    ConditionType,
    DegradedError,
    calibration_summary,
    ready_condition,
    thresholds_summary,
)

C = ConditionType
log = logging.getLogger("slogate.operator")


@dataclass(frozen=True, slots=True)
class PassResult:
    """What the loop needs to know after a pass."""

    gone: bool = False
    """The policy no longer exists (or is being deleted): stop."""
    failed: bool = False
    """A step raised: the status says why (Degraded); the loop backs off."""
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
            for kind in (C.DEGRADED, C.CALIBRATED, C.THRESHOLDS_PUSHED, *autoscalers.kept(previous))
        ]
        judged = [ready_condition(judged), *judged]
        await outcome.publish(rt, policy, previous=previous, status=status, judged=judged, events=[])
        return PassResult()
    recalibrate = str((meta.get("annotations") or {}).get(names.ANNOTATION_RECALIBRATE) or "")
    run = Pass(rt, policy, spec, previous, recalibrate, {"observedGeneration": generation})
    failed = False
    try:
        await run.execute()
    except Exception as error:  # every failure reaches the status: "failures are visible, never silent"
        failed = True
        reason, message = outcome.failure_of(error)
        expected = isinstance(error, DegradedError | ApiError)  # said in full by the message: no traceback
        log.warning("reconcile of %s/%s failed: %s: %s", namespace, name, reason, message, exc_info=not expected)
        run.degraded.insert(0, (reason, message))
        # What the failed pass did not get to stays as the last pass saw it.
        kept = {k: v for k, v in previous.items() if k not in ("conditions", "observedGeneration")}
        run.status = kept | run.status
    judged = run.judge()
    await outcome.publish(rt, policy, previous=previous, status=run.status, judged=judged, events=run.events)
    outcome.export(policy, spec, judged, run.report, run.status)
    return PassResult(wake_at=run.wake_at, failed=failed)


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
    ungated: list[str] = field(default_factory=list)
    """Targets whose pods serve without the gate (targets.ungated): not Ready while any do."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    wake_at: datetime | None = None
    notes: list[str] = field(default_factory=list)
    latest: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """Deployments as this pass last wrote them (their new resourceVersion)."""
    autoscaling: autoscalers.AutoscalingReport | None = None

    async def execute(self) -> None:
        rt, policy = self.rt, self.policy
        deployments = await rt.client.list(DEPLOYMENTS, policy.namespace)
        scan = targets.scan(policy.name, self.spec, deployments, self.recalibrate or None)
        spec = self.spec
        rt.interests[(policy.namespace, policy.name)] = lambda d: targets.concerns(policy.name, spec, d)
        self.problems += scan.problems
        self.status["target"] = self.spec.target_text()
        self.status["targets"] = [t.name for t in scan.targets]
        token = await stores.ensure_token(rt.client, policy, rt.settings.admin_token_secret)
        stored = await stores.load_stored(rt.client, policy)
        # Claimed first, so no other policy calibrates or pushes to them; gated only once
        # thresholds exist (a sidecar without them could never become ready).
        drain = drain_token(token.encode())
        # The fence stands before any pod rolls onto the gate (fence.py).
        taken = await fence.keep(rt, policy, spec, scan.targets)
        if taken is not None:
            self.degraded.append(taken)
        await self.manage_targets(scan, gate=stored.thresholds is not None, drain=drain)
        key = self.calibration_key(scan)
        self.status["containerFingerprint"] = key
        await jobs.stop_obsolete(rt, policy, keep=key)
        stored, fresh = await self.calibrate(scan, key, stored)
        stored, fresh = self.derive(stored, fresh)
        if fresh:
            await stores.save_stored(rt.client, policy, stored)
            await self.manage_targets(scan, gate=stored.thresholds is not None, drain=drain)
        self.note_targets(scan, gated=stored.thresholds is not None)
        changed = self.previous.get("observedGeneration") != self.status["observedGeneration"]
        self.autoscaling = await autoscalers.step(
            rt, policy, spec, scan, self.previous, gated=bool(stored.thresholds), spec_changed=changed
        )
        self.status["autoscaling"] = self.autoscaling.status
        self.events += self.autoscaling.events
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
            self.degraded.append(
                (
                    "TargetsDiffer",
                    f"selected Deployments run different llama.cpp containers ({detail}); "
                    "a policy calibrates one model: use one policy per model",
                )
            )
            self.calibrated = Condition(C.CALIBRATED, False, "TargetsDiffer", detail)
            return None
        return scan.targets[0].fingerprint

    async def manage_targets(self, scan: targets.TargetScan, *, gate: bool, drain: str) -> None:
        """Claim every target; its pods onto the gate (``gate`` and inject) or off it; strays released."""
        done = await gating.gate_targets(
            self.rt, self.policy, self.spec, scan, gate=gate, drain=drain, latest=self.latest
        )
        self.latest.update(done.latest)
        self.problems += [p for p in done.problems if p not in self.problems]
        self.degraded += [d for d in done.degraded if d not in self.degraded]
        self.events += [e for e in done.events if e not in self.events]
        self.ungated = done.waiting  # the last call's: what is still to roll
        if done.wait_s is not None:
            soon = self.rt.clock() + timedelta(seconds=done.wait_s)
            self.wake_at = soon if self.wake_at is None else min(self.wake_at, soon)

    def note_targets(self, scan: targets.TargetScan, *, gated: bool) -> None:
        """What the status must say about the targets though nothing failed (``status.notes``)."""
        inject = self.spec.operator.sidecar.inject
        self.notes += [f"{gated}: the selector leaves it to that policy" for gated in scan.skipped]
        for target in scan.targets:
            self.notes += [f"Deployment {target.name}: {note}" for note in target.llama.notes()]
            if inject and not gated:
                self.notes.append(
                    f"Deployment {target.name} serves ungated until the first calibration has derived "
                    "thresholds; the sidecar is injected then"
                )
            if inject and target.llama.host() in LOOPBACK:
                self.notes.append(
                    f"Deployment {target.name}: llama-server listens on {target.llama.host()} only: without "
                    "the gate (before the first calibration, after removal) nothing answers on the pod IP"
                )
            if inject and gated and not _port_named(target.llama):
                self.notes.append(
                    f"Deployment {target.name}: llama-server's port {target.llama.port()} has no name to hand "
                    f"over: the sidecar's client port is named {names.CLIENT_PORT_NAME!r}; a Service targeting "
                    "it loses its endpoints when the gate is removed (name the port and target the name)"
                )
        if self.notes:
            self.status["notes"] = self.notes[:20]

    async def calibrate(
        self, scan: targets.TargetScan, key: str | None, stored: stores.StoredCalibration
    ) -> tuple[stores.StoredCalibration, bool]:
        """Advance the calibration of ``key`` if it has no profile; True when one just arrived."""
        profile = stored.profile
        if key is not None and profile is not None and stored.container_fingerprint != key and scan.targets:
            adopted = stores.adopt_across_versions(stored, key, scan.targets[0].llama)
            if adopted is not None:
                old = stored.fingerprint_version or "1"
                self.notes.append(
                    f"fingerprint v{old} -> v{FINGERPRINT_VERSION}: container as measured, {profile.id} kept"
                )
                self.calibrated = Condition(C.CALIBRATED, True, "Current", f"calibration {profile.id} of {key}")
                return adopted, True
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
                C.CALIBRATED,
                False,
                "Stale",
                f"the target changed (fingerprint {key}) but calibration.onRollout is false: "
                f"calibration {profile.id} stays in force (annotate {names.ANNOTATION_RECALIBRATE} to recalibrate)",
            )
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
            return self.calibrated_now(progress.profile, key, job, stored, container_digest(target.llama)), True
        self.status["calibrating"] = progress.record
        failure = progress.failure
        if failure:
            self.degraded.append((str(failure["reason"]), str(failure["message"])))
        if progress.state is JobState.FAILED and failure:
            self.calibrated = Condition(C.CALIBRATED, False, "CalibrationFailed", str(failure["message"]))
        elif progress.waiting is not None:
            why, detail = progress.waiting
            self.calibrated = Condition(C.CALIBRATED, False, why, f"Job {job} waits: {detail}")
        else:
            self.calibrated = Condition(C.CALIBRATED, False, "Calibrating", f"Job {job} is measuring fingerprint {key}")
        return stored, False

    def calibrated_now(
        self, profile: CalibrationProfile, key: str, job: str, stored: stores.StoredCalibration, digest: str
    ) -> stores.StoredCalibration:
        self.events.append(("Normal", "CalibrationSucceeded", f"calibration {profile.id} from Job {job}"))
        self.calibrated = Condition(C.CALIBRATED, True, "Current", f"calibration {profile.id} of {key}")
        return dataclasses.replace(
            stored, profile=profile, container_fingerprint=key, job=job, recalibrate=self.recalibrate,
            fingerprint_version=FINGERPRINT_VERSION, container_digest=digest,
        )  # fmt: skip

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
        budget = int(derived.default_class_thresholds.token_budget)
        self.events.append(
            (
                "Normal",
                "ThresholdsDerived",
                f"thresholds of calibration {profile.id}: token budget {budget}, "
                f"concurrency cap {derived.concurrency_cap}",
            )
        )
        return dataclasses.replace(stored, thresholds=derived, policy_digest=digest), True

    async def push(self, scan: targets.TargetScan, stored: stores.StoredCalibration, token: str) -> PushReport:
        """Report who serves the thresholds in force; push to the rest in the background."""
        assert stored.thresholds is not None
        sidecar = self.spec.operator.sidecar
        pods: dict[str, Mapping[str, Any]] = {}
        if sidecar.inject:
            # One server-side filtered list: injected pods carry the policy's label.
            label = builders.policy_label_value(self.policy.name)
            query = f"{names.LABEL_POLICY}={label}"
            for pod in await self.rt.client.list(PODS, self.policy.namespace, label_selector=query):
                if (pod["metadata"].get("labels") or {}).get(names.LABEL_POLICY) == label:
                    pods[pod["metadata"]["name"]] = pod
        else:
            for target in scan.targets:
                query, matches = targets.pod_selector(target.deployment)
                for pod in await self.rt.client.list(PODS, self.policy.namespace, label_selector=query or None):
                    if matches(pod):
                        pods[pod["metadata"]["name"]] = pod
        if sidecar.inject:  # without injection the user runs the gate: its pods are not told apart
            self.ungated += targets.ungated([t.deployment for t in scan.targets], list(pods.values()))
        found = endpoints(list(pods.values()), sidecar.admin_port, injected=sidecar.inject)
        tracker = self.rt.push_tracker(self.policy.namespace, self.policy.name)
        tracker.start(
            self.rt.http,
            found,
            stored.thresholds,
            token,
            self.rt.push_settings,
            done=lambda: self.rt.poke(self.policy.namespace, self.policy.name),
        )
        report = tracker.report(found, thresholds_version(stored.thresholds))
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
        elif self.ungated:
            pushed = Condition(C.THRESHOLDS_PUSHED, False, "UngatedPods", "; ".join(self.ungated))
        elif report.complete:
            calibration = self.status["thresholds"]["calibrationId"]
            text = f"{report.text} running sidecars serve calibration {calibration}"
            pushed = Condition(C.THRESHOLDS_PUSHED, True, "AllAcknowledged", text)
        else:
            behind = "; ".join(f"{pod}: {why}" for pod, why in report.behind[:3])
            pushed = Condition(C.THRESHOLDS_PUSHED, False, "PushPending", f"{report.text} acknowledged; {behind}")
        judged = [invalid, degraded, calibrated, pushed]
        return [ready_condition(judged), *judged, *autoscalers.conditions(self.autoscaling, self.previous)]


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def _port_named(llama: LlamaContainer) -> bool:
    """Whether llama-server's port has a name for the sidecar to take over."""
    ports = llama.container.get("ports") or ()
    return any(p.get("containerPort") == llama.port() and p.get("name") for p in ports)
