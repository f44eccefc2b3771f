"""Every example under examples/, through the whole lifecycle against the API mock that
behaves like kube-apiserver (defaults, validation, RBAC, the kubelet's probes): apply,
calibrate, Ready, a rollout that recalibrates, removal. A policy-only example gets the
Deployment it names, shaped like examples/smollm2.yaml's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner
from operator_flows import policy, slower, status_of, thresholds_in

from api_cluster import DEPLOYMENTS, POLICIES, Cluster
from canned_profiles import smollm2_profile
from manifests import condition, llama_deployment
from polling import eventually
from project_files import ROOT
from slogate_calibration.output import compact_json
from slogate_operator import names
from workload_controllers import complete_job, containers_of_a_new_pod, gate_of, job_names

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
COLLECTIONS = {
    "Deployment": DEPLOYMENTS,
    "AdmissionPolicy": POLICIES,
    "Service": "/api/v1/namespaces/{ns}/services",
}


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def deployments_for(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The Deployments a policy-only example names or selects (two for a selector)."""
    container = spec.get("container") or "llama"
    if "targetRef" in spec:
        made = [llama_deployment(spec["targetRef"]["name"])]
    else:
        labels = dict(spec["selector"].get("matchLabels") or {})
        for term in spec["selector"].get("matchExpressions") or ():
            labels[term["key"]] = (term.get("values") or ["zone-a"])[0]
        made = [llama_deployment(f"zone-{z}", labels=labels | {"topology.kubernetes.io/zone": z}) for z in "ab"]
    for deployment in made:
        deployment["spec"]["template"]["spec"]["containers"][0]["name"] = container
    return made


def without_status(deployment: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(deployment["spec"]["template"])


@pytest.mark.kopf_thread
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_goes_through_its_lifecycle(path: Path, cluster: Cluster, operator: KopfRunner) -> None:
    docs = documents(path)
    (spec_doc,) = [d for d in docs if d["kind"] == "AdmissionPolicy"]
    name, spec = spec_doc["metadata"]["name"], spec_doc["spec"]
    workload = [d for d in docs if d["kind"] != "AdmissionPolicy"] or deployments_for(spec)
    for doc in workload:
        cluster.create(COLLECTIONS[doc["kind"]], copy.deepcopy(doc))
    targets = [d["metadata"]["name"] for d in workload if d["kind"] == "Deployment"]
    before = {t: without_status(cluster.get(DEPLOYMENTS, t)) for t in targets}
    inject = (spec.get("sidecar") or {}).get("inject", True)

    # Apply: claimed and calibrated; nothing injected before thresholds exist.
    cluster.create(POLICIES, copy.deepcopy(spec_doc))
    (job,) = eventually(lambda: job_names(cluster), what=f"{path.name}: a calibration Job")
    for target in targets:
        deployment = cluster.get(DEPLOYMENTS, target)
        assert deployment["metadata"]["annotations"][names.ANNOTATION_CLAIM] == name
        assert without_status(deployment) == before[target]
    complete_job(cluster, job, compact_json(smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready", name) == "True", what=f"{path.name}: Ready")
    for target in targets:
        containers = containers_of_a_new_pod(cluster, target)
        assert (names.SIDECAR_CONTAINER in containers) == inject, containers
        assert (gate_of(cluster, target) is not None) == inject

    # A rollout that changes the llama.cpp container recalibrates (or, onRollout false, says Stale).
    on_rollout = (spec.get("calibration") or {}).get("onRollout", True)
    for target in targets:
        template = cluster.get(DEPLOYMENTS, target)["spec"]["template"]
        # A new CPU limit: a new thread count for llama.cpp (at least every example's request,
        # or the API server refuses the template).
        template["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "3"
        cluster.patch(
            DEPLOYMENTS, target, {"spec": {"template": {"spec": {"containers": template["spec"]["containers"]}}}}
        )
    if on_rollout:
        second = eventually(lambda: [j for j in job_names(cluster) if j != job], what="a second Job")[0]
        complete_job(cluster, second, compact_json(slower(smollm2_profile(), 2.0, "cal-three-cpus")))
        eventually(lambda: (t := thresholds_in(cluster, name)) is not None and t.calibration_id == "cal-three-cpus")
        eventually(lambda: status_of(cluster, "Ready", name) == "True")
    else:
        eventually(lambda: condition(policy(cluster, name), "Calibrated").get("reason") == "Stale")

    # Removal: every Deployment as the user wrote it (but the rollout's own change), and unclaimed.
    cluster.delete(POLICIES, name)
    eventually(lambda: cluster.get(POLICIES, name) is None, what="the finalizer released")
    for target in targets:
        deployment = cluster.get(DEPLOYMENTS, target)
        expected = before[target]
        expected["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "3"
        assert without_status(deployment) == expected
        assert names.ANNOTATION_CLAIM not in (deployment["metadata"].get("annotations") or {})
    assert cluster.forbidden == []
    cluster.assert_kubelet_could_run()


def test_examples_cover_every_mode() -> None:
    """Injected and self-managed, targetRef and selector: the lifecycle test meets each."""
    specs = [d["spec"] for p in EXAMPLES for d in documents(p) if d["kind"] == "AdmissionPolicy"]
    assert {bool((s.get("sidecar") or {}).get("inject", True)) for s in specs} == {True, False}
    assert {"targetRef" in s for s in specs} == {True, False}
