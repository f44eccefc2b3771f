"""slogate on a real cluster, in the order a platform team meets it: a llama.cpp workload
serving through its Service, the chart installed, a policy applied to it (the Service keeps
answering, ungated, while the first calibration runs), calibration and Ready (the gate takes
over the name the Service targets), overload shed with 429 + Retry-After and counted in the
metrics, a rollout with a new thread count recalibrated into every sidecar, an autoscaler
made, judged and removed (autoscaling_steps.py), the policy deleted, the sidecar gone and
the Service answering through llama-server again. Each step depends on the previous ones
(conftest skips the rest after a failure and dumps the cluster's state).

Requests "through the Service" go from a pod of the app namespace to the Service's DNS
name: kube-proxy, the EndpointSlices its named targetPort resolved to and the
NetworkPolicy decide where they land, as for any client. The gate is told apart from
llama-server by the X-Slogate-Class header it puts on every answer it admits.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from autoscaling_steps import check_autoscaling
from cluster import AUDIT_LOG
from cluster_tools import (
    Kube,
    Reply,
    burst,
    conditions_line,
    header,
    http,
    in_cluster_command,
    in_cluster_load,
    is_true,
    metric_sum,
    parse_in_cluster_reply,
    port_forward,
    retry_after_seconds,
    wait_until,
)
from suite import APP_NAMESPACE, CLIENT_POD, RELEASE_NAMESPACE, Example, apply_policy, seconds

T = TypeVar("T")
STEPS_DEPEND_ON_EACH_OTHER = True
"""conftest skips the later steps after a failure (each builds on the state the last left)."""
SIDECAR = "slogate-sidecar"
CLAIM = "slogate.dev/policy"
"""The annotation on a claimed Deployment's metadata; the label on an injected pod template."""
INJECTION_RECORD = "slogate.dev/injection"
GATE_HEADER = "X-Slogate-Class"
"""On every answer the gate admitted; llama-server never sends it."""
COMPLETION = {"prompt": "The capital of France is", "n_predict": 8}
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
OPERATOR_LOGS = f"kubectl -n {RELEASE_NAMESPACE} logs -l app.kubernetes.io/component=operator"


def policy_of(kube: Kube, example: Example) -> dict[str, Any] | None:
    return kube.maybe_json("-n", APP_NAMESPACE, "get", "admissionpolicy", example.policy)


def deployment_of(kube: Kube, example: Example) -> dict[str, Any]:
    return kube.json("-n", APP_NAMESPACE, "get", "deployment", example.deployment, hint="kubectl get deploy")


def running_pods(kube: Kube, example: Example) -> list[dict[str, Any]]:
    """The Deployment's pods that are not on their way out."""
    pods = kube.json("-n", APP_NAMESPACE, "get", "pods", "-l", example.selector, hint="kubectl get pods")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def container_names(pod: dict[str, Any]) -> list[str]:
    """Of a pod or a pod template."""
    return [c["name"] for c in pod["spec"]["containers"]]


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """The container of that name in a pod or a pod template."""
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return dict(found)


def all_ready(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all(s.get("ready") for s in statuses)


def rolled_out(kube: Kube, example: Example, *, with_sidecar: bool) -> list[dict[str, Any]] | None:
    """The pods, once the Deployment's rollout finished with (or without) the sidecar."""
    deployment = deployment_of(kube, example)
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


# ------------------------------------------------------------------------------ the Service


def through_service(kube: Kube, example: Example, method: str, path: str, body: object | None = None) -> Reply:
    """One request to the Service's DNS name from the client pod in the app namespace."""
    url = f"http://{example.service}.{APP_NAMESPACE}.svc:{example.service_port}{path}"
    command = in_cluster_command(method, url, body, timeout_s=seconds(120))
    out = kube("-n", APP_NAMESPACE, "exec", CLIENT_POD, "--", *command, timeout_s=seconds(180),
               hint=f"kubectl -n {APP_NAMESPACE} get endpointslices -l kubernetes.io/service-name={example.service} "
                    f"-o yaml; kubectl -n {APP_NAMESPACE} get networkpolicies")  # fmt: skip
    return parse_in_cluster_reply(out)


def served_by_llama_server(kube: Kube, example: Example, when: str) -> None:
    """A completion through the Service answered 200 by llama-server itself, not by the gate."""
    reply = through_service(kube, example, "POST", "/completion", COMPLETION)
    assert reply.status == 200, (
        f"{when}: the Service answered {reply.status} (0: no HTTP answer at all): {reply.body[:300]!r}. "
        f"Look at: its EndpointSlices (the port its targetPort {example.target_port!r} resolved to)"
    )
    assert header(reply, GATE_HEADER) is None, f"{when}: the answer came through the gate: {reply.headers}"
    assert "content" in reply.json(), f"{when}: not llama-server's /completion answer: {reply.body[:300]!r}"


def served_by_the_gate(kube: Kube, example: Example, calibration: str) -> None:
    """A completion through the Service admitted by the gate, and the gate's /readyz on that calibration."""
    reply = through_service(kube, example, "POST", "/completion", COMPLETION)
    assert reply.status == 200, f"the Service answered {reply.status}: {reply.body[:300]!r}"
    assert header(reply, GATE_HEADER) is not None, (
        f"the answer came from llama-server directly ({GATE_HEADER} missing): the Service bypasses the gate"
    )
    ready = through_service(kube, example, "GET", "/readyz")
    assert ready.status == 200, f"/readyz through the Service answered {ready.status}: {ready.body[:300]!r}"
    assert ready.json().get("calibrationId") == calibration, ready.json()


def service_endpoints(kube: Kube, example: Example) -> dict[int, set[str]]:
    """The Service's ready endpoints (pod names), by the container port its named targetPort resolved to."""
    slices = kube.json("-n", APP_NAMESPACE, "get", "endpointslices", "-l",
                       f"kubernetes.io/service-name={example.service}", hint="kubectl get endpointslices")  # fmt: skip
    found: dict[int, set[str]] = {}
    for piece in slices["items"]:
        ready = {
            str((e.get("targetRef") or {}).get("name"))
            for e in piece.get("endpoints") or ()
            if (e.get("conditions") or {}).get("ready") is not False  # unset means ready
        }
        for port in piece.get("ports") or ():
            if ready and port.get("port") is not None:
                found.setdefault(int(port["port"]), set()).update(ready)
    return found


def endpoints_on(kube: Kube, example: Example, port: int, pods: list[dict[str, Any]]) -> dict[int, set[str]] | None:
    """The Service's ready endpoints once they are exactly these pods, on container port `port`."""
    found = service_endpoints(kube, example)
    return found if found == {port: {p["metadata"]["name"] for p in pods}} else None


def wait_for_endpoints(kube: Kube, example: Example, port: int, pods: list[dict[str, Any]], what: str) -> None:
    wait_until(
        f"Service {example.service}'s endpoints: {what} (port {port}) on every pod",
        lambda: endpoints_on(kube, example, port, pods),
        timeout_s=seconds(120),
        hint=f"kubectl -n {APP_NAMESPACE} get endpointslices -l kubernetes.io/service-name={example.service} -o yaml",
        describe=lambda: f"ready endpoints by port: {service_endpoints(kube, example)}",
    )


class Availability:
    """The Service's ready endpoints, counted at every poll of a wait: a rollout that adds or
    removes the gate must never leave the Service without one."""

    def __init__(self, kube: Kube, example: Example) -> None:
        self.kube, self.example = kube, example
        self.samples: list[int] = []

    def sample(self) -> None:
        self.samples.append(len(set().union(*service_endpoints(self.kube, self.example).values())))

    def watching(self, probe: Callable[[], T | None]) -> Callable[[], T | None]:
        def sampled() -> T | None:
            self.sample()
            return probe()

        return sampled

    def check(self, what: str) -> None:
        assert self.samples, f"{what}: the Service's endpoints were never read"
        assert min(self.samples) >= 1, (
            f"{what}: the Service had no ready endpoint at {self.samples.count(0)} of {len(self.samples)} polls "
            f"(ready endpoints per poll: {self.samples})"
        )


# ------------------------------------------------------------------------------ the port handover


def probe_port(container_spec: dict[str, Any], probe: str) -> object:
    return ((container_spec.get(probe) or {}).get("httpGet") or {}).get("port")


def assert_llama_port_as_in_the_example(llama: dict[str, Any], example: Example, where: str) -> None:
    """llama-server's port and probes as the example declares them: the name the Service targets is its own."""
    ports = [(p.get("name"), p["containerPort"]) for p in llama.get("ports") or ()]
    assert ports == [(p.get("name"), p["containerPort"]) for p in example.llama_spec["ports"]], f"{where}: {ports}"
    for probe in PROBES:
        assert probe_port(llama, probe) == probe_port(example.llama_spec, probe), f"{where}: {probe}"


def assert_handed_over(pod: dict[str, Any], example: Example) -> None:
    """The gate's client port carries the name the Service targets; llama-server's keeps its number only."""
    name = pod["metadata"]["name"]
    gate = [p for p in container(pod, SIDECAR).get("ports") or () if p["containerPort"] == example.sidecar_port("port")]
    assert [p.get("name") for p in gate] == [example.target_port], f"{name}: the gate's client port is {gate}"
    llama = container(pod, example.llama_container)
    own = [p for p in llama.get("ports") or () if p["containerPort"] == example.llama_port]
    assert own, f"{name}: llama-server's port {example.llama_port} is no longer declared"
    assert all(not p.get("name") for p in own), f"{name}: llama-server's port kept its name: {own}"
    for probe in PROBES:  # a probe that named the port names its number while the gate has the name
        if probe_port(example.llama_spec, probe) == example.target_port:
            assert probe_port(llama, probe) == example.llama_port, f"{name}: {probe} {llama.get(probe)}"


# ------------------------------------------------------------------------------ the sidecars


def sidecar_state(kube: Kube, example: Example, pod: str) -> dict[str, Any]:
    """GET /slogate/v1/state from one pod's sidecar admin port."""
    hint = f"kubectl -n {APP_NAMESPACE} logs {pod} -c {SIDECAR}"
    with port_forward(kube, APP_NAMESPACE, f"pod/{pod}", example.sidecar_port("adminPort"), hint=hint) as url:
        reply = http("GET", url + "/slogate/v1/state", timeout_s=30)
    assert reply.status == 200, f"{pod}: state answered {reply.status}: {reply.body[:300]!r}. Look at: {hint}"
    state: dict[str, Any] = reply.json()
    return state


def enforcing(kube: Kube, example: Example, pod: str, calibration: str) -> dict[str, Any] | None:
    """The sidecar's state once it enforces that calibration."""
    state = sidecar_state(kube, example, pod)
    return state if state["calibrationId"] == calibration else None


def sidecar_metrics(kube: Kube, example: Example, pod: str) -> str:
    hint = f"kubectl -n {APP_NAMESPACE} logs {pod} -c {SIDECAR}"
    with port_forward(kube, APP_NAMESPACE, f"pod/{pod}", example.sidecar_port("adminPort"), hint=hint) as url:
        reply = http("GET", url + "/metrics", timeout_s=30)
    assert reply.status == 200, f"{pod}: /metrics answered {reply.status}. Look at: {hint}"
    return reply.body.decode()


# ------------------------------------------------------------------------------ the policy


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


def claimed_and_calibrating(kube: Kube, example: Example) -> dict[str, Any] | None:
    """The policy once the operator claimed the Deployment and its first calibration is under way."""
    annotations = deployment_of(kube, example)["metadata"].get("annotations") or {}
    if annotations.get(CLAIM) != example.policy:
        return None
    policy = policy_of(kube, example)
    status = (policy or {}).get("status") or {}
    if policy is None or not (status.get("calibrating") or is_true(policy, "Calibrated")):
        return None
    return policy


def describe_policy(kube: Kube, example: Example) -> str:
    policy = policy_of(kube, example)
    pushed = (policy or {}).get("status", {}).get("pushed")
    return f"{conditions_line(policy)}; pushed {pushed}"


class TestSlogateOnARealCluster:
    calibration_id = ""
    refused_seen = 0

    def test_the_service_answers_ungated_before_the_first_calibration(self, kube: Kube, workload: Example) -> None:
        example = workload
        pods = rolled_out(kube, example, with_sidecar=False)
        assert pods, f"Deployment {example.deployment} is not rolled out without the sidecar"
        wait_for_endpoints(kube, example, example.llama_port, pods, "llama-server's port")
        served_by_llama_server(kube, example, "before the policy")

        apply_policy(kube, example)
        wait_until(
            f"the operator claimed Deployment {example.deployment} and started the first calibration",
            lambda: claimed_and_calibrating(kube, example),
            timeout_s=seconds(300),
            hint=f"kubectl -n {APP_NAMESPACE} get deployment {example.deployment} -o yaml (annotation {CLAIM}); "
            f"kubectl -n {APP_NAMESPACE} get jobs; {OPERATOR_LOGS}",
            describe=lambda: describe_policy(kube, example),
        )
        # Look first, then read the policy: still not Calibrated means all of it was seen
        # before the first calibration. Claimed, the workload is not touched until then.
        template = deployment_of(kube, example)["spec"]["template"]
        assert SIDECAR not in container_names(template), "the gate was injected before thresholds existed"
        assert CLAIM not in (template["metadata"].get("labels") or {})
        assert_llama_port_as_in_the_example(container(template, example.llama_container), example, "the template")
        pods = running_pods(kube, example)
        assert pods
        assert all(SIDECAR not in container_names(p) for p in pods)
        served_by_llama_server(kube, example, "while the first calibration runs")
        policy = policy_of(kube, example)
        assert policy is not None
        assert not is_true(policy, "Calibrated"), (
            "the first calibration finished during this check, so it saw nothing of the time before it; "
            "look at how long the calibration Job ran"
        )
        notes = policy.get("status", {}).get("notes") or []
        assert any("ungated" in note for note in notes), f"status.notes should say it serves ungated: {notes}"

    def test_policy_calibrates_and_becomes_ready(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        availability = Availability(kube, example)
        policy = wait_until(
            f"AdmissionPolicy {example.policy} Calibrated and Ready, thresholds on {example.replicas} sidecars",
            availability.watching(lambda: ready_policy(kube, example)),
            timeout_s=seconds(1200),
            hint=f"kubectl -n {APP_NAMESPACE} describe admpol {example.policy}; kubectl -n {APP_NAMESPACE} get "
            f"jobs,pods; the calibration Job's logs; {OPERATOR_LOGS}",
            describe=lambda: describe_policy(kube, example),
        )
        pods = wait_until(
            f"Deployment {example.deployment} rolled out with the sidecar injected",
            availability.watching(lambda: rolled_out(kube, example, with_sidecar=True)),
            timeout_s=seconds(600),
            hint=f"kubectl -n {APP_NAMESPACE} describe pods -l {example.selector} (readiness of {SIDECAR}: /readyz "
            f"needs thresholds and llama-server healthy)",
        )
        availability.check("injecting the gate")
        calibration = policy["status"]["calibration"]
        TestSlogateOnARealCluster.calibration_id = calibration["id"]
        assert (deployment_of(kube, example)["metadata"].get("annotations") or {}).get(CLAIM) == example.policy
        for pod in pods:
            state = sidecar_state(kube, example, pod["metadata"]["name"])
            assert state["calibrationId"] == calibration["id"], (
                f"{pod['metadata']['name']} enforces {state['calibrationId']}, the policy says {calibration['id']}"
            )
            # The injected sidecar runs as restricted as the chart's own containers.
            context = container(pod, SIDECAR)["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert_handed_over(pod, example)
        assert policy["status"]["thresholds"]["calibrationId"] == calibration["id"]
        # The Service's named targetPort now resolves to the gate's port, on every pod.
        wait_for_endpoints(kube, example, example.sidecar_port("port"), pods, "the gate's client port")
        served_by_the_gate(kube, example, calibration["id"])

    def test_overload_through_the_service_is_shed_with_retry_after(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        rng = random.Random(11)
        replies: list[Reply] = []
        hint = (
            f"kubectl -n {APP_NAMESPACE} get svc {example.service} -o yaml (targetPort must be the name "
            f"{example.target_port!r}, which the gate's port carries while injected)"
        )
        # kubectl resolves the Service's named targetPort in one pod: the gate's port.
        with port_forward(kube, APP_NAMESPACE, f"svc/{example.service}", example.service_port, hint=hint) as url:
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
        assert all(header(r, GATE_HEADER) for r in replies if r.status == 200), "a 200 that bypassed the gate"
        for reply in refused:
            retry_after_seconds(reply)
            assert reply.json()["error"]["code"] == "slogate_rejected"
        TestSlogateOnARealCluster.refused_seen = len(refused)

    def test_shedding_is_counted_in_the_sidecars_metrics(self, kube: Kube, deployed: Example) -> None:
        rejected = timed_out = retry_afters = 0.0
        for pod in running_pods(kube, deployed):
            text = sidecar_metrics(kube, deployed, pod["metadata"]["name"])
            rejected += metric_sum(text, "slogate_requests_total", outcome="reject")
            timed_out += metric_sum(text, "slogate_deferral_outcomes_total", result="timed_out")
            retry_afters += metric_sum(text, "slogate_retry_after_seconds_count")
        # Every 429 is a rejection at once or a deferral that timed out; nobody else calls.
        assert rejected + timed_out == TestSlogateOnARealCluster.refused_seen, (rejected, timed_out)
        assert rejected > 0
        assert retry_afters >= 1  # the Retry-After values sent are recorded

    def test_a_steady_operator_writes_nothing(
        self, kube: Kube, deployed: Example, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Injection survives the real API server's defaulting: with the policy Ready and nothing
        changing, the operator's resync passes write nothing (the real server's audit log, every
        call of the operator's ServiceAccount; kopf's peering keepalive aside)."""
        example = deployed
        window_s = 2.5 * RESYNC_SECONDS
        start = audit_mark(kube)
        time.sleep(window_s)
        calls = operator_calls(kube, since=start)
        writes = [c for c in calls if c["verb"] in WRITES and c["resource"] not in PEERING]
        reads = [c for c in calls if c["verb"] in ("get", "list")]
        passes = window_s / RESYNC_SECONDS
        with capsys.disabled():  # the measurement, in the run's output
            print(f"\nsteady window {window_s:g} s (~{passes:g} resync passes): {len(writes)} writes, "
                  f"{len(reads)} reads ({len(reads) / passes:.1f} a pass), "
                  f"{sum(c['resource'] in PEERING for c in calls)} peering keepalives; reads by kind: "
                  f"{sorted(Counter(c['verb'] + ' ' + c['resource'] for c in reads).items())}")  # fmt: skip
        assert writes == [], f"the operator wrote while nothing changed: {writes}"
        assert reads, "no resync pass read anything in the window: is the operator running?"
        assert is_true(policy_of(kube, example), "Ready")

    def test_new_thread_count_recalibrates_every_sidecar(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        old = TestSlogateOnARealCluster.calibration_id
        assert old, "the first step recorded no calibration"
        containers = deployment_of(kube, example)["spec"]["template"]["spec"]["containers"]
        index = next(i for i, c in enumerate(containers) if c["name"] == example.llama_container)
        args = with_threads(containers[index]["args"], threads=1)
        patch = [{"op": "replace", "path": f"/spec/template/spec/containers/{index}/args", "value": args}]
        availability = Availability(kube, example)
        mark = audit_mark(kube)
        kube("-n", APP_NAMESPACE, "patch", "deployment", example.deployment, "--type=json", "-p", json.dumps(patch),
             hint="kubectl get deployment -o yaml")  # fmt: skip
        policy = wait_until(
            "a new calibration (the thread count changed) in force and acknowledged by every sidecar",
            availability.watching(lambda: ready_policy(kube, example, other_than=old)),
            timeout_s=seconds(1200),
            hint=f"kubectl -n {APP_NAMESPACE} get jobs (a new calibration Job?); {OPERATOR_LOGS}",
            describe=lambda: describe_policy(kube, example),
        )
        new = policy["status"]["calibration"]["id"]
        pods = wait_until(
            "the rollout with the new thread count finished",
            availability.watching(lambda: rolled_out(kube, example, with_sidecar=True)),
            timeout_s=seconds(600),
            hint=f"kubectl -n {APP_NAMESPACE} rollout status deployment/{example.deployment}",
        )
        availability.check("the rollout with the new thread count")
        for pod in pods:
            llama = container(pod, example.llama_container)
            assert llama["args"] == args, f"{pod['metadata']['name']} still runs the old arguments"
            assert_handed_over(pod, example)
            name = pod["metadata"]["name"]
            state = wait_until(
                f"{name} enforcing calibration {new}",
                lambda name=name: enforcing(kube, example, name, new),
                timeout_s=seconds(120),
                hint=f"{OPERATOR_LOGS} (pushes), kubectl -n {APP_NAMESPACE} logs {name} -c {SIDECAR}",
            )
            assert state["thresholds"]["calibrationId"] == new != old
        job = policy["status"]["calibration"]["job"]
        assert kube.maybe_json("-n", APP_NAMESPACE, "get", "job", job) is not None, f"calibration Job {job} is gone"
        # Once: the operator created one Job since the patch, this one (the API server's audit log).
        calls = operator_calls(kube, since=mark)
        created = [c["name"] for c in calls if (c["verb"], c["resource"]) == ("create", "jobs")]
        assert len(created) == 1, f"calibration Jobs created for one rollout: {created}"
        assert created[0] in (job, ""), created  # (the audit log names a created object where it can)

    def test_a_rolling_restart_under_load_loses_no_request(
        self, kube: Kube, deployed: Example, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`kubectl rollout restart` while a client sends requests through the Service one after
        another: the old pods' gates drain (preStop) while kube-proxy takes them out of the
        Service, so every request gets an HTTP answer, none a 5xx or a reset."""
        example = deployed
        before = {p["metadata"]["name"] for p in running_pods(kube, example)}
        url = f"http://{example.service}.{APP_NAMESPACE}.svc:{example.service_port}/completion"
        stop = "/tmp/slogate-e2e-stop-load"
        kube("-n", APP_NAMESPACE, "exec", CLIENT_POD, "--", "rm", "-f", stop, hint="the client pod")
        load = subprocess.Popen(
            ["kubectl", f"--kubeconfig={kube.kubeconfig}", "-n", APP_NAMESPACE, "exec", CLIENT_POD, "--",
             *in_cluster_load(url, COMPLETION, stop_file=stop, limit_s=seconds(900))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            time.sleep(5)  # requests flow before the restart
            kube("-n", APP_NAMESPACE, "rollout", "restart", f"deployment/{example.deployment}", hint="kubectl rollout")
            pods = wait_until(
                "the restart rolled every pod",
                lambda: (
                    (found := rolled_out(kube, example, with_sidecar=True))
                    and not before & {p["metadata"]["name"] for p in found}
                    and found
                ),
                timeout_s=seconds(600),
                hint=f"kubectl -n {APP_NAMESPACE} rollout status deployment/{example.deployment}",
            )
            time.sleep(5)  # and after it
        finally:
            kube("-n", APP_NAMESPACE, "exec", CLIENT_POD, "--", "touch", stop, hint="the client pod")
            out, err = load.communicate(timeout=seconds(180))
        assert load.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        tally = {int(k): v for k, v in result["tally"].items()}
        with capsys.disabled():  # the measurement, in the run's output
            print(f"\nrequests through the Service during the restart, by status: {dict(sorted(tally.items()))}")
        failed = {status: n for status, n in tally.items() if status == 0 or status >= 500}
        assert failed == {}, f"client-visible errors during the restart: {tally}; first: {result['errors']}"
        assert tally.get(200, 0) >= 10, f"too few requests answered to judge the restart: {tally}"
        assert len(pods) == example.replicas

    def test_autoscaling_owns_its_autoscaler_and_never_the_replicas(self, kube: Kube, deployed: Example) -> None:
        check_autoscaling(kube, deployed)  # autoscaling_steps.py says what and why

    def test_deleting_the_policy_gives_the_service_back_to_llama_server(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        availability = Availability(kube, example)
        availability.sample()
        owned = owned_by_the_policy(kube, example)
        assert owned, "the policy owns nothing (a calibration Job, the thresholds ConfigMap, the token Secret)"
        # Not waiting in kubectl: the Service is watched while the finalizer takes the gate out.
        kube("-n", APP_NAMESPACE, "delete", "admissionpolicy", example.policy, "--wait=false",
             hint=f"kubectl -n {APP_NAMESPACE} get admpol {example.policy}")  # fmt: skip
        wait_until(
            f"AdmissionPolicy {example.policy} gone (its finalizer ran)",
            availability.watching(lambda: policy_of(kube, example) is None),
            timeout_s=seconds(300),
            hint=f"the policy's finalizer: {OPERATOR_LOGS}",
            describe=lambda: describe_policy(kube, example),
        )
        pods = wait_until(
            f"Deployment {example.deployment} rolled out without the sidecar",
            availability.watching(lambda: rolled_out(kube, example, with_sidecar=False)),
            timeout_s=seconds(600),
            hint=f"kubectl -n {APP_NAMESPACE} get deployment {example.deployment} -o yaml; {OPERATOR_LOGS}",
        )
        availability.check("removing the gate")
        deployment = deployment_of(kube, example)
        assert CLAIM not in (deployment["metadata"].get("annotations") or {}), "the claim outlived the policy"
        template = deployment["spec"]["template"]
        assert CLAIM not in (template["metadata"].get("labels") or {})
        assert INJECTION_RECORD not in (template["metadata"].get("annotations") or {})
        # The name went back to llama-server's port (and its probes).
        assert_llama_port_as_in_the_example(container(template, example.llama_container), example, "the template")
        for pod in pods:
            assert SIDECAR not in container_names(pod)
            llama = container(pod, example.llama_container)
            assert_llama_port_as_in_the_example(llama, example, pod["metadata"]["name"])
        # No outage: the Service's named targetPort resolves to llama-server again, which answers.
        wait_for_endpoints(kube, example, example.llama_port, pods, "llama-server's port")
        served_by_llama_server(kube, example, "after the policy was deleted")
        assert policy_of(kube, example) is None
        # The real garbage collector removes what the policy owned (ownerReferences).
        wait_until(
            f"the garbage collector removed what the policy owned ({sorted(owned)})",
            lambda: not owned_by_the_policy(kube, example),
            timeout_s=seconds(180),
            hint="kube-controller-manager's garbage collector; ownerReferences of the objects listed",
            describe=lambda: str(sorted(owned_by_the_policy(kube, example))),
        )


OWNED_KINDS = "jobs,pods,configmaps,secrets,horizontalpodautoscalers"


def owned_by_the_policy(kube: Kube, example: Example) -> set[str]:
    """`kind/name` of every object in the app namespace that an AdmissionPolicy of that name owns
    (directly, or through a Job it owns: the calibration pods)."""
    items = kube.json("-n", APP_NAMESPACE, "get", OWNED_KINDS, hint="kubectl get")["items"]
    owned: set[str] = set()
    for _ in range(2):  # a pod owned by a Job the policy owns
        for item in items:
            for ref in item["metadata"].get("ownerReferences") or ():
                if (ref["kind"] == "AdmissionPolicy" and ref["name"] == example.policy) or \
                        f"{ref['kind']}/{ref['name']}" in owned:  # fmt: skip
                    owned.add(f"{item['kind']}/{item['metadata']['name']}")
    return owned


RESYNC_SECONDS = 30.0
"""The operator's resync period (OperatorSettings.resync_seconds' default, which the chart keeps)."""
WRITES = ("create", "update", "patch", "delete", "deletecollection")
PEERING = ("clusterkopfpeerings", "kopfpeerings")
"""kopf's keepalive of its peering object: its liveness, not a pass's work."""


def audit_log(kube: Kube) -> Path:
    """The API server's audit log of this run (e2e/kube/cluster.py writes it beside the kubeconfig)."""
    return kube.kubeconfig.parent / AUDIT_LOG


def audit_mark(kube: Kube) -> int:
    """Where the audit log ends now (a byte offset)."""
    return audit_log(kube).stat().st_size


def operator_calls(kube: Kube, *, since: int) -> list[dict[str, str]]:
    """The operator's calls after `since` (its ServiceAccount's), as verb, resource, namespace, name."""
    prefix = f"system:serviceaccount:{RELEASE_NAMESPACE}:"
    with audit_log(kube).open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    calls = []
    for line in lines:
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or not event["user"]["username"].startswith(prefix):
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        calls.append({"verb": event["verb"], "resource": resource, "namespace": ref.get("namespace", ""),
                      "name": ref.get("name", "")})  # fmt: skip
    return calls


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
