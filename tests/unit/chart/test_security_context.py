"""Every container slogate runs is restricted: the operator's injected sidecar and its
calibrator container, built by the operator's own builders, and the chart's containers,
whose securityContext must equal the operator's (docs/deploy.md says they are the same).

The chart's rendered workloads are checked container by container, for the defaults and
every ci/ file, by test_chart_render.py::test_every_container_runs_restricted; not repeated.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from chart_tools import CI_VALUES, load_values, render

from manifests import llama_deployment
from slogate_operator import builders, names
from slogate_operator.fingerprint import container_fingerprint, llama_container
from slogate_operator.injection import SidecarConfig, injected_template

SIDECAR = SidecarConfig(
    policy="smollm2", image="slogate:0.1.0", port=8081, admin_port=8082,
    upstream_port=8080, prompt_counting="tokenize", token_secret="slogate-admin-token", llama_container="llama",
)  # fmt: skip
POLICY = builders.PolicyRef(name="smollm2", namespace="llm", uid="0f0e0d0c-0000-4000-8000-000000000001")


def violations(container: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> list[str]:
    """What keeps a container from the restricted profile we promise (empty: none).

    runAsNonRoot and seccompProfile may come from the pod (the container's own value wins);
    the rest are container-only fields.
    """
    own = container.get("securityContext") or {}
    pod = pod_spec.get("securityContext") or {}
    found: list[str] = []
    if own.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
        found.append("runAsNonRoot is not true")
    if own.get("runAsUser", pod.get("runAsUser")) == 0:
        found.append("runAsUser is 0")
    if own.get("readOnlyRootFilesystem") is not True:
        found.append("readOnlyRootFilesystem is not true")
    if own.get("allowPrivilegeEscalation") is not False:
        found.append("allowPrivilegeEscalation is not false")
    if (own.get("capabilities") or {}).get("drop") != ["ALL"]:
        found.append("capabilities do not drop ALL")
    if (own.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        found.append("seccompProfile is not RuntimeDefault")
    return found


def calibration_pod(deployment: dict[str, Any]) -> dict[str, Any]:
    llama = llama_container(deployment["spec"]["template"]["spec"], None)
    request = builders.CalibrationRequest(
        policy=POLICY, deployment=deployment["metadata"]["name"], llama=llama,
        container_fingerprint=container_fingerprint(llama), image="slogate:0.1.0",
        timeout_seconds=300, budget_seconds=90, ttl_seconds=3600,
    )  # fmt: skip
    pod: dict[str, Any] = builders.calibration_job(request)["spec"]["template"]["spec"]
    return pod


def restricted_deployment() -> dict[str, Any]:
    """A llama.cpp Deployment that already runs restricted (pod-level seccomp and non-root)."""
    deployment: dict[str, Any] = llama_deployment()
    spec = deployment["spec"]["template"]["spec"]
    spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
    for container in [*spec["initContainers"], *spec["containers"]]:
        container["securityContext"] = {
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
        }  # fmt: skip
    return deployment


@pytest.mark.parametrize("target", ["plain", "restricted"])
def test_injected_sidecar_runs_restricted_whatever_the_target(target: str) -> None:
    """The sidecar carries its whole context itself: a pod without one gains nothing from it."""
    deployment = llama_deployment() if target == "plain" else restricted_deployment()
    original = deployment["spec"]["template"]["spec"]
    before = {c["name"] for c in [*original["initContainers"], *original["containers"]]}
    spec = injected_template(deployment["spec"]["template"], SIDECAR)["spec"]
    added = [c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] not in before]
    assert [c["name"] for c in added] == [names.SIDECAR_CONTAINER]
    (sidecar,) = added
    assert violations(sidecar, spec) == []
    assert violations(sidecar, {}) == []  # not borrowed from the pod
    # The llama.cpp container loses its port's name to the sidecar, nothing of its security.
    (llama,) = [c for c in spec["containers"] if c["name"] == "llama"]
    (before_llama,) = [c for c in original["containers"] if c["name"] == "llama"]
    assert llama.get("securityContext") == before_llama.get("securityContext")
    assert spec.get("securityContext") == original.get("securityContext")
    # A read-only root needs somewhere to write: /tmp is an emptyDir.
    assert any(m["mountPath"] == "/tmp" for m in sidecar["volumeMounts"])


@pytest.mark.parametrize("target", ["plain", "restricted"])
def test_calibrator_container_runs_restricted_whatever_the_target(target: str) -> None:
    pod = calibration_pod(llama_deployment() if target == "plain" else restricted_deployment())
    (calibrator,) = [c for c in pod["containers"] if c["name"] == names.CALIBRATOR_CONTAINER]
    assert violations(calibrator, pod) == []
    assert violations(calibrator, {}) == []
    assert any(m["mountPath"] == "/tmp" for m in calibrator["volumeMounts"])


def test_a_restricted_target_gets_a_wholly_restricted_calibration_pod() -> None:
    """The Job copies the target's llama.cpp and model-feeding containers with their own
    securityContext (the measurement must be of the real thing): it never weakens them."""
    pod = calibration_pod(restricted_deployment())
    every = [*pod["initContainers"], *pod["containers"]]
    assert len(every) == 3  # the model copier, llama-server (native sidecar), the calibrator
    for container in every:
        assert violations(container, pod) == [], container["name"]


def test_chart_containers_carry_exactly_the_operators_security_context() -> None:
    for values_file in [None, *CI_VALUES]:
        objects = render(load_values(values_file) if values_file else {})
        for workload in (o for o in objects if o.kind == "Deployment"):
            spec = workload.obj["spec"]["template"]["spec"]
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                assert container["securityContext"] == builders.RESTRICTED_SECURITY, (values_file, container["name"])


def test_the_check_finds_each_missing_setting() -> None:
    """violations() can fail: drop any one setting from a restricted container and it says so."""
    container = {"name": "c", "securityContext": copy.deepcopy(builders.RESTRICTED_SECURITY)}
    assert violations(container, {}) == []
    for key in ("runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation", "capabilities", "seccompProfile"):
        loosened = copy.deepcopy(container)
        del loosened["securityContext"][key]
        assert len(violations(loosened, {})) == 1, key
    root = copy.deepcopy(container)
    root["securityContext"]["runAsUser"] = 0
    assert violations(root, {}) == ["runAsUser is 0"]
    # Pod-level settings count when the container has none of its own.
    pod_level = copy.deepcopy(container)
    del pod_level["securityContext"]["seccompProfile"], pod_level["securityContext"]["runAsNonRoot"]
    assert (
        violations(pod_level, {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}})
        == []
    )
