"""A gated Deployment of 200 pods on the real cluster, rolled: the operator's reconcile passes
and API calls, and every pod the rollout creates gated.

The pods run on three fake nodes that kwok plays (fleet.py, e2e/kube/kwok.py); everything
else is the real thing: the API server and its admission (the operator's injection webhook
on every pod), the Deployment and ReplicaSet controllers, the scheduler, the operator in its
pod with the chart's ServiceAccount. The policy is calibrated first by the real llama-server
on the real node, then the Deployment moves onto the fake nodes (placement is no part of the
fingerprint: no recalibration).

A fake pod's address is in 127.0.0.0/8, so the operator's threshold pushes to it find no
listener in the operator pod's own network namespace: each is refused. The operator must
count those sidecars as not pushed, and still follow the rollout.

Counts only, never how long anything took: the pass bound is the one
tests/envtest/test_rollout_cost.py holds on a bare API server (at most a pass per
coalescing window the rollout lasted, plus one), here compared with how long the real
rollout took. The numbers are printed to be quoted (`pytest -s`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from ipaddress import ip_address, ip_network

import pytest
from cluster_tools import Kube, is_true, wait_until
from fleet import (
    NAME,
    NAMESPACE,
    NODE_PODS,
    NODES,
    REPLICAS,
    Meter,
    PodWatch,
    fake_node,
    fleet_documents,
    fleet_pods,
    newest_hash,
    node_name,
    operator_settings,
    push_warnings,
    restarts,
    to_the_fleet,
    wait_for_quiet,
)
from suite import Example, seconds
from workload_state import GATE, OPERATOR_LOGS, SIDECAR

QUIET_S = 10.0
"""No operator write for this long: the rollout's consequences are all handled."""
IDLE_S = 30.0
LOOPBACK = ip_network("127.0.0.0/8")
HINT = f"kubectl -n {NAMESPACE} get pods,rs,deploy,admissionpolicy; {OPERATOR_LOGS}; the cluster's logs/kwok.log"


def policy(kube: Kube) -> dict:
    return kube.maybe_json("-n", NAMESPACE, "get", "admissionpolicy", NAME) or {}


def describe(kube: Kube) -> str:
    status = policy(kube).get("status") or {}
    return json.dumps({k: status.get(k) for k in ("conditions", "pushed", "sidecars")})[:1500]


def rolled_out(kube: Kube) -> list[dict] | None:
    """The REPLICAS pods, once the Deployment's rollout is complete and all of them are Ready."""
    deployment = kube.json("-n", NAMESPACE, "get", "deployment", NAME, hint=HINT)
    status = deployment.get("status") or {}
    if status.get("observedGeneration", 0) < deployment["metadata"]["generation"] or not (
        status.get("updatedReplicas") == status.get("readyReplicas") == status.get("replicas") == REPLICAS
    ):
        return None
    pods = fleet_pods(kube)
    ready = [p for p in pods if is_true(p, "Ready")]
    return pods if len(pods) == len(ready) == REPLICAS else None


def sidecars_reported(kube: Kube, pods: list[dict]) -> dict | None:
    """The policy's status once it counts exactly these pods (no pod of an older ReplicaSet)."""
    status = policy(kube).get("status") or {}
    sidecars, names = status.get("sidecars") or {}, {p["metadata"]["name"] for p in pods}
    behind = {b["pod"] for b in sidecars.get("behind") or ()}
    return status if sidecars.get("targeted") == REPLICAS and behind <= names else None


@pytest.fixture(scope="module")
def fleet(kube: Kube, release: str, example: Example) -> Iterator[list[dict]]:  # noqa: ARG001 (needs the chart)
    """Three fake nodes, the policy calibrated on the real node, then REPLICAS gated pods on
    the fake nodes; all deleted at the end (the Deployment's pods first, so kwok finishes
    them, then the policy, its namespace and the nodes)."""
    deployment, admission_policy = fleet_documents(example)
    try:
        nodes = {"apiVersion": "v1", "kind": "List", "items": [fake_node(i) for i in range(NODES)]}
        kube("create", "-f", "-", input_text=json.dumps(nodes), hint="kubectl get nodes")
        wait_until("the fake nodes Ready (kwok plays them)",
                   lambda: all(is_true(kube.json("get", "node", node_name(i), hint=HINT), "Ready")
                               for i in range(NODES)), timeout_s=seconds(120), hint=HINT)  # fmt: skip
        kube("create", "namespace", NAMESPACE, hint="kubectl get namespaces")
        kube.apply(NAMESPACE, [deployment, admission_policy], hint=HINT)
        wait_until("the policy calibrated by the real llama-server, its template gated",
                   lambda: is_true(policy(kube), "Calibrated") and GATE in (kube.json(
                       "-n", NAMESPACE, "get", "deployment", NAME, hint=HINT)["spec"]["template"]["metadata"]
                       .get("annotations") or {}),
                   timeout_s=seconds(600), hint=HINT, describe=lambda: describe(kube))  # fmt: skip
        kube("-n", NAMESPACE, "patch", "deployment", NAME, "--type=merge", "-p", json.dumps(to_the_fleet()), hint=HINT)
        pods = wait_until(f"{REPLICAS} pods Ready on the fake nodes", lambda: rolled_out(kube),
                          timeout_s=seconds(900), hint=HINT, interval_s=5)  # fmt: skip
        wait_until(f"the operator counting the {REPLICAS} sidecars", lambda: sidecars_reported(kube, pods),
                   timeout_s=seconds(300), hint=HINT, describe=lambda: describe(kube))  # fmt: skip
        yield pods
    finally:
        timeout = f"--timeout={int(seconds(600))}s"
        kube("-n", NAMESPACE, "delete", "deployment", NAME, "--ignore-not-found", "--cascade=foreground", timeout,
             hint=HINT, timeout_s=seconds(660))  # fmt: skip
        kube("-n", NAMESPACE, "delete", "admissionpolicy", NAME, "--ignore-not-found", timeout,
             hint=f"the policy's finalizer: {OPERATOR_LOGS}", timeout_s=seconds(660))  # fmt: skip
        kube("delete", "namespace", NAMESPACE, "--ignore-not-found", timeout, hint=HINT, timeout_s=seconds(660))
        kube("delete", "node", *(node_name(i) for i in range(NODES)), "--ignore-not-found", timeout, hint=HINT,
             timeout_s=seconds(660))  # fmt: skip


def test_200_gated_pods_on_fake_nodes_and_their_unreachable_sidecars_counted_not_pushed(
    kube: Kube, fleet: list[dict]
) -> None:
    nodes = {node_name(i) for i in range(NODES)}
    assert all(SIDECAR in [c["name"] for c in p["spec"]["containers"]] for p in fleet), "a pod without the gate"
    assert {p["spec"]["nodeName"] for p in fleet} <= nodes, "a fleet pod on the real node"
    assert all(ip_address(p["status"]["podIP"]) in LOOPBACK for p in fleet), "a fake pod's address off loopback"
    assert max(sum(p["spec"]["nodeName"] == n for p in fleet) for n in nodes) <= NODE_PODS
    # Every push is refused (nothing listens on those addresses in the operator's network
    # namespace): counted as not pushed, with the reason, never as acknowledged.
    status = wait_until("a sidecar reported unreachable",
                        lambda: (s := sidecars_reported(kube, fleet)) and any(
                            b["reason"].startswith("unreachable") for b in s["sidecars"]["behind"]) and s,
                        timeout_s=seconds(180), hint=HINT, describe=lambda: describe(kube))  # fmt: skip
    pushed = next(c for c in status["conditions"] if c["type"] == "ThresholdsPushed")
    print(f"\nthe operator on {REPLICAS} unreachable sidecars: pushed {status['pushed']}; "
          f"ThresholdsPushed={pushed['status']} ({pushed['reason']}: {pushed['message'][:300]})")  # fmt: skip
    assert status["pushed"] == f"0/{REPLICAS}", status["pushed"]
    assert status["sidecars"]["acknowledged"] == 0
    assert (pushed["status"], pushed["reason"]) == ("False", "PushPending"), pushed


@pytest.mark.usefixtures("fleet")
def test_a_rolling_restart_of_200_pods_gates_every_new_pod_at_a_pass_per_coalescing_window(kube: Kube) -> None:
    settings, crashes = operator_settings(kube), restarts(kube)
    watch = PodWatch(kube)
    try:
        wait_until("the pod watch's first listing", lambda: len(watch.seen()) >= REPLICAS, timeout_s=seconds(120),
                   hint="kubectl get pods -w")  # fmt: skip
        before, old = set(watch.seen()), newest_hash(kube)
        wait_for_quiet(kube, QUIET_S, limit_s=seconds(120))  # a wait: the rollout starts from a settled operator
        meter = Meter(kube, settings)
        kube("-n", NAMESPACE, "rollout", "restart", f"deployment/{NAME}", hint=HINT)
        pods = wait_until("the rollout complete", lambda: (p := rolled_out(kube)) and newest_hash(kube) != old and p,
                          timeout_s=seconds(900), hint=HINT, interval_s=2)  # fmt: skip
        rollout_s = time.monotonic() - meter.started
        new = newest_hash(kube)
        assert all(p["metadata"]["labels"]["pod-template-hash"] == new for p in pods)
        wait_until("the operator counting the new pods", lambda: sidecars_reported(kube, pods),
                   timeout_s=seconds(300), hint=HINT, describe=lambda: describe(kube))  # fmt: skip
        quiet = wait_for_quiet(kube, QUIET_S, limit_s=seconds(300))
        window = meter.close()
        idle = Meter(kube, settings)  # what the operator does once nothing changes:
        time.sleep(IDLE_S)  # a window to count its passes in, not a wait for anything
        steady, warned = idle.close(), push_warnings(kube, IDLE_S)
    finally:
        watch.close()
    created = {uid: seen for uid, seen in watch.seen().items() if uid not in before}
    ungated = sorted(name for name, _, containers in created.values() if SIDECAR not in containers)
    of_new = [name for name, rs_hash, _ in created.values() if rs_hash == new]
    coalesce = settings.coalesce_seconds
    print(f"\nrolling restart of {REPLICAS} gated pods (kwok nodes, real API server and controllers): "
          f"{len(created)} pods created ({len(of_new)} of the new ReplicaSet), {len(ungated)} without the gate "
          f"(the watch resumed {watch.rewatches} times); "
          f"rollout complete after {rollout_s:.0f} s, operator quiet {'after' if quiet else 'NOT within'} "
          f"{window.seconds:.0f} s (coalesce_seconds {coalesce:g})\n  rollout: {window.line()}\n"
          f"  idle afterwards: {steady.line()}\n  push failures logged in the last {IDLE_S:g} s: {warned}")  # fmt: skip
    assert not ungated, f"pods admitted without the gate during the rollout: {ungated[:10]}"
    assert len(of_new) >= REPLICAS, f"the new ReplicaSet created {len(of_new)} pods"
    assert all(rs_hash == new for _, rs_hash, _ in created.values()), "an old ReplicaSet created pods"
    assert restarts(kube) == crashes, "an operator container restarted during the rollout"
    assert window.total_passes >= 1, "the operator made no pass over the rollout"
    # The bound of test_rollout_cost.py: a woken policy waits coalesce_seconds for the rest of
    # the events, so a rollout costs at most a pass per window it lasts, and one more.
    assert window.total_passes <= window.seconds / coalesce + 2, window.line()
    assert steady.total_passes <= steady.seconds / coalesce + 2, steady.line()
