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

import pytest
from autoscaling_steps import check_autoscaling
from cluster_tools import (
    Kube,
    Reply,
    header,
    in_cluster_load,
    is_true,
    metric_sum,
    port_forward,
    retry_after_seconds,
    wait_until,
)
from suite import APP_NAMESPACE, CLIENT_POD, Example, apply_policy, seconds
from workload_state import (
    CLAIM,
    COMPLETION,
    GATE,
    GATE_HEADER,
    INJECTION_RECORD,
    OPERATOR_LOGS,
    PEERING,
    RESYNC_SECONDS,
    SIDECAR,
    WRITES,
    Availability,
    assert_fenced,
    assert_handed_over,
    assert_llama_port_as_in_the_example,
    audit_mark,
    burst_with_class,
    claimed_and_calibrating,
    container,
    container_names,
    deployment_of,
    describe_policy,
    enforcing,
    operator_calls,
    owned_by_the_policy,
    policy_of,
    ready_policy,
    replica_sets,
    rolled_out,
    running_pods,
    served_by_llama_server,
    served_by_the_gate,
    sidecar_metrics,
    sidecar_state,
    wait_for_endpoints,
    with_threads,
)

from slogate_admission.derivation import longest_admitted_prompt
from slogate_admission.schema import Thresholds

STEPS_DEPEND_ON_EACH_OTHER = True
"""conftest skips the later steps after a failure (each builds on the state the last left)."""


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
        assert_fenced(kube, example, pods)
        # The Service's named targetPort now resolves to the gate's port, on every pod.
        wait_for_endpoints(kube, example, example.sidecar_port("port"), pods, "the gate's client port")
        served_by_the_gate(kube, example, calibration["id"])

    def test_reapplying_the_quick_start_rolls_nothing_and_leaves_no_pod_ungated(
        self, kube: Kube, deployed: Example, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A GitOps re-sync loop: the quick start's unchanged manifest applied again and again,
        by kubectl's client-side apply and by a server-side apply as Argo CD or Flux do. The
        gate is injected at pod admission, so the Deployment holds only the user's fields and
        one annotation of ours: nothing to restore, nothing to fight over."""
        example = deployed
        before = deployment_of(kube, example)
        sets = replica_sets(kube, example)
        documents = example.documents
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
        for _ in range(5):
            kube.apply(APP_NAMESPACE, documents, hint="kubectl apply of the quick start")
            kube("-n", APP_NAMESPACE, "apply", "--server-side", "--force-conflicts", "--field-manager=argocd", "-f",
                 "-", hint="kubectl apply --server-side of the quick start", input_text=body)  # fmt: skip
        time.sleep(2 * RESYNC_SECONDS)  # the operator's passes see every change made
        after = deployment_of(kube, example)
        assert after["spec"]["template"] == before["spec"]["template"], "a re-apply changed the pod template"
        assert replica_sets(kube, example) == sets, "a re-apply started a rollout"
        pods = rolled_out(kube, example, with_sidecar=True)
        assert pods, "a re-apply left a pod without the gate"
        for pod in pods:
            assert_handed_over(pod, example)
        with capsys.disabled():  # the measurement, in the run's output
            print(f"\n10 re-applies (5 client-side, 5 server-side): ReplicaSets {sorted(sets)}, unchanged; "
                  f"{len(pods)} pods, all gated")  # fmt: skip

    def test_overload_through_the_service_is_shed_with_retry_after(self, kube: Kube, deployed: Example) -> None:
        example = deployed
        rng = random.Random(11)
        replies: list[Reply] = []
        hint = (
            f"kubectl -n {APP_NAMESPACE} get svc {example.service} -o yaml (targetPort must be the name "
            f"{example.target_port!r}, which the gate's port carries while injected)"
        )
        # The interactive class has the tightest budget (1 s). Each prompt takes a third of it
        # alone at the gate's margin, sized from the thresholds a sidecar enforces (a fixed
        # length may never fit on a slower node: a 400, not the 429 asked here); 32 at once do not.
        pod = running_pods(kube, example)[0]["metadata"]["name"]
        thresholds = Thresholds.model_validate(sidecar_state(kube, example, pod)["thresholds"])
        tokens = min(120, longest_admitted_prompt(thresholds, "interactive", share=1 / 3))
        assert tokens >= 4, f"the calibrated pod prefills only {tokens} tokens in a third of the interactive budget"
        # kubectl resolves the Service's named targetPort in one pod: the gate's port.
        with port_forward(kube, APP_NAMESPACE, f"svc/{example.service}", example.service_port, hint=hint) as url:
            for _ in range(5):
                bodies = []
                for _ in range(32):
                    start = rng.randrange(1000, 30000)  # distinct token ids: no prompt-cache reuse
                    bodies.append({"prompt": list(range(start, start + tokens)), "n_predict": 8})
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
        assert GATE not in (template["metadata"].get("annotations") or {}), "the gate annotation outlived the policy"
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
