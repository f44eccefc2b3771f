"""What a rolling update of one gated Deployment of 200 pods costs the operator: its reconcile
passes and its API calls, counted from the rollout's first write until the operator is quiet.

A pass lists every gated pod, so a pass per pod event would make a rollout's cost grow with
the square of its pods (the second review counted 124 passes for 200 kubelet writes over 20
pods). The test plays, on the real API server, what ``kubectl rollout restart`` sets off with
the default strategy (maxSurge and maxUnavailable 25%: four steps of 50 pods): the Deployment
controller creates each new pod and marks an old one for deletion; the scheduler binds the new
pod; its kubelet writes it Pending (hostIP), Running (podIP, containers running), Ready (the
conditions only), then twice for a probe time; the old pod's kubelet writes it terminated and
deletes it; the controller writes the Deployment's status twice a step. Every one of these
2,000 pod writes is a watch event of the operator's pod handler (the last delete of a pod is
two). Counts only, never how long it took.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import pytest
from counting_sidecars import CountingSidecars
from operator_flows import policy, status_of
from test_operator_cost import QUIET, quiet

from api_cluster import DEPLOYMENTS, NS, OPERATOR_AGENT, PODS, POLICIES, Cluster
from canned_profiles import smollm2_profile
from kopf_thread import passes, running_operator
from manifests import admission_policy, llama_deployment
from polling import eventually
from slogate_calibration.output import compact_json
from slogate_operator import names
from slogate_operator.settings import OperatorSettings
from workload_controllers import complete_job, job_names, now, write_deployment_status

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread
DEFAULT_COALESCE = str(OperatorSettings().coalesce_seconds)  # as the operator runs, not the tests' 0.05

NAME, REPLICAS, STEP = "smollm2", 200, 50  # a step: 25% surge, 25% unavailable (Kubernetes' defaults)
OLD, NEW = "6b9f7c5d48", "7d4c9b8f66"  # the pod-template-hash of the two ReplicaSets
NEW_POD_WRITES = ("pending", "running", "ready", "probe", "probe")  # its kubelet's, after create and bind
STAMP = "2026-12-05T00:00:00Z"
OPERATOR = (OPERATOR_AGENT, "kopf/")


class Fleet(CountingSidecars):
    """CountingSidecars on as many loopback addresses as the rollout needs (its own stop at 245)."""

    def __init__(self, cluster: Cluster, count: int) -> None:
        super().__init__(cluster, 0)
        self.ips = [f"127.0.{1 + i // 200}.{10 + i % 200}" for i in range(count)]
        self._runners = [cluster.loop.run(self._start(ip)) for ip in self.ips]


def node_of(index: int) -> tuple[str, str]:
    """(name, IP) of the node a pod runs on: 20 nodes."""
    return f"node-{index % 20}", f"10.0.0.{10 + index % 20}"


def template_of(cluster: Cluster) -> dict[str, Any]:
    return dict(cluster.get(DEPLOYMENTS, NAME)["spec"]["template"])


def create_pod(cluster: Cluster, template: dict[str, Any], rs_hash: str, index: int, node: str = "") -> dict[str, Any]:
    """A pod of the ReplicaSet, as its controller creates it (``node``: bound already), as stored."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{NAME}-{rs_hash}", "controller": True,
             "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, rs_hash)), "blockOwnerDeletion": True}  # fmt: skip
    meta = {"name": f"{NAME}-{rs_hash}-{index:05d}", "ownerReferences": [owner],
            "labels": {**template["metadata"]["labels"], "pod-template-hash": rs_hash},
            "annotations": dict(template["metadata"].get("annotations") or {})}  # fmt: skip
    spec = {**template["spec"], "nodeName": node} if node else template["spec"]
    return cluster.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def gated(cluster: Cluster) -> bool:
    """A pod created now gets the sidecar (the pass after the one that says Ready may inject it)."""
    pod = create_pod(cluster, template_of(cluster), "trial", 0)
    cluster.delete(PODS, pod["metadata"]["name"])  # unbound: gone at once
    return names.SIDECAR_CONTAINER in {c["name"] for c in pod["spec"]["containers"]}


def kubelet_writes(cluster: Cluster, pod: dict[str, Any], index: int, ip: str, stage: str, *, n: int = 0) -> None:
    """The pod's status as its kubelet writes it at ``stage`` (pending, running, ready, probe,
    terminated), whole, as the kubelet's patch leaves it."""
    running, ready = stage in ("running", "ready", "probe"), stage in ("ready", "probe")
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": STAMP, "finishedAt": STAMP}}
    if stage == "pending":
        init_state = main_state = {"waiting": {"reason": "PodInitializing"}}
    else:
        init_state, main_state = done, ({"running": {"startedAt": STAMP}} if running else done)

    def condition(kind: str, ok: bool) -> dict[str, Any]:
        probed = f"2026-12-05T00:01:{n:02d}Z" if stage == "probe" and kind == "Ready" else None
        return {"type": kind, "status": "True" if ok else "False", "lastProbeTime": probed, "lastTransitionTime": STAMP}

    def statuses(key: str, state: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0, "state": state}
                for c in pod["spec"].get(key) or ()]  # fmt: skip

    host = node_of(index)[1]
    status = {
        "phase": {"pending": "Pending", "terminated": "Succeeded"}.get(stage, "Running"),
        "hostIP": host, "hostIPs": [{"ip": host}], "startTime": STAMP,
        "conditions": [condition("PodReadyToStartContainers", stage != "pending"),
                       condition("Initialized", stage != "pending"), condition("Ready", ready),
                       condition("ContainersReady", ready), condition("PodScheduled", True)],
        "initContainerStatuses": statuses("initContainers", init_state),
        "containerStatuses": statuses("containers", main_state),
    }  # fmt: skip
    if stage != "pending":
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    cluster.patch(PODS, pod["metadata"]["name"], {"status": status}, sub="status")


def progressing(cluster: Cluster, ready: int) -> None:
    """The Deployment controller's status write mid-rollout (updatedReplicas as the helper writes it)."""
    stamp = now()
    conditions = [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
         "message": "Deployment has minimum availability.", "lastUpdateTime": stamp, "lastTransitionTime": stamp},
        {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
         "message": f'ReplicaSet "{NAME}-{NEW}" is progressing.', "lastUpdateTime": stamp, "lastTransitionTime": stamp},
    ]  # fmt: skip
    write_deployment_status(cluster, NAME, replicas=REPLICAS, ready_replicas=ready, conditions=conditions)


def roll_out(cluster: Cluster, old: dict[int, dict[str, Any]], ips: list[str]) -> None:
    """``kubectl rollout restart``, then the controllers, the scheduler and the kubelets, step by step."""
    restarted = {"kubectl.kubernetes.io/restartedAt": STAMP}
    cluster.patch(DEPLOYMENTS, NAME, {"spec": {"template": {"metadata": {"annotations": restarted}}}})
    template = template_of(cluster)
    for first in range(0, REPLICAS, STEP):
        batch = range(first, first + STEP)
        new = {i: create_pod(cluster, template, NEW, i) for i in batch}
        for i in batch:  # the old ReplicaSet scaled down: its pods marked for deletion (their grace period)
            cluster.delete(PODS, old[i]["metadata"]["name"])
        progressing(cluster, ready=REPLICAS - STEP)
        for i, pod in new.items():  # the scheduler
            name, node = pod["metadata"]["name"], {"apiVersion": "v1", "kind": "Node", "name": node_of(i)[0]}
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": node}
            cluster.create(f"{PODS}/{name}/binding", binding)
        for i in batch:  # the old pods' kubelets: containers stopped, then the pod deleted
            kubelet_writes(cluster, old[i], i, ips[i], "terminated")
            cluster.request("DELETE", f"{PODS.format(ns=NS)}/{old[i]['metadata']['name']}?gracePeriodSeconds=0")
        for n, stage in enumerate(NEW_POD_WRITES):  # the new pods' kubelets, on 20 nodes at once
            for i, pod in new.items():
                kubelet_writes(cluster, pod, i, ips[REPLICAS + i], stage, n=n)
        progressing(cluster, ready=REPLICAS)
    write_deployment_status(cluster, NAME)  # NewReplicaSetAvailable


def by_verb(calls: Counter[tuple[str, str]]) -> str:
    return f"{sum(calls.values())}: " + ", ".join(f"{verb} {res} x{n}" for (verb, res), n in sorted(calls.items()))


def test_a_rollout_of_200_gated_pods_costs_a_pass_per_coalescing_window(cluster: Cluster) -> None:
    fleet = Fleet(cluster, 2 * REPLICAS)  # the old pods' addresses, then the new pods'
    full = f"{REPLICAS}/{REPLICAS}"
    try:
        with running_operator(cluster, **QUIET, COALESCE_SECONDS=DEFAULT_COALESCE):
            cluster.create(DEPLOYMENTS, llama_deployment(replicas=REPLICAS))
            cluster.create(POLICIES, admission_policy(sidecar={"adminPort": fleet.port}))
            (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
            complete_job(cluster, job, compact_json(smollm2_profile()))
            eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready")
            eventually(lambda: gated(cluster), interval=0.5, what="new pods gated")
            template, old = template_of(cluster), {}
            for i in range(REPLICAS):  # 200 gated pods, bound, Running and Ready: two writes each
                old[i] = create_pod(cluster, template, OLD, i, node=node_of(i)[0])
                kubelet_writes(cluster, old[i], i, fleet.ips[i], "ready")
            write_deployment_status(cluster, NAME)
            eventually(lambda: policy(cluster)["status"].get("pushed") == full, timeout=120, what=f"pushed {full}")
            quiet(cluster)
            before, mark = passes(NAME), cluster.call_mark()
            generation = cluster.get(DEPLOYMENTS, NAME)["metadata"]["generation"]

            started = time.monotonic()
            roll_out(cluster, old, fleet.ips)
            played_s = time.monotonic() - started
            eventually(lambda: policy(cluster)["status"].get("pushed") == full, timeout=120, what=f"pushed {full}")
            quiet(cluster)
            made, log = passes(NAME) - before, cluster.received()[mark:]
            assert status_of(cluster, "ThresholdsPushed") == "True"
            assert cluster.get(DEPLOYMENTS, NAME)["metadata"]["generation"] == generation + 1  # one rollout
    finally:
        fleet.close()
    ours, kopfs = cluster.api_calls(mark), cluster.api_calls(mark, agent="kopf/")
    played = Counter((c.verb, c.rbac_resource) for c in log
                     if c.resource is not None and c.verb != "get" and not c.agent.startswith(OPERATOR))  # fmt: skip
    pod_writes = sum(n for (_, resource), n in played.items() if resource.startswith("pods"))
    print(f"\nrollout of {REPLICAS} gated pods: {made:g} passes for {pod_writes} pod writes in {played_s:.0f} s")
    print(f"  operator's client: {by_verb(ours)}\n  kopf: {by_verb(kopfs)}\n  played: {by_verb(played)}")
    assert pod_writes == REPLICAS * (2 + len(NEW_POD_WRITES) + 3)  # new: create, bind, 5; old: mark, stop, delete
    # The bound is the coalescing window's, whatever the number of pod events: a woken policy
    # waits coalesce_seconds for the rest before its pass, so a rollout costs at most one pass
    # per window it lasts, and one more for the last event (the count is compared with how
    # long the writes took here, never the time itself). Measured 15 passes for these 2,000
    # writes; 184-209 with the pod-event filter alone (99f93da), 251-305 before it (7a7f7dc).
    assert made <= played_s / float(DEFAULT_COALESCE) + 2
