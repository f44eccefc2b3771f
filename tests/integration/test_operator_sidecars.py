"""The operator end to end on real parts: a profile measured by the real `slogate calibrate`
against the bundled llama-server (the session's `calibrated_profile`), real sidecars in
front of that llama-server receiving the pushes, and the real operator (kopf) against
a real kube-apiserver (tests/api_cluster.py), with the test playing the Job and Deployment
controllers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from api_cluster import CONFIGMAPS, DEPLOYMENTS, JOBS, POLICIES, Cluster
from kopf_thread import running_operator, settle
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from sidecar_fleet import SidecarFleet
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_calibration.output import compact_json
from slogate_calibration.runtime import LlamaServer
from slogate_operator import names
from workload_controllers import complete_job, gate_of, job_names, run_pods

pytestmark = pytest.mark.kopf_thread  # runs the real operator in a thread

PODS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
ONE_THREAD = ["-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "127.0.0.1", "--port", "8080",
              "-t", "1", "-np", "4", "-c", "8192", "--metrics"]  # fmt: skip


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    yield made
    made.close()


@pytest.fixture
def fleet(cluster: Cluster, llama_server: LlamaServer, tmp_path: Path) -> Iterator[SidecarFleet]:
    made = SidecarFleet(cluster, llama_server.url, tmp_path)
    yield made
    made.close()


def configmap_thresholds(cluster: Cluster) -> Thresholds | None:
    text = ((cluster.get(CONFIGMAPS, "smollm2-thresholds") or {}).get("data") or {}).get(names.THRESHOLDS_KEY)
    return Thresholds.model_validate_json(text) if text else None


def served(fleet: SidecarFleet, ip: str) -> Thresholds | None:
    raw = fleet.state(ip).get("thresholds")
    return Thresholds.model_validate(raw) if raw else None


def slower(profile: CalibrationProfile, factor: float, new_id: str) -> CalibrationProfile:
    """The measured server at ``factor`` times the cost per token: what one thread of two gives."""
    prefill = profile.prefill.model_copy(
        update={"linear_s": profile.prefill.linear_s * factor, "quadratic_s": profile.prefill.quadratic_s * factor}
    )
    decode = tuple(p.model_copy(update={"tokens_per_second": p.tokens_per_second / factor}) for p in profile.decode)
    return profile.model_copy(update={"id": new_id, "prefill": prefill, "decode": decode})


def test_real_calibration_reaches_every_real_sidecar_and_a_rollout_recalibrates(
    cluster: Cluster, fleet: SidecarFleet, calibrated_profile: CalibrationProfile
) -> None:
    with running_operator(cluster):
        cluster.create(DEPLOYMENTS, llama_deployment(replicas=3))
        cluster.create(POLICIES, admission_policy(sidecar={"adminPort": fleet.admin_port}))
        (job,) = eventually(lambda: job_names(cluster), what="the first calibration Job")
        # Calibrated first, gated after: until thresholds exist the pods serve as they are.
        assert gate_of(cluster, "smollm2") is None
        complete_job(cluster, job, compact_json(calibrated_profile))
        eventually(lambda: gate_of(cluster, "smollm2") is not None, what="the pods rolled onto the gate")
        # The pods the webhook injects mount the ConfigMap, which holds the thresholds by now.
        fleet.mount_token()
        boot = cluster.get(CONFIGMAPS, "smollm2-thresholds")["data"]["thresholds.json"]
        for ip in PODS:
            fleet.start(ip, thresholds_json=boot)
        run_pods(cluster, "smollm2", PODS)
        found = eventually(
            lambda: (p := cluster.get(POLICIES, "smollm2")) and p["status"].get("pushed") == "3/3" and p,
            what="3/3 sidecars acknowledged",
        )
        stored = configmap_thresholds(cluster)
        assert stored is not None
        assert stored.calibration_id == calibrated_profile.id
        assert stored.fingerprint == calibrated_profile.fingerprint
        assert found["status"]["thresholds"]["calibrationId"] == calibrated_profile.id
        assert found["status"]["thresholds"]["tokenBudget"] == int(stored.classes[0].token_budget)
        for ip in PODS:
            assert served(fleet, ip) == stored  # the very document of the ConfigMap, not a copy of a copy
        eventually(lambda: condition(cluster.get(POLICIES, "smollm2"), "Ready").get("status") == "True")

        # A pod that starts later boots with the ConfigMap's thresholds and counts as acknowledged.
        fleet.start(
            "127.0.0.4", thresholds_json=cluster.get(CONFIGMAPS, "smollm2-thresholds")["data"]["thresholds.json"]
        )
        run_pods(cluster, "smollm2", ["127.0.0.4"])
        eventually(lambda: cluster.get(POLICIES, "smollm2")["status"].get("pushed") == "4/4")
        assert served(fleet, "127.0.0.4") == stored

        # A label and a replica count change nothing.
        cluster.patch(DEPLOYMENTS, "smollm2", {"metadata": {"labels": {"team": "ml"}}, "spec": {"replicas": 4}})
        settle("smollm2")
        assert job_names(cluster) == [job]

        # A new thread count: a new Job; the sidecars keep the old thresholds until it is done.
        containers = cluster.get(DEPLOYMENTS, "smollm2")["spec"]["template"]["spec"]["containers"]
        containers[0]["args"] = ONE_THREAD
        cluster.patch(DEPLOYMENTS, "smollm2", {"spec": {"template": {"spec": {"containers": containers}}}})
        second = eventually(lambda: [j for j in job_names(cluster) if j != job], what="the recalibration Job")[0]
        assert (
            cluster.get(JOBS, second)["metadata"]["labels"][names.LABEL_FINGERPRINT]
            != (cluster.get(JOBS, job)["metadata"]["labels"][names.LABEL_FINGERPRINT])
        )
        assert all(served(fleet, ip) == stored for ip in [*PODS, "127.0.0.4"])
        remeasured = slower(calibrated_profile, 2.0, calibrated_profile.id + "-t1")
        complete_job(cluster, second, compact_json(remeasured))
        fresh = eventually(
            lambda: (t := configmap_thresholds(cluster)) and t.calibration_id == remeasured.id and t,
            what="new thresholds in the ConfigMap",
        )
        eventually(lambda: all(served(fleet, ip) == fresh for ip in [*PODS, "127.0.0.4"]), what="every sidecar updated")
        assert fresh.prefill_tokens_per_second < stored.prefill_tokens_per_second
        assert fresh.classes[0].token_budget < stored.classes[0].token_budget
        eventually(lambda: cluster.get(POLICIES, "smollm2")["status"].get("pushed") == "4/4")
        eventually(lambda: condition(cluster.get(POLICIES, "smollm2"), "Ready").get("status") == "True")
        assert len(cluster.calls("POST", "jobs")) == 2
