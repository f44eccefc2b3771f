"""An operator upgrade across two versions on the real cluster, with the real helm: the
release rolled back to the previous version (operator_releases.py: the last one that
injected the sidecar into the Deployment's pod template), which takes over the workload
the current version gated at pod admission, and then upgraded again, which migrates the
Deployment back to admission injection in one rollout.

Runs after test_lifecycle.py, which ends with its policy deleted, and leaves the cluster as
it found it (the current release; the policy deleted again if it was absent), so the
modules after it (test_permissions.py) meet the release they expect. Each step depends on
the last (conftest skips the rest after a failure); the module's fixture restores the
current release whatever happened.

Throughout, a watch of the target's pods (PodHistory) records every version of every pod
the API server stored: no pod may ever be Ready without the gate. Counts and states only:
rollouts by the Deployment's revision, ReplicaSets by name, calibrations by the Jobs and by
the operator's `create jobs` calls in the API server's audit log.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster_tools import Kube, wait_until
from operator_releases import (
    PodHistory,
    Release,
    calibration_jobs,
    current_release,
    helm_upgrade,
    operator_images,
    policy_events,
    previous_release,
    revision,
    webhook_entries,
)
from suite import APP_NAMESPACE, REPO, Example, apply_policy, seconds
from workload_state import (
    GATE,
    INJECTION_RECORD,
    OPERATOR_LOGS,
    SIDECAR,
    Availability,
    assert_handed_over,
    audit_mark,
    container,
    container_names,
    deployment_of,
    describe_policy,
    operator_calls,
    owned_by_the_policy,
    policy_of,
    ready_policy,
    replica_sets,
    rolled_out,
    served_by_the_gate,
)

from slogate_operator.fingerprint import FINGERPRINT_VERSION

STEPS_DEPEND_ON_EACH_OTHER = True


class Observed:
    """What the steps pass on to each other."""

    previous: Release
    history: PodHistory
    calibration = ""
    jobs: frozenset[str] = frozenset()
    audit = 0


@pytest.fixture(scope="module")
def gated(kube: Kube, workload: Example) -> Iterator[Example]:
    """The workload gated by the current release; afterwards, the current release again and
    the policy gone if it was absent before (whatever the steps left)."""
    example = workload
    had_policy = policy_of(kube, example) is not None
    with tempfile.TemporaryDirectory(prefix="slogate-previous-") as workdir:
        Observed.previous = previous_release(Path(workdir))
        Observed.history = PodHistory(kube, example.selector)
        try:
            yield example
        finally:
            Observed.history.stop()
            if set(operator_images(kube)) != {current_release().image}:
                helm_upgrade(kube, current_release())
            if not had_policy:
                kube("-n", APP_NAMESPACE, "delete", "admissionpolicy", example.policy, "--ignore-not-found",
                     f"--timeout={int(seconds(300))}s", hint=OPERATOR_LOGS, timeout_s=seconds(360))  # fmt: skip
                wait_until(
                    f"Deployment {example.deployment} rolled out without the sidecar (as the module found it)",
                    lambda: rolled_out(kube, example, with_sidecar=False),
                    timeout_s=seconds(600),
                    hint=OPERATOR_LOGS,
                )
                # The next module counts the policy's Jobs from zero: the garbage collector's turn first.
                wait_until(
                    "the garbage collector removed what the policy owned",
                    lambda: not owned_by_the_policy(kube, example),
                    timeout_s=seconds(180),
                    hint="kube-controller-manager's garbage collector",
                )


def settled(kube: Kube, example: Example, image: str, *, template_injected: bool) -> list[dict[str, Any]] | None:
    """The target's pods once every operator pod runs `image`, the Deployment's template is
    injected as that release does (the sidecar in it, or only the gate annotation), the
    rollout is over with every pod gated by a sidecar of `image`, and the policy is Ready."""
    images = operator_images(kube)
    if not images or set(images) != {image}:
        return None
    template = deployment_of(kube, example)["spec"]["template"]
    annotations = template["metadata"].get("annotations") or {}
    if (SIDECAR in container_names(template)) != template_injected or (INJECTION_RECORD in annotations) != (
        template_injected
    ):
        return None
    pods = rolled_out(kube, example, with_sidecar=True)
    if not pods or any(container(p, SIDECAR)["image"] != image for p in pods):
        return None
    return pods if ready_policy(kube, example) else None


def fingerprint_version_of(commit: str) -> str:
    """FINGERPRINT_VERSION in that commit's operator (the algorithm's version)."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:operator/slogate_operator/fingerprint.py"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    (line,) = [line for line in source.splitlines() if line.startswith("FINGERPRINT_VERSION")]
    return line.split("=", 1)[1].strip().strip("\"'")


def deployment_patches(kube: Kube, example: Example, *, since: int) -> list[dict[str, str]]:
    """The operators' writes to the target Deployment since `since` (both releases run as the
    chart's ServiceAccount: the audit log cannot tell them apart)."""
    return [c for c in operator_calls(kube, since=since) if c["resource"] == "deployments"
            and c["verb"] in ("patch", "update") and c["name"] == example.deployment]  # fmt: skip


def rollouts(kube: Kube, example: Example) -> tuple[int, set[str]]:
    return revision(deployment_of(kube, example)), replica_sets(kube, example)


@dataclass
class Upgraded:
    """What one `helm upgrade` did to the target: its pods once settled, and its rollouts."""

    pods: list[dict[str, Any]]
    revisions: tuple[int, int]
    """The Deployment's revision before and after: one apart for one rollout."""
    new_sets: set[str]
    patches: list[dict[str, str]]
    availability: Availability


def upgrade(kube: Kube, example: Example, release: Release, *, template_injected: bool, what: str) -> Upgraded:
    """`helm upgrade` to `release`, then wait until its operator has settled the target (`what`)."""
    revision_before, sets_before = rollouts(kube, example)
    mark = audit_mark(kube)
    availability = Availability(kube, example)
    helm_upgrade(kube, release)
    pods = wait_until(
        what,
        availability.watching(lambda: settled(kube, example, release.image, template_injected=template_injected)),
        timeout_s=seconds(900),
        hint=f"kubectl -n {APP_NAMESPACE} get deployment {example.deployment} -o yaml; {OPERATOR_LOGS}",
        describe=lambda: f"{describe_policy(kube, example)}; operator images {operator_images(kube)}",
    )
    revision_after, sets_after = rollouts(kube, example)
    return Upgraded(pods, (revision_before, revision_after), sets_after - sets_before,
                    deployment_patches(kube, example, since=mark), availability)  # fmt: skip


class TestAnOperatorUpgradeAcrossTwoVersions:
    def test_the_current_release_gates_the_workload_at_admission(self, kube: Kube, gated: Example) -> None:
        example = gated
        apply_policy(kube, example)
        pods = wait_until(
            "the current release gates the workload: Ready, every pod with its sidecar",
            lambda: settled(kube, example, current_release().image, template_injected=False),
            timeout_s=seconds(1200),
            hint=f"kubectl -n {APP_NAMESPACE} get jobs,pods; {OPERATOR_LOGS}",
            describe=lambda: describe_policy(kube, example),
        )
        template = deployment_of(kube, example)["spec"]["template"]
        assert GATE in (template["metadata"].get("annotations") or {}), "admission injection: the gate annotation"
        assert webhook_entries(kube), "the current release gates through its webhook: no entry"
        policy = policy_of(kube, example)
        assert policy is not None
        Observed.calibration = policy["status"]["calibration"]["id"]
        Observed.jobs = frozenset(calibration_jobs(kube, example))
        assert Observed.jobs, "no calibration Job of the policy"
        Observed.audit = audit_mark(kube)
        served_by_the_gate(kube, example, Observed.calibration)
        assert len(pods) == example.replicas
        # From here on, every version of every pod is judged: all of them are gated now.
        Observed.history.start()

    def test_a_rollback_to_the_previous_release_keeps_every_pod_gated(
        self, kube: Kube, gated: Example, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`helm upgrade` to the previous chart and image: the chart's webhook configuration
        goes with the rollback, and the previous operator puts the sidecar into the template."""
        example = gated
        previous = Observed.previous
        done = upgrade(kube, example, previous, template_injected=True, what=f"the previous release "
                       f"({previous.image}) took over: the sidecar in the template, pods rolled, Ready")  # fmt: skip
        assert webhook_entries(kube) is None, "the rollback left the webhook configuration (no release serves it)"
        (before, after), pods, availability = done.revisions, done.pods, done.availability
        with capsys.disabled():  # the measurement, in the run's output
            print(f"\nrollback to {previous.image}: revision {before} -> {after}, new ReplicaSets "
                  f"{sorted(done.new_sets)}, Deployment patches {len(done.patches)}; "
                  f"{Observed.history.summary()}")  # fmt: skip
        assert after - before == 1, "the previous operator's template injection is one rollout"
        availability.check("the rollback")
        assert Observed.history.ungated_ready == [], f"pods Ready without the gate: {Observed.history.summary()}"
        policy = policy_of(kube, example)
        assert policy is not None
        assert policy["status"]["calibration"]["id"] == Observed.calibration, "the rollback recalibrated"
        for pod in pods:
            assert_handed_over(pod, example)
        served_by_the_gate(kube, example, Observed.calibration)

    def test_the_upgrade_back_migrates_in_one_rollout_without_recalibrating(
        self, kube: Kube, gated: Example, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`helm upgrade` to the current chart and image: the chart's webhook configuration
        again, and the operator migrates the template-injected Deployment in one rollout."""
        example = gated
        current = current_release()
        done = upgrade(kube, example, current, template_injected=False, what="the current release migrated the "
                       "Deployment: no sidecar in the template, pods gated at admission, Ready")  # fmt: skip
        (before, after), pods, availability = done.revisions, done.pods, done.availability
        created = [c["name"] for c in operator_calls(kube, since=Observed.audit)
                   if (c["verb"], c["resource"]) == ("create", "jobs")]  # fmt: skip
        jobs = calibration_jobs(kube, example)
        versions = (fingerprint_version_of(Observed.previous.name), FINGERPRINT_VERSION)
        with capsys.disabled():  # the measurement, in the run's output
            print(f"\nupgrade back to {current.image}: revision {before} -> {after}, new "
                  f"ReplicaSets {sorted(done.new_sets)}, Deployment patches {len(done.patches)}; "
                  f"calibration Jobs {sorted(Observed.jobs)} -> {sorted(jobs)}, created since the first step "
                  f"{created}; fingerprint versions {versions[0]} -> {versions[1]}; "
                  f"{Observed.history.summary()}")  # fmt: skip
        assert after - before == 1, "the migration is one rollout"
        availability.check("the migration")
        assert len(done.new_sets) <= 1, f"ReplicaSets made: {sorted(done.new_sets)}"
        template = deployment_of(kube, example)["spec"]["template"]
        assert GATE in (template["metadata"].get("annotations") or {})
        assert INJECTION_RECORD not in (template["metadata"].get("annotations") or {})
        assert webhook_entries(kube), "the upgraded release's webhook configuration has no entry for the target"
        migrated = policy_events(kube, example, "SidecarMigrated")
        assert any(example.deployment in m for m in migrated), f"no SidecarMigrated event: {migrated}"
        assert Observed.history.ungated_ready == [], f"pods Ready without the gate: {Observed.history.summary()}"
        for pod in pods:  # gated at admission: the current sidecar, the port name handed over
            assert container(pod, SIDECAR)["image"] == current.image
            assert_handed_over(pod, example)
        policy = policy_of(kube, example)
        assert policy is not None
        # The container did not change, so neither release measured it again (the same
        # fingerprint algorithm, and a stored digest that matches if it were not).
        assert created == [], f"calibration Jobs created across the two upgrades: {created}"
        assert jobs == Observed.jobs
        assert policy["status"]["calibration"]["id"] == Observed.calibration
        served_by_the_gate(kube, example, Observed.calibration)
