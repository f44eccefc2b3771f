"""A ClusterRole missing one permission is a condition on the policy, not a crash loop, and the
operator carries on once the permission is back: the real authorizer refuses the operator's
call (its ServiceAccount, the chart's ClusterRole), the running operator reports it.

Runs after test_lifecycle.py (which ends with its policy deleted); it applies the example's
policy again to the same workload, with `create` taken off the Jobs rule, so the first
calibration Job cannot be made.
"""

from __future__ import annotations

import json
from typing import Any

from cluster_tools import Kube, conditions_line, wait_until
from suite import APP_NAMESPACE, RELEASE_NAMESPACE, Example, apply_policy, seconds

OPERATOR_LOGS = f"kubectl -n {RELEASE_NAMESPACE} logs -l app.kubernetes.io/component=operator"


def operator_restarts(kube: Kube) -> int:
    pods = kube.json("-n", RELEASE_NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/component=operator",
                     hint="kubectl get pods")["items"]  # fmt: skip
    assert pods, "no operator pod"
    return sum(s.get("restartCount", 0) for p in pods for s in p["status"].get("containerStatuses") or ())


def without_job_creation(role: dict[str, Any]) -> dict[str, Any]:
    changed = json.loads(json.dumps(role))
    rules = [r for r in changed["rules"] if "batch" in r.get("apiGroups", ()) and "jobs" in r.get("resources", ())]
    assert len(rules) == 1, f"the chart's Jobs rules changed: {rules}"
    assert "create" in rules[0]["verbs"], f"the chart's Jobs rule changed: {rules}"
    rules[0]["verbs"] = [v for v in rules[0]["verbs"] if v != "create"]
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
        changed["metadata"].pop(key, None)
    return changed


def degraded_by_a_refusal(kube: Kube, example: Example) -> dict[str, Any] | None:
    """The policy's Degraded condition, once it names the server's 403."""
    policy = kube.maybe_json("-n", APP_NAMESPACE, "get", "admissionpolicy", example.policy) or {}
    for c in (policy.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Degraded" and c.get("status") == "True" and "forbidden" in c.get("message", "").lower():
            return dict(c)
    return None


def calibration_jobs(kube: Kube, example: Example) -> list[str]:
    jobs = kube.json("-n", APP_NAMESPACE, "get", "jobs", hint="kubectl get jobs")["items"]
    return [j["metadata"]["name"] for j in jobs
            if any(r["kind"] == "AdmissionPolicy" and r["name"] == example.policy
                   for r in j["metadata"].get("ownerReferences") or ())]  # fmt: skip


def test_a_missing_permission_is_a_condition_and_the_operator_recovers(
    kube: Kube, release: str, workload: Example
) -> None:
    example = workload
    kube("-n", APP_NAMESPACE, "delete", "admissionpolicy", example.policy, "--ignore-not-found",
         f"--timeout={int(seconds(300))}s", hint="the policy's finalizer", timeout_s=seconds(360))  # fmt: skip
    assert calibration_jobs(kube, example) == []
    role_name = f"{release}-operator"
    original = kube.json("get", "clusterrole", role_name, hint="the chart's ClusterRole")
    restarts = operator_restarts(kube)
    kube("replace", "-f", "-", input_text=json.dumps(without_job_creation(original)), hint="kubectl replace")
    try:
        apply_policy(kube, example)
        degraded = wait_until(
            "the policy says the Job could not be created (Forbidden)",
            lambda: degraded_by_a_refusal(kube, example),
            timeout_s=seconds(180),
            hint=OPERATOR_LOGS,
            describe=lambda: conditions_line(
                kube.maybe_json("-n", APP_NAMESPACE, "get", "admissionpolicy", example.policy)
            ),
        )
        assert "jobs" in degraded["message"], degraded
        assert calibration_jobs(kube, example) == []
        assert operator_restarts(kube) == restarts, "the operator restarted on a refused call"
    finally:
        restored = json.loads(json.dumps(original))
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            restored["metadata"].pop(key, None)
        kube("replace", "-f", "-", input_text=json.dumps(restored), hint="kubectl replace")
    try:
        jobs = wait_until(
            "a calibration Job, once the permission is back",
            lambda: calibration_jobs(kube, example),
            timeout_s=seconds(300),
            hint=OPERATOR_LOGS,
        )
        assert len(jobs) == 1, jobs
        assert operator_restarts(kube) == restarts
    finally:
        kube("-n", APP_NAMESPACE, "delete", "admissionpolicy", example.policy, "--ignore-not-found",
             f"--timeout={int(seconds(300))}s", hint="the policy's finalizer", timeout_s=seconds(360))  # fmt: skip
