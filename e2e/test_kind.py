"""slogate on a real cluster, in the order a platform team meets it: install, apply a policy,
calibration and Ready, overload shed with 429 + Retry-After and counted in the metrics, a
rollout with a new thread count recalibrated into every sidecar, the policy deleted and the
sidecar gone. Each step depends on the previous ones (conftest skips the rest after a
failure and dumps the cluster's state)."""

from __future__ import annotations

import json
import random
from typing import Any

from cluster_tools import (
    Kube,
    Reply,
    burst,
    conditions_line,
    http,
    is_true,
    metric_sum,
    port_forward,
    retry_after_seconds,
    wait_until,
)
from suite import APP_NAMESPACE, RELEASE_NAMESPACE, Example, seconds

SIDECAR = "slogate-sidecar"
ADMIN_PORT = 8082
OPERATOR_LOGS = f"kubectl -n {RELEASE_NAMESPACE} logs -l app.kubernetes.io/component=operator"


def policy_of(kube: Kube, example: Example) -> dict[str, Any] | None:
    return kube.maybe_json("-n", APP_NAMESPACE, "get", "admissionpolicy", example.policy)


def running_pods(kube: Kube, example: Example) -> list[dict[str, Any]]:
    """The Deployment's pods that are not on their way out."""
    pods = kube.json("-n", APP_NAMESPACE, "get", "pods", "-l", example.selector, hint="kubectl get pods")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def container_names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"]["containers"]]


def all_ready(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all(s.get("ready") for s in statuses)


def rolled_out(kube: Kube, example: Example, *, with_sidecar: bool) -> list[dict[str, Any]] | None:
    """The pods, once the Deployment's rollout finished with (or without) the sidecar."""
    deployment = kube.json("-n", APP_NAMESPACE, "get", "deployment", example.deployment, hint="kubectl get deploy")
    status, spec = deployment.get("status", {}), deployment["spec"]
    done = (
        status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
        and status.get("updatedReplicas") == spec["replicas"] == status.get("readyReplicas")
        and status.get("replicas") == spec["replicas"]
    )
    pods = running_pods(kube, example)
    if not done or len(pods) != spec["replicas"] or not all(all_ready(p) for p in pods):
        return None
    if any((SIDECAR in container_names(p)) != with_sidecar for p in pods):
        return None
    return pods


def sidecar_state(kube: Kube, pod: str) -> dict[str, Any]:
    """GET /slogate/v1/state from one pod's sidecar admin port."""
    hint = f"kubectl -n {APP_NAMESPACE} logs {pod} -c {SIDECAR}"
    with port_forward(kube, APP_NAMESPACE, f"pod/{pod}", ADMIN_PORT, hint=hint) as url:
        reply = http("GET", url + "/slogate/v1/state", timeout_s=30)
    assert reply.status == 200, f"{pod}: state answered {reply.status}: {reply.body[:300]!r}. Look at: {hint}"
    state: dict[str, Any] = reply.json()
    return state


def enforcing(kube: Kube, pod: str, calibration: str) -> dict[str, Any] | None:
    """The sidecar's state once it enforces that calibration."""
    state = sidecar_state(kube, pod)
    return state if state["calibrationId"] == calibration else None


def sidecar_metrics(kube: Kube, pod: str) -> str:
    hint = f"kubectl -n {APP_NAMESPACE} logs {pod} -c {SIDECAR}"
    with port_forward(kube, APP_NAMESPACE, f"pod/{pod}", ADMIN_PORT, hint=hint) as url:
        reply = http("GET", url + "/metrics", timeout_s=30)
    assert reply.status == 200, f"{pod}: /metrics answered {reply.status}. Look at: {hint}"
    return reply.body.decode()


def ready_policy(kube: Kube, example: Example, *, other_than: str | None = None) -> dict[str, Any] | None:
    """The policy once Ready with every replica acknowledged (and a calibration other than `other_than`)."""
    policy = policy_of(kube, example)
    if policy is None or not is_true(policy, "Ready") or not is_true(policy, "Calibrated"):
        return None
    status = policy["status"]
    if status.get("pushed") != f"{example.replicas}/{example.replicas}":
        return None
    calibration = (status.get("calibration") or {}).get("id")
    if calibration is None or calibration == other_than:
        return None
    return policy


def describe_policy(kube: Kube, example: Example) -> str:
    policy = policy_of(kube, example)
    pushed = (policy or {}).get("status", {}).get("pushed")
    return f"{conditions_line(policy)}; pushed {pushed}"


class TestSlogateOnKind:
    calibration_id = ""
    refused_seen = 0

    def test_policy_calibrates_and_becomes_ready(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        policy = wait_until(
            f"AdmissionPolicy {example.policy} Calibrated and Ready, thresholds on {example.replicas} sidecars",
            lambda: ready_policy(kube, example),
            timeout_s=seconds(1200),
            hint=f"kubectl -n {APP_NAMESPACE} describe admpol {example.policy}; kubectl -n {APP_NAMESPACE} get "
            f"jobs,pods; the calibration Job's logs; {OPERATOR_LOGS}",
            describe=lambda: describe_policy(kube, example),
        )
        pods = wait_until(
            f"Deployment {example.deployment} rolled out with the sidecar injected",
            lambda: rolled_out(kube, example, with_sidecar=True),
            timeout_s=seconds(600),
            hint=f"kubectl -n {APP_NAMESPACE} describe pods -l {example.selector} (readiness of {SIDECAR}: /readyz "
            f"needs thresholds and llama-server healthy)",
        )
        calibration = policy["status"]["calibration"]
        TestSlogateOnKind.calibration_id = calibration["id"]
        for pod in pods:
            state = sidecar_state(kube, pod["metadata"]["name"])
            assert state["calibrationId"] == calibration["id"], (
                f"{pod['metadata']['name']} enforces {state['calibrationId']}, the policy says {calibration['id']}"
            )
            # The injected sidecar runs as restricted as the chart's own containers.
            (sidecar,) = [c for c in pod["spec"]["containers"] if c["name"] == SIDECAR]
            context = sidecar["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
        assert policy["status"]["thresholds"]["calibrationId"] == calibration["id"]

    def test_overload_through_the_service_is_shed_with_retry_after(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        rng = random.Random(11)
        replies: list[Reply] = []
        hint = f"kubectl -n {APP_NAMESPACE} get svc {example.service} -o yaml (targetPort must be the sidecar's)"
        with port_forward(kube, APP_NAMESPACE, f"svc/{example.service}", 80, hint=hint) as url:
            # The interactive class has the tightest budget (1 s). Each 120-token prompt fits it
            # alone (its own prefill is well under 1 s even at 200 tokens/s); 32 at once do not.
            for _ in range(5):
                bodies = []
                for _ in range(32):
                    start = rng.randrange(1000, 30000)  # distinct token ids: no prompt-cache reuse
                    bodies.append({"prompt": list(range(start, start + 120)), "n_predict": 8})
                replies += burst_with_class(url, bodies, "interactive")
                if sum(r.status == 429 for r in replies) >= 10:
                    break
        statuses = sorted({r.status for r in replies})
        odd = [r.body[:300] for r in replies if r.status not in (200, 429)][:3]
        assert set(statuses) <= {200, 429}, (
            f"unexpected statuses {statuses}: {odd}. A 400 slogate_request_too_large means one prompt alone "
            f"exceeds the class's TTFT budget on this machine; a 503, that the sidecar lost llama-server; 0, "
            f"no HTTP answer (the kubectl port-forward dropped the connection)."
        )
        refused = [r for r in replies if r.status == 429]
        assert refused, f"no request was shed in {len(replies)}. Look at: the thresholds in the policy's status"
        assert any(r.status == 200 for r in replies), "the gate shed everything; it should still serve some"
        for reply in refused:
            retry_after_seconds(reply)
            assert reply.json()["error"]["code"] == "slogate_rejected"
        TestSlogateOnKind.refused_seen = len(refused)

    def test_shedding_is_counted_in_the_sidecars_metrics(self, kube: Kube, deployed: Example) -> None:
        rejected = timed_out = retry_afters = 0.0
        for pod in running_pods(kube, deployed):
            text = sidecar_metrics(kube, pod["metadata"]["name"])
            rejected += metric_sum(text, "slogate_requests_total", outcome="reject")
            timed_out += metric_sum(text, "slogate_deferral_outcomes_total", result="timed_out")
            retry_afters += metric_sum(text, "slogate_retry_after_seconds_count")
        # Every 429 is a rejection at once or a deferral that timed out; nobody else calls.
        assert rejected + timed_out == TestSlogateOnKind.refused_seen, (rejected, timed_out)
        assert rejected > 0
        assert retry_afters >= 1  # the Retry-After values sent are recorded

    def test_new_thread_count_recalibrates_every_sidecar(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        old = TestSlogateOnKind.calibration_id
        assert old, "the first step recorded no calibration"
        deployment = kube.json("-n", APP_NAMESPACE, "get", "deployment", example.deployment, hint="kubectl get deploy")
        containers = deployment["spec"]["template"]["spec"]["containers"]
        index = next(i for i, c in enumerate(containers) if c["name"] == example.llama_container)
        args = with_threads(containers[index]["args"], threads=1)
        patch = [{"op": "replace", "path": f"/spec/template/spec/containers/{index}/args", "value": args}]
        kube("-n", APP_NAMESPACE, "patch", "deployment", example.deployment, "--type=json", "-p", json.dumps(patch),
             hint="kubectl get deployment -o yaml")  # fmt: skip
        policy = wait_until(
            "a new calibration (the thread count changed) in force and acknowledged by every sidecar",
            lambda: ready_policy(kube, example, other_than=old),
            timeout_s=seconds(1200),
            hint=f"kubectl -n {APP_NAMESPACE} get jobs (a new calibration Job?); {OPERATOR_LOGS}",
            describe=lambda: describe_policy(kube, example),
        )
        new = policy["status"]["calibration"]["id"]
        pods = wait_until(
            "the rollout with the new thread count finished",
            lambda: rolled_out(kube, example, with_sidecar=True),
            timeout_s=seconds(600),
            hint=f"kubectl -n {APP_NAMESPACE} rollout status deployment/{example.deployment}",
        )
        for pod in pods:
            (llama,) = [c for c in pod["spec"]["containers"] if c["name"] == example.llama_container]
            assert llama["args"] == args, f"{pod['metadata']['name']} still runs the old arguments"
            name = pod["metadata"]["name"]
            state = wait_until(
                f"{name} enforcing calibration {new}",
                lambda name=name: enforcing(kube, name, new),
                timeout_s=seconds(120),
                hint=f"{OPERATOR_LOGS} (pushes), kubectl -n {APP_NAMESPACE} logs {name} -c {SIDECAR}",
            )
            assert state["thresholds"]["calibrationId"] == new != old
        job = policy["status"]["calibration"]["job"]
        assert kube.maybe_json("-n", APP_NAMESPACE, "get", "job", job) is not None, f"calibration Job {job} is gone"

    def test_deleting_the_policy_removes_the_sidecar(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        kube("-n", APP_NAMESPACE, "delete", "admissionpolicy", example.policy, f"--timeout={int(seconds(300))}s",
             hint=f"the policy's finalizer: {OPERATOR_LOGS}", timeout_s=seconds(360))  # fmt: skip
        pods = wait_until(
            f"Deployment {example.deployment} rolled out without the sidecar",
            lambda: rolled_out(kube, example, with_sidecar=False),
            timeout_s=seconds(600),
            hint=f"kubectl -n {APP_NAMESPACE} get deployment {example.deployment} -o yaml; {OPERATOR_LOGS}",
        )
        template = kube.json("-n", APP_NAMESPACE, "get", "deployment", example.deployment, hint="kubectl get deploy")
        labels = template["spec"]["template"]["metadata"].get("labels", {})
        assert "slogate.dev/policy" not in labels
        assert all(SIDECAR not in container_names(p) for p in pods)
        assert policy_of(kube, example) is None


def burst_with_class(url: str, bodies: list[dict[str, Any]], klass: str) -> list[Reply]:
    """A burst whose requests name their class (the sidecar's X-Slogate-Class header)."""
    return burst(url + "/completion", bodies, headers={"X-Slogate-Class": klass})


def with_threads(args: list[str], threads: int) -> list[str]:
    """llama-server arguments with `-t`/`--threads` set to `threads` (added if absent)."""
    out = list(args)
    for flag in ("-t", "--threads"):
        if flag in out:
            out[out.index(flag) + 1] = str(threads)
            return out
    return [*out, "-t", str(threads)]
