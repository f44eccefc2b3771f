"""One reconcile pass of one AdmissionPolicy: level-triggered and idempotent.

Read the policy; validate its spec; find its Deployments and their llama.cpp
container fingerprints; keep the admin token Secret, the thresholds ConfigMap and the
gated pods' NetworkPolicy; inject (or remove) the sidecar; calibrate when the fingerprint has no profile yet;
derive thresholds when the profile or the policy changed; push them to every running
sidecar; write the status and post events for what went wrong. Every step reads
the cluster as it is now, so running a pass twice changes nothing the second time,
and a pass interrupted anywhere (operator restart) is simply run again.

Each step returns what it decided (``outcome.Decision``); the pass folds the decisions into
the status, the conditions, the events and its next wake-up (``outcome.fold``, ``judge``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from slogate_admission.derivation import DerivationError, derive_thresholds
from slogate_admission.drain_token import drain_token
from slogate_operator import autoscalers, builders, fence, gating, jobs, names, outcome, stores, targets
from slogate_operator.calibration import JobState
from slogate_operator.client import DEPLOYMENTS, PODS, POLICIES, ApiError
from slogate_operator.context import Runtime
from slogate_operator.fingerprint import FINGERPRINT_VERSION, LlamaContainer, container_digest
from slogate_operator.outcome import Decision
from slogate_operator.push import endpoints, thresholds_version
from slogate_operator.selectors import labelled
from slogate_operator.spec import AdmissionPolicySpec, SpecError, parse_spec
from slogate_operator.status import Condition, ConditionType, DegradedError, calibration_summary, thresholds_summary

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
    decided: list[Decision] = []
    failure: tuple[str, str] | None = None
    try:
        spec: AdmissionPolicySpec | None = parse_spec(body.get("spec"))
    except SpecError as error:
        spec = None  # judged like any pass, and what is in force stays in force
        decided.append(Decision(spec_error=str(error)))
    if spec is not None:
        recalibrate = str((meta.get("annotations") or {}).get(names.ANNOTATION_RECALIBRATE) or "")
        run = Pass(rt, policy, spec, previous, recalibrate, previous.get("observedGeneration") != generation)
        try:
            async for decision in run.steps():
                decided.append(decision)
        except Exception as error:  # every failure reaches the status: "failures are visible, never silent"
            failure = outcome.failure_of(error)
            expected = isinstance(error, DegradedError | ApiError)  # said in full by the message: no traceback
            log.warning("reconcile of %s/%s failed: %s: %s", namespace, name, *failure, exc_info=not expected)
    folded = outcome.fold(previous, generation, decided, failure)
    judged = outcome.judge(folded, previous)
    await outcome.publish(rt, policy, previous=previous, status=folded.status, judged=judged, events=folded.events)
    if spec is not None:
        outcome.export(policy, spec, judged, folded.report, folded.status)
    return PassResult(wake_at=folded.wake_at, failed=failure is not None)


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the calibration and derivation steps decided, and the calibration they leave."""

    decision: Decision
    stored: stores.StoredCalibration
    fresh: bool
    """It changed in this pass: to be saved."""
    notes: tuple[str, ...] = ()
    """For ``status.notes``, which the notes step writes."""


@dataclass(frozen=True, slots=True)
class Pass:
    """The steps of a pass over a valid spec, and what they all read."""

    rt: Runtime
    policy: builders.PolicyRef
    spec: AdmissionPolicySpec
    previous: Mapping[str, Any]
    recalibrate: str
    spec_changed: bool
    """The first pass over this generation of the spec."""

    async def steps(self) -> AsyncIterator[Decision]:
        """Each step's decision, in order. One that raises ends the pass; the decisions before it stand."""
        rt, policy = self.rt, self.policy
        scan = await self.scan()
        yield Decision(
            status={"target": self.spec.target_text(), "targets": [t.name for t in scan.targets]},
            problems=scan.problems,
        )
        token = await stores.ensure_token(rt.client, policy, rt.settings.admin_token_secret)
        stored = await stores.load_stored(rt.client, policy)
        drain = drain_token(token.encode())
        # The fence stands before any pod rolls onto the gate (fence.py).
        taken = await fence.keep(rt, policy, self.spec, scan.targets)
        yield Decision(degraded=(taken,) if taken is not None else ())
        # Claimed first, so no other policy calibrates or pushes to them; gated only once
        # thresholds exist (a sidecar without them could never become ready).
        gated, latest = await self.gate(scan, gate=stored.thresholds is not None, drain=drain, latest={})
        yield gated
        key, keyed = self.calibration_key(scan)
        yield keyed
        await jobs.stop_obsolete(rt, policy, keep=key)
        calibration = await self.calibrate(scan, key, stored)
        yield calibration.decision
        derived = self.derive(calibration.stored, calibration.fresh)
        yield derived.decision
        stored = derived.stored
        if derived.fresh:
            await stores.save_stored(rt.client, policy, stored)
            again, _ = await self.gate(scan, gate=stored.thresholds is not None, drain=drain, latest=latest)
            yield again
        yield self.notes(scan, gated=stored.thresholds is not None, found=calibration.notes)
        serving = stored.thresholds is not None and bool(scan.targets)
        pods = await self.pods(scan) if serving else {}
        yield await self.autoscale(scan, gated=bool(stored.thresholds), pods=list(pods.values()))
        yield in_force(policy, stored)
        if serving:
            yield await self.push(scan, stored, token, pods)

    async def scan(self) -> targets.TargetScan:
        """The namespace's Deployments as the policy sees them; changes to those it concerns wake it."""
        rt, policy, spec = self.rt, self.policy, self.spec
        deployments = await rt.client.list(DEPLOYMENTS, policy.namespace)
        scan = targets.scan(policy.name, spec, deployments, self.recalibrate or None)
        rt.interests[(policy.namespace, policy.name)] = lambda d: targets.concerns(policy.name, spec, d)
        return scan

    async def gate(
        self, scan: targets.TargetScan, *, gate: bool, drain: str, latest: Mapping[str, Mapping[str, Any]]
    ) -> tuple[Decision, Mapping[str, Mapping[str, Any]]]:
        """Claim every target; its pods onto the gate (``gate`` and inject) or off it; strays released.
        With the Deployments as written (``latest``: their resourceVersion, for a second call)."""
        done = await gating.gate_targets(self.rt, self.policy, self.spec, scan, gate=gate, drain=drain, latest=latest)
        soon = self.rt.clock() + timedelta(seconds=done.wait_s) if done.wait_s is not None else None
        decision = Decision(
            problems=done.problems, degraded=done.degraded, events=done.events, rolling=done.waiting, wake_at=soon
        )
        return decision, {**latest, **done.latest}

    def calibration_key(self, scan: targets.TargetScan) -> tuple[str | None, Decision]:
        """The one container fingerprint of the targets, or None (and why) if there is none."""
        if not scan.targets:
            where = f"in namespace {self.policy.namespace}"
            missing = ("TargetNotFound", f"no Deployment {self.spec.target_text()} {where}")
            return None, Decision(
                status={"containerFingerprint": None},
                degraded=() if scan.problems else (missing,),
                calibrated=Condition(C.CALIBRATED, False, "NoTarget", "no usable target Deployment"),
            )
        if len(scan.fingerprints) > 1:
            detail = ", ".join(f"{t.name}={t.fingerprint}" for t in scan.targets)
            differ = (
                "TargetsDiffer",
                f"selected Deployments run different llama.cpp containers ({detail}); "
                "a policy calibrates one model: use one policy per model",
            )
            return None, Decision(
                status={"containerFingerprint": None},
                degraded=(differ,),
                calibrated=Condition(C.CALIBRATED, False, "TargetsDiffer", detail),
            )
        key = scan.targets[0].fingerprint
        return key, Decision(status={"containerFingerprint": key})

    async def calibrate(
        self, scan: targets.TargetScan, key: str | None, stored: stores.StoredCalibration
    ) -> Calibration:
        """Advance the calibration of ``key`` if it has no profile; ``fresh`` when one just arrived."""
        profile = stored.profile
        if key is not None and profile is not None and stored.container_fingerprint != key and scan.targets:
            adopted = stores.adopt_across_versions(stored, key, scan.targets[0].llama)
            if adopted is not None:
                old = stored.fingerprint_version or "1"
                note = f"fingerprint v{old} -> v{FINGERPRINT_VERSION}: container as measured, {profile.id} kept"
                return Calibration(Decision(calibrated=current(profile.id, key)), adopted, True, (note,))
        if key is None or (profile is not None and stored.container_fingerprint == key):
            in_hand = current(profile.id, key) if key is not None and profile is not None else None
            return Calibration(Decision(calibrated=in_hand), stored, False)
        if (
            profile is not None
            and not self.spec.operator.calibration.on_rollout
            and (stored.recalibrate == self.recalibrate)
        ):
            stale = Condition(
                C.CALIBRATED,
                False,
                "Stale",
                f"the target changed (fingerprint {key}) but calibration.onRollout is false: "
                f"calibration {profile.id} stays in force (annotate {names.ANNOTATION_RECALIBRATE} to recalibrate)",
            )
            return Calibration(Decision(calibrated=stale), stored, False)
        target = scan.targets[0]
        progress = await jobs.advance(
            self.rt, self.policy, spec=self.spec, target=target, key=key, previous=self.previous.get("calibrating")
        )
        job = names.calibration_job_name(self.policy.name, key)
        started = f"Job {job} calibrates Deployment {target.name}"
        events = (("Normal", "CalibrationStarted", started),) if progress.started else ()
        if progress.state is JobState.SUCCEEDED and progress.profile is not None:
            measured = progress.profile
            done = ("Normal", "CalibrationSucceeded", f"calibration {measured.id} from Job {job}")
            stored = dataclasses.replace(
                stored, profile=measured, container_fingerprint=key, job=job, recalibrate=self.recalibrate,
                fingerprint_version=FINGERPRINT_VERSION, container_digest=container_digest(target.llama),
            )  # fmt: skip
            decision = Decision(events=(*events, done), calibrated=current(measured.id, key), wake_at=progress.wake_at)
            return Calibration(decision, stored, True)
        failure = progress.failure
        if progress.state is JobState.FAILED and failure:
            calibrated = Condition(C.CALIBRATED, False, "CalibrationFailed", str(failure["message"]))
        elif progress.waiting is not None:
            why, detail = progress.waiting
            calibrated = Condition(C.CALIBRATED, False, why, f"Job {job} waits: {detail}")
        else:
            calibrated = Condition(C.CALIBRATED, False, "Calibrating", f"Job {job} is measuring fingerprint {key}")
        decision = Decision(
            status={"calibrating": progress.record},
            degraded=((str(failure["reason"]), str(failure["message"])),) if failure else (),
            events=events,
            calibrated=calibrated,
            wake_at=progress.wake_at,
        )
        return Calibration(decision, stored, False)

    def derive(self, stored: stores.StoredCalibration, fresh: bool) -> Calibration:
        """New thresholds when the profile or the policy changed; the old stay on failure."""
        profile, thresholds = stored.profile, stored.thresholds
        digest = stores.policy_digest(self.spec.policy)
        if profile is None or not (
            fresh or thresholds is None or thresholds.calibration_id != profile.id or stored.policy_digest != digest
        ):
            return Calibration(Decision(), stored, fresh)
        try:
            derived = derive_thresholds(self.spec.policy, profile, derived_at=self.rt.clock())
        except DerivationError as error:
            unattainable = ("SLOUnattainable", f"calibration {profile.id}: {error}")
            return Calibration(Decision(degraded=(unattainable,)), stored, fresh)
        budget, cap = int(derived.default_class_thresholds.token_budget), derived.concurrency_cap
        text = f"thresholds of calibration {profile.id}: token budget {budget}, concurrency cap {cap}"
        derived_event = ("Normal", "ThresholdsDerived", text)
        stored = dataclasses.replace(stored, thresholds=derived, policy_digest=digest)
        return Calibration(Decision(events=(derived_event,)), stored, True)

    def notes(self, scan: targets.TargetScan, *, gated: bool, found: tuple[str, ...]) -> Decision:
        """What the status must say though nothing failed (``status.notes``): ``found`` by
        earlier steps, and what the targets need to know."""
        inject = self.spec.operator.sidecar.inject
        notes = [*found, *(f"{other}: the selector leaves it to that policy" for other in scan.skipped)]
        for target in scan.targets:
            notes += [f"Deployment {target.name}: {note}" for note in target.llama.notes()]
            if inject and not gated:
                notes.append(
                    f"Deployment {target.name} serves ungated until the first calibration has derived "
                    "thresholds; the sidecar is injected then"
                )
            if inject and target.llama.host() in LOOPBACK:
                notes.append(
                    f"Deployment {target.name}: llama-server listens on {target.llama.host()} only: without "
                    "the gate (before the first calibration, after removal) nothing answers on the pod IP"
                )
            if inject and gated and not _port_named(target.llama):
                notes.append(
                    f"Deployment {target.name}: llama-server's port {target.llama.port()} has no name to hand "
                    f"over: the sidecar's client port is named {names.CLIENT_PORT_NAME!r}; a Service targeting "
                    "it loses its endpoints when the gate is removed (name the port and target the name)"
                )
        return Decision(status={"notes": notes[:20]}) if notes else Decision()

    async def autoscale(self, scan: targets.TargetScan, *, gated: bool, pods: Sequence[Mapping[str, Any]]) -> Decision:
        report = await autoscalers.step(
            self.rt, self.policy, self.spec, scan, self.previous, gated=gated, spec_changed=self.spec_changed,
            pods=pods,
        )  # fmt: skip
        judged = (report.condition,) if report.condition is not None else ()
        return Decision(status={"autoscaling": report.status}, events=tuple(report.events), autoscaling=judged)

    async def pods(self, scan: targets.TargetScan) -> dict[str, Mapping[str, Any]]:
        """The targets' pods by name."""
        rt, policy, sidecar = self.rt, self.policy, self.spec.operator.sidecar
        pods: dict[str, Mapping[str, Any]] = {}
        # Injected pods carry the policy's label: one list for all. Without injection the user's
        # pods are found by each target's own selector. The server filters; we filter again.
        wanted = (
            [labelled(names.LABEL_POLICY, builders.policy_label_value(policy.name))]
            if sidecar.inject
            else [targets.pod_selector(target.deployment) for target in scan.targets]
        )
        for selector in wanted:
            for pod in await rt.client.list(PODS, policy.namespace, label_selector=selector.query() or None):
                # A calibration Job's pod carries the policy's label too; it serves nothing.
                if selector.selects(pod) and not builders.is_calibration_pod(pod):
                    pods[pod["metadata"]["name"]] = pod
        return pods

    async def push(
        self,
        scan: targets.TargetScan,
        stored: stores.StoredCalibration,
        token: str,
        pods: Mapping[str, Mapping[str, Any]],
    ) -> Decision:
        """Report who serves the thresholds in force (``pods``: the targets'); push to the rest in the background."""
        assert stored.thresholds is not None
        rt, policy, sidecar = self.rt, self.policy, self.spec.operator.sidecar
        # Without injection the user runs the gate: its pods are not told apart.
        ungated = targets.ungated([t.deployment for t in scan.targets], list(pods.values())) if sidecar.inject else []
        found = endpoints(list(pods.values()), sidecar.admin_port, injected=sidecar.inject)
        tracker = rt.push_tracker(policy.namespace, policy.name)
        tracker.start(
            rt.http,
            found,
            stored.thresholds,
            token,
            rt.push_settings,
            done=lambda: rt.poke(policy.namespace, policy.name),
        )
        report = tracker.report(found, thresholds_version(stored.thresholds))
        sidecars = {
            "targeted": report.targeted,
            "acknowledged": len(report.acknowledged),
            "behind": [{"pod": pod, "reason": why[:300]} for pod, why in report.behind[:10]],
        }
        return Decision(status={"pushed": report.text, "sidecars": sidecars}, ungated=tuple(ungated), report=report)


def current(profile_id: str, key: str) -> Condition:
    """Calibrated: the profile in force measured the container the targets run."""
    return Condition(C.CALIBRATED, True, "Current", f"calibration {profile_id} of {key}")


def in_force(policy: builders.PolicyRef, stored: stores.StoredCalibration) -> Decision:
    """The status's summaries of the calibration and thresholds in force."""
    status: dict[str, Any] = {}
    if stored.profile is not None:
        status["calibration"] = calibration_summary(stored.profile, stored.container_fingerprint or "", stored.job)
    if stored.thresholds is not None:
        status["thresholds"] = thresholds_summary(stored.thresholds, names.thresholds_configmap_name(policy.name))
    return Decision(status=status)


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def _port_named(llama: LlamaContainer) -> bool:
    """Whether llama-server's port has a name for the sidecar to take over."""
    ports = llama.container.get("ports") or ()
    return any(p.get("containerPort") == llama.port() and p.get("name") for p in ports)
