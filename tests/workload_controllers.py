"""The controllers Kubernetes would run, played by the tests against an emulated cluster:
the Job controller and the scheduler/kubelet for a calibration Job's pod, the Deployment
controller for a Deployment's pods and status, KEDA's operator (the HPA it makes for a
ScaledObject) and the HPA controller (its status). Every write goes through the API as
theirs would (pods created from the template, status through /status)."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from api_cluster import DEPLOYMENTS, HPAS, JOBS, NS, PODS, SCALED_OBJECTS, Cluster
from slogate_operator import names


def now() -> str:
    """A timestamp as the API server writes them (whole seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------ Jobs


def job_names(cluster: Cluster, ns: str = NS) -> list[str]:
    return sorted(j["metadata"]["name"] for j in cluster.list(JOBS, ns))


def _job_pod(cluster: Cluster, job_name: str, ns: str) -> str:
    """Create a pod of the Job as the Job controller does: the template, owned by the Job."""
    job = cluster.get(JOBS, job_name, ns)
    assert job is not None, f"no Job {job_name}"
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{job_name}-{uuid.uuid4().hex[:5]}",
            "labels": dict(job["spec"]["template"]["metadata"]["labels"]),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                 "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": job["spec"]["template"]["spec"],
    }  # fmt: skip
    return str(cluster.create(PODS, pod, ns)["metadata"]["name"])


def job_pod(cluster: Cluster, job_name: str, calibrator: dict[str, Any], phase: str, ns: str = NS) -> dict[str, Any]:
    """The Job's pod (as the Job controller), then its status with the calibrator container
    in the given terminated state (as the kubelet)."""
    name = _job_pod(cluster, job_name, ns)
    status = {"phase": phase, "containerStatuses": [
        {"name": names.CALIBRATOR_CONTAINER, "ready": False, "restartCount": 0, "image": "slogate",
         "imageID": "", "state": {"terminated": calibrator}},
    ]}  # fmt: skip
    return cluster.patch(PODS, name, {"status": status}, ns, sub="status")


def pending_job_pod(
    cluster: Cluster, job_name: str, reason: str = "Unschedulable", message: str = "", ns: str = NS
) -> dict[str, Any]:
    """The Job's pod, created and left Pending by the scheduler (PodScheduled False with
    ``reason`` and ``message``, e.g. "0/3 nodes are available: 3 Insufficient cpu.")."""
    name = _job_pod(cluster, job_name, ns)
    scheduled = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                 "lastTransitionTime": now()}  # fmt: skip
    status = {"phase": "Pending", "conditions": [scheduled]}
    return cluster.patch(PODS, name, {"status": status}, ns, sub="status")


def complete_job(cluster: Cluster, job_name: str, message: str, ns: str = NS) -> None:
    """The calibrator exited 0 with ``message`` as its termination message; the Job completes."""
    job_pod(cluster, job_name, {"exitCode": 0, "reason": "Completed", "message": message}, "Succeeded", ns)
    stamp = now()
    conditions = [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": stamp},
                  {"type": "Complete", "status": "True", "lastTransitionTime": stamp}]  # fmt: skip
    # The API server refuses a finished Job without its start and (when Complete) completion time.
    status = {"startTime": started(cluster, job_name, ns), "completionTime": stamp, "succeeded": 1,
              "conditions": conditions}  # fmt: skip
    cluster.patch(JOBS, job_name, {"status": status}, ns, sub="status")


def fail_job(
    cluster: Cluster, job_name: str, log_tail: str, reason: str = "BackoffLimitExceeded", ns: str = NS
) -> None:
    """The calibrator failed (its log tail is the message); the Job fails with ``reason``."""
    job_pod(cluster, job_name, {"exitCode": 2, "reason": "Error", "message": log_tail}, "Failed", ns)
    stamp, message = now(), "Job has reached the specified backoff limit"
    # As the Job controller since 1.31: FailureTarget first (the API server refuses Failed without it).
    conditions = [{"type": "FailureTarget", "status": "True", "reason": reason, "message": message,
                   "lastTransitionTime": stamp},
                  {"type": "Failed", "status": "True", "reason": reason, "message": message,
                   "lastTransitionTime": stamp}]  # fmt: skip
    status = {"startTime": started(cluster, job_name, ns), "failed": 1, "conditions": conditions}
    cluster.patch(JOBS, job_name, {"status": status}, ns, sub="status")


def started(cluster: Cluster, job_name: str, ns: str) -> str:
    """The Job's status.startTime: the one it has, or its creation (the controller's first sync)."""
    job = cluster.get(JOBS, job_name, ns)
    assert job is not None, f"no Job {job_name}"
    return str((job.get("status") or {}).get("startTime") or job["metadata"]["creationTimestamp"])


# ------------------------------------------------------------------------------ Deployments


def create_pod(cluster: Cluster, deployment_name: str, index: int = 0, ns: str = NS) -> dict[str, Any]:
    """A pod of the Deployment's current template, created as its ReplicaSet would, as the API
    server stored it: after the admission webhooks (the operator's injects the gate)."""
    deployment = cluster.get(DEPLOYMENTS, deployment_name, ns)
    assert deployment is not None
    template = deployment["spec"]["template"]
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{deployment_name}-{index}-{uuid.uuid4().hex[:5]}",
                     "labels": dict(template["metadata"]["labels"]),
                     "annotations": dict(template["metadata"].get("annotations") or {})},
        "spec": template["spec"],
    }  # fmt: skip
    return cluster.create(PODS, pod, ns)


def run_pods(cluster: Cluster, deployment_name: str, ips: list[str], ns: str = NS) -> list[str]:
    """Running pods of the Deployment's current template, one per IP; their sidecars run."""
    made = []
    for index, ip in enumerate(ips):
        pod = create_pod(cluster, deployment_name, index, ns)
        statuses = [
            {"name": c["name"], "ready": False, "restartCount": 0, "image": c["image"], "imageID": "",
             "state": {"running": {"startedAt": now()}}}
            for c in pod["spec"]["containers"]
        ]  # fmt: skip
        name = pod["metadata"]["name"]
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "containerStatuses": statuses}
        cluster.patch(PODS, name, {"status": status}, ns, sub="status")
        made.append(name)
    return made


def ready_pod(cluster: Cluster, deployment_name: str, startup_s: float, index: int = 0, ns: str = NS) -> str:
    """A pod of the Deployment that the kubelet reported Ready ``startup_s`` after its creation."""
    pod = create_pod(cluster, deployment_name, index, ns)
    created = datetime.datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    ready = (created + datetime.timedelta(seconds=startup_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    statuses = [
        {"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"], "imageID": "",
         "state": {"running": {"startedAt": pod["metadata"]["creationTimestamp"]}}}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip
    conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready}]
    # No podIP: nothing is pushed to it (tests contact only loopback; pods that serve are run_pods').
    status = {"phase": "Running", "containerStatuses": statuses, "conditions": conditions}
    cluster.patch(PODS, pod["metadata"]["name"], {"status": status}, ns, sub="status")
    return str(pod["metadata"]["name"])


def gate_of(cluster: Cluster, deployment_name: str, ns: str = NS) -> str | None:
    """The gate annotation of the Deployment's pod template: set while its pods are to be gated."""
    deployment = cluster.get(DEPLOYMENTS, deployment_name, ns)
    assert deployment is not None
    return (deployment["spec"]["template"]["metadata"].get("annotations") or {}).get(names.ANNOTATION_GATE)


def containers_of_a_new_pod(cluster: Cluster, deployment_name: str, ns: str = NS) -> list[str]:
    """The containers a pod of the Deployment gets when created now (the pod is deleted again)."""
    pod = create_pod(cluster, deployment_name, 99, ns)
    cluster.delete(PODS, pod["metadata"]["name"], ns)
    return [c["name"] for c in pod["spec"]["containers"]]


def write_deployment_status(
    cluster: Cluster,
    name: str,
    *,
    replicas: int | None = None,
    ready_replicas: int | None = None,
    observed_generation: int | None = None,
    conditions: list[dict[str, Any]] | None = None,
    ns: str = NS,
) -> dict[str, Any]:
    """The Deployment controller's status write, through /status (a status-only watch
    event, no new generation). Defaults: the spec's replicas, all ready, the current
    generation observed, Available and Progressing."""
    deployment = cluster.get(DEPLOYMENTS, name, ns)
    assert deployment is not None, f"no Deployment {name}"
    replicas = int(deployment["spec"].get("replicas", 1)) if replicas is None else replicas
    ready = replicas if ready_replicas is None else ready_replicas
    stamp = now()
    status: dict[str, Any] = {
        "observedGeneration": deployment["metadata"]["generation"] if observed_generation is None
        else observed_generation,
        "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready, "availableReplicas": ready,
        "conditions": conditions if conditions is not None else [
            {"type": "Available", "status": "True" if ready else "False", "reason": "MinimumReplicasAvailable",
             "message": "Deployment has minimum availability.", "lastUpdateTime": stamp, "lastTransitionTime": stamp},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
             "message": f'ReplicaSet "{name}" has successfully progressed.', "lastUpdateTime": stamp,
             "lastTransitionTime": stamp},
        ],
    }  # fmt: skip
    if ready < replicas:
        status["unavailableReplicas"] = replicas - ready
    # A whole-status replacement, as the controller's UpdateStatus.
    return cluster.json_patch(DEPLOYMENTS, name, [{"op": "add", "path": "/status", "value": status}], ns, sub="status")


# ------------------------------------------------------------------------------ autoscalers


def keda_makes_hpa(cluster: Cluster, scaled_object: str, ns: str = NS) -> dict[str, Any]:
    """KEDA's operator: the HPA ``keda-hpa-<name>`` of a ScaledObject, owned by it, on the
    External metric KEDA's metrics server serves (``s0-prometheus``) at the trigger's threshold."""
    found = cluster.get(SCALED_OBJECTS, scaled_object, ns)
    assert found is not None, f"no ScaledObject {scaled_object}"
    spec = found["spec"]
    (trigger,) = spec["triggers"]
    metric = {"name": "s0-prometheus",
              "selector": {"matchLabels": {"scaledobject.keda.sh/name": scaled_object}}}  # fmt: skip
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": f"keda-hpa-{scaled_object}",
            "labels": {"scaledobject.keda.sh/name": scaled_object},
            "ownerReferences": [{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": scaled_object,
                                 "uid": found["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "scaleTargetRef": spec["scaleTargetRef"],
            "minReplicas": spec["minReplicaCount"], "maxReplicas": spec["maxReplicaCount"],
            "metrics": [{"type": "External", "external": {
                "metric": metric, "target": {"type": "AverageValue", "averageValue": trigger["metadata"]["threshold"]},
            }}],
            "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
        },
    }  # fmt: skip
    return cluster.create(HPAS, hpa, ns)


def hpa_reports(
    cluster: Cluster, name: str, *, current: int, desired: int, conditions: list[dict[str, Any]] | None = None,
    ns: str = NS,
) -> dict[str, Any]:  # fmt: skip
    """The HPA controller's status write (through /status): the replicas it saw and wants, and
    its conditions (e.g. ScalingActive False, AmbiguousSelector)."""
    stamped = [{"lastTransitionTime": now(), **c} for c in conditions or ()]
    status = {"currentReplicas": current, "desiredReplicas": desired, "lastScaleTime": now(),
              "currentMetrics": [], "conditions": stamped}  # fmt: skip
    return cluster.json_patch(HPAS, name, [{"op": "add", "path": "/status", "value": status}], ns, sub="status")
