"""Helpers of the operator tests: read a policy's state, play a rollout, a calibration."""

from __future__ import annotations

from typing import Any

import jsonschema

from api_cluster import CONFIGMAPS, DEPLOYMENTS, EVENTS, POLICIES, Cluster
from canned_profiles import smollm2_profile
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from project_files import SCHEMA
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_calibration.output import compact_json
from slogate_operator import names
from workload_controllers import complete_job, job_names

ARGS_T1 = ["-m", "/model/SmolLM2-135M-Instruct.Q4_1.gguf", "--host", "0.0.0.0", "--port", "8080",
           "-t", "1", "-np", "4", "-c", "8192", "--metrics"]  # fmt: skip


def policy(cluster: Cluster, name: str = "smollm2") -> dict[str, Any]:
    found = cluster.get(POLICIES, name)
    assert found is not None
    return found


def status_of(cluster: Cluster, kind: str, name: str = "smollm2") -> str:
    return str(condition(cluster.get(POLICIES, name), kind).get("status"))


def thresholds_in(cluster: Cluster, name: str = "smollm2") -> Thresholds | None:
    cm = cluster.get(CONFIGMAPS, f"{name}-thresholds")
    text = ((cm or {}).get("data") or {}).get(names.THRESHOLDS_KEY)
    return Thresholds.model_validate_json(text) if text else None


def slower(profile: CalibrationProfile, factor: float, new_id: str) -> CalibrationProfile:
    """The same server at ``factor`` times the cost per token (e.g. one thread instead of two)."""
    prefill = profile.prefill.model_copy(
        update={"linear_s": profile.prefill.linear_s * factor, "quadratic_s": profile.prefill.quadratic_s * factor}
    )
    decode = tuple(p.model_copy(update={"tokens_per_second": p.tokens_per_second / factor}) for p in profile.decode)
    return profile.model_copy(update={"id": new_id, "fingerprint": "1" * 16, "prefill": prefill, "decode": decode})


def apply_and_calibrate(
    cluster: Cluster, profile: CalibrationProfile | None = None, *, create_deployment: bool = True, **spec: Any
) -> str:
    """Deployment (unless the test made it) + policy, then the first calibration completes with ``profile``."""
    if create_deployment:
        cluster.create(DEPLOYMENTS, llama_deployment())
    cluster.create(POLICIES, admission_policy(**spec))
    (job,) = eventually(lambda: job_names(cluster), what="a calibration Job")
    complete_job(cluster, job, compact_json(profile or smollm2_profile()))
    eventually(lambda: status_of(cluster, "Ready") == "True", what="Ready")
    return job


def current_job(cluster: Cluster, name: str = "smollm2") -> str:
    """The Job of the calibration under way, once the status names it and it exists."""

    def found() -> str | None:
        job = ((policy(cluster, name).get("status") or {}).get("calibrating") or {}).get("job")
        return job if job in job_names(cluster) else None

    return eventually(found, what="the Job of the calibration under way")


def roll_out(cluster: Cluster, args: list[str], name: str = "smollm2") -> None:
    """A rollout that changes the llama.cpp container's arguments."""
    containers = cluster.get(DEPLOYMENTS, name)["spec"]["template"]["spec"]["containers"]
    containers[0]["args"] = args
    cluster.patch(DEPLOYMENTS, name, {"spec": {"template": {"spec": {"containers": containers}}}})


def events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.list(EVENTS) if e.get("reason") == reason]


def assert_status_fits_the_crd(found: dict[str, Any]) -> None:
    errors = list(jsonschema.Draft4Validator(SCHEMA["properties"]["status"]).iter_errors(found["status"]))
    assert errors == [], [e.message for e in errors]
