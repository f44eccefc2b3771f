"""What the operator costs the API server and the sidecars, and that pushes never hold a pass.

The figure in docs/operator.md ("Cost per pass") is this module's measurement:
``make operator-cost`` (SLOGATE_WRITE_DOCS=1) rewrites it; otherwise the test fails when the
code and the published figure disagree. Passes are triggered one at a time (the resync is
an hour), so the counts are exact, not averages of a noisy run.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from counting_sidecars import CountingSidecars
from operator_flows import apply_and_calibrate, status_of

from api_cluster import DEPLOYMENTS, PODS, POLICIES, Cluster
from canned_profiles import smollm2_profile
from kopf_thread import passes, running_operator
from manifests import admission_policy, llama_deployment
from polling import eventually
from project_files import ROOT
from slogate_calibration.output import compact_json
from slogate_operator import names
from workload_controllers import complete_job, job_names, run_pods, write_deployment_status

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread

DOC = ROOT / "docs" / "operator.md"
BEGIN, END = "<!-- operator-cost:begin -->", "<!-- operator-cost:end -->"
QUIET = {"RESYNC_SECONDS": "3600"}


def quiet(cluster: Cluster, polls: int = 10) -> None:
    """Wait until the operator has made no API call for ``polls`` polls in a row (a wait, not a check)."""
    seen, still = -1, 0
    while still < polls:
        time.sleep(0.1)
        now = cluster.call_mark()
        seen, still = now, (still + 1 if now == seen else 0)


@pytest.fixture
def quiet_operator(cluster: Cluster) -> Iterator[None]:
    with running_operator(cluster, **QUIET):
        yield


def one_pass(cluster: Cluster, name: str = "smollm2") -> Counter[tuple[str, str]]:
    """Trigger exactly one pass (a label on its Deployment) and return the operator's API calls in it."""
    quiet(cluster)
    before, mark = passes(name), cluster.call_mark()
    stamp = str(time.monotonic_ns())
    cluster.patch(DEPLOYMENTS, name, {"metadata": {"labels": {"test.slogate.dev/poke": stamp}}})
    eventually(lambda: passes(name) > before, what="the triggered pass")
    quiet(cluster)
    assert passes(name) == before + 1
    return cluster.api_calls(since=mark)


def measure(cluster: Cluster, name: str, pods: int) -> tuple[Counter[tuple[str, str]], Counter[str]]:
    """A policy Ready with ``pods`` running sidecars: the calls of one steady pass, API and sidecar."""
    fleet = CountingSidecars(cluster, pods)
    try:
        cluster.create(DEPLOYMENTS, llama_deployment(name))
        cluster.create(POLICIES, admission_policy(name, sidecar={"adminPort": fleet.port}))
        (job,) = eventually(lambda: [j for j in job_names(cluster) if j.startswith(f"{name}-cal-")])
        complete_job(cluster, job, compact_json(smollm2_profile()))
        eventually(lambda: status_of(cluster, "Ready", name) == "True", what=f"{name} Ready")
        run_pods(cluster, name, fleet.ips)
        eventually(lambda: (cluster.get(POLICIES, name).get("status") or {}).get("pushed") == f"{pods}/{pods}")
        quiet(cluster)
        fleet.requests.clear()
        calls = one_pass(cluster, name)
        return calls, Counter(fleet.requests)
    finally:
        fleet.close()


def figure(rows: list[tuple[int, Counter[tuple[str, str]], Counter[str]]]) -> str:
    lines = ["| running pods | API calls in one steady pass | requests to sidecars in it |", "| --- | --- | --- |"]
    for pods, calls, sidecar in rows:
        api = ", ".join(f"{verb} {resource} x{n}" for (verb, resource), n in sorted(calls.items()))
        lines.append(f"| {pods} | {sum(calls.values())}: {api} | {sum(sidecar.values())} |")
    return "\n".join(lines)


def test_a_steady_pass_costs_the_same_for_one_pod_and_twenty(cluster: Cluster, quiet_operator: None) -> None:
    one = measure(cluster, "one", 1)
    twenty = measure(cluster, "twenty", 20)
    assert one[0] == twenty[0]  # API calls do not grow with the pods
    assert one[1] == twenty[1] == Counter()  # sidecars that acknowledged are not asked again
    table = figure([(1, *one), (20, *twenty)])
    text = DOC.read_text()
    if os.environ.get("SLOGATE_WRITE_DOCS"):
        DOC.write_text(re.sub(f"{BEGIN}.*?{END}", f"{BEGIN}\n{table}\n{END}", text, flags=re.S))
    assert f"{BEGIN}\n{table}\n{END}" in DOC.read_text(), f"docs/operator.md is stale; measured:\n{table}"


def test_a_status_write_wakes_no_policy_and_a_change_wakes_only_its_own(cluster: Cluster, quiet_operator: None) -> None:
    for name in ("alpha", "beta"):
        cluster.create(DEPLOYMENTS, llama_deployment(name))
        cluster.create(POLICIES, admission_policy(name))
    eventually(lambda: len(job_names(cluster)) == 2, what="a Job each")
    quiet(cluster)
    alpha, beta = passes("alpha"), passes("beta")
    for _ in range(5):  # the Deployment controller, every few seconds on a real cluster
        write_deployment_status(cluster, "alpha")
    quiet(cluster)
    assert (passes("alpha"), passes("beta")) == (alpha, beta)
    cluster.patch(DEPLOYMENTS, "alpha", {"metadata": {"labels": {"team": "ml"}}})
    eventually(lambda: passes("alpha") > alpha, what="alpha's pass")
    quiet(cluster)
    assert passes("beta") == beta


def test_pushes_to_frozen_sidecars_never_hold_the_pass(cluster: Cluster) -> None:
    """20 sidecars that accept and never answer: a rollout is still calibrated at once."""
    fleet = CountingSidecars(cluster, 20, hang=True)
    try:
        with running_operator(cluster, PUSH_TIMEOUT_SECONDS="60", **QUIET):
            first = apply_and_calibrate(cluster, sidecar={"adminPort": fleet.port})
            run_pods(cluster, "smollm2", fleet.ips)
            eventually(lambda: fleet.open >= 16, what=f"a push round under way (16 at once): {fleet.requests}")
            containers = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["containers"]
            containers[0]["args"] = [*containers[0]["args"], "-b", "512"]
            cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"template": {"spec": {"containers": containers}}}})
            eventually(lambda: [j for j in job_names(cluster) if j != first], what="the rollout's Job")
            assert fleet.open >= 16  # the round is still hanging: the pass did not wait for it
            assert status_of(cluster, "ThresholdsPushed") == "False"
    finally:
        fleet.close()


def test_a_restarted_operator_spreads_its_first_passes(cluster: Cluster) -> None:
    """Each policy's first pass waits a random share of the jitter, and a wake-up does not cut it
    short (kopf's first listing pokes every policy at once)."""
    cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy())
    before = passes("smollm2")  # the metrics registry lives as long as the test process
    with running_operator(cluster, STARTUP_JITTER_SECONDS="3600", **QUIET):
        finalizer = f"{names.GROUP}/operator"
        eventually(lambda: finalizer in (cluster.get(POLICIES, "smollm2")["metadata"].get("finalizers") or []))
        cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"labels": {"team": "ml"}}})  # a wake-up
        quiet(cluster)
        assert passes("smollm2") == before
        assert job_names(cluster) == []


def test_pod_status_writes_that_change_nothing_a_pass_reads_cost_no_pass(
    cluster: Cluster, quiet_operator: None
) -> None:
    """The second review's count: 200 kubelet status writes during a rollout were 124 passes, each
    listing every pod. Writes of what a pass does not read (probe times, Ready flipping) wake
    nothing; a sidecar's restart does."""
    fleet = CountingSidecars(cluster, 20)
    try:
        apply_and_calibrate(cluster, sidecar={"adminPort": fleet.port})
        pods = run_pods(cluster, "smollm2", fleet.ips)
        write_deployment_status(cluster, "smollm2", replicas=len(pods))
        eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready with 20 gated pods")
        quiet(cluster)
        before, mark = passes("smollm2"), cluster.call_mark()
        for round_ in range(10):  # 200 writes: each pod's Ready condition flips, its probe time moves
            for pod in pods:
                ready = {"type": "Ready", "status": "True" if round_ % 2 else "False", "lastProbeTime": None,
                         "lastTransitionTime": f"2026-12-05T00:00:{round_:02d}Z"}  # fmt: skip
                cluster.patch(PODS, pod, {"status": {"conditions": [ready]}}, sub="status")
        quiet(cluster)
        assert passes("smollm2") == before
        assert cluster.api_calls(mark) == Counter()
        # A sidecar restarted: that is a pass (its thresholds are pushed again).
        pod = cluster.get(PODS, pods[0])
        statuses = pod["status"]["containerStatuses"]
        for status in statuses:
            status["restartCount"] = 1
        cluster.patch(PODS, pods[0], {"status": {"containerStatuses": statuses}}, sub="status")
        eventually(lambda: passes("smollm2") > before, what="the pass the restart woke")
    finally:
        fleet.close()
