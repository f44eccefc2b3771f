"""The autoscaling step of the end-to-end suite (docs/operator.md, "Autoscaling"), on a
cluster that has neither KEDA nor prometheus-adapter (the suite's real cluster has neither):

1. `engine: hpa`: the operator creates an autoscaling/v2 HPA owned by the policy, aimed at
   the Deployment on the External metric `slogate_demand_pods`; the real HPA controller
   reports on it (current replicas in the policy's status). It cannot read the metric (no
   adapter), so it holds the replicas, which lie within min and max: the Deployment's
   `spec.replicas` stays what it was, and no controller fights over it. Its scale-up window
   is the one derived from the start-up the real kubelet recorded for the pods (creation to
   Ready) + the adapter's 60 s rate window + the controller manager's 15 s sync.
2. `engine: keda`: without KEDA's CRD the policy says so (AutoscalingReady False,
   KedaNotInstalled) and stays Ready: the gate works without the autoscaler. (Where KEDA is
   installed, its ScaledObject is checked instead.)
3. Autoscaling disabled: the operator deletes what it made; status.autoscaling is gone.
"""

from __future__ import annotations

import json
import math
from typing import Any

from cluster_tools import Kube, condition, is_true, wait_until
from suite import APP_NAMESPACE, RELEASE_NAMESPACE, Example, seconds

from slogate_operator import names
from slogate_operator.builders import is_calibration_pod, policy_label_value
from slogate_operator.pod_startup import SETTLED, median_startup_s

OPERATOR_LOGS = f"kubectl -n {RELEASE_NAMESPACE} logs -l app.kubernetes.io/component=operator"
READY = "AutoscalingReady"


def patch_autoscaling(kube: Kube, example: Example, autoscaling: dict[str, Any]) -> None:
    patch = {"spec": {"autoscaling": autoscaling}}
    kube("-n", APP_NAMESPACE, "patch", "admissionpolicy", example.policy, "--type=merge", "-p", json.dumps(patch),
         hint="the CRD's rules for spec.autoscaling: kubectl explain admissionpolicy.spec.autoscaling")  # fmt: skip


def policy(kube: Kube, example: Example) -> dict[str, Any]:
    return kube.json("-n", APP_NAMESPACE, "get", "admissionpolicy", example.policy, hint="kubectl get admpol")


def replicas(kube: Kube, example: Example) -> int:
    deployment = kube.json("-n", APP_NAMESPACE, "get", "deployment", example.deployment, hint="kubectl get deploy")
    return int(deployment["spec"]["replicas"])


def recorded_objects(found: dict[str, Any]) -> list[dict[str, Any]]:
    return list((found.get("status", {}).get("autoscaling") or {}).get("objects") or [])


def hpa_reporting(kube: Kube, example: Example) -> dict[str, Any] | None:
    """The policy once its HPA is recorded and the HPA controller has reported current replicas."""
    found = policy(kube, example)
    objects = recorded_objects(found)
    if len(objects) == 1 and objects[0].get("kind") == "HorizontalPodAutoscaler" and "currentReplicas" in objects[0]:
        return found
    return None


def check_hpa_engine(kube: Kube, example: Example) -> str:
    """The HPA's name, once checked."""
    before = replicas(kube, example)
    patch_autoscaling(kube, example, {"enabled": True, "engine": "hpa", "minReplicas": before,
                                      "maxReplicas": before + 1})  # fmt: skip
    found = wait_until(
        "the policy's HPA made and reported on by the HPA controller",
        lambda: hpa_reporting(kube, example),
        timeout_s=seconds(180),
        hint=f"kubectl -n {APP_NAMESPACE} get hpa; kubectl -n {APP_NAMESPACE} describe admpol {example.policy}; "
        f"{OPERATOR_LOGS}",
    )
    name = recorded_objects(found)[0]["name"]
    hpa = kube.json("-n", APP_NAMESPACE, "get", "hpa", name, hint="kubectl get hpa")
    owners = hpa["metadata"].get("ownerReferences") or []
    assert any(o.get("kind") == "AdmissionPolicy" and o.get("controller") for o in owners), owners
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": example.deployment}
    assert [m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == ["slogate_demand_pods"]
    assert found["status"]["autoscaling"]["currentReplicas"] == before
    check_scale_up_window(kube, example, found["status"]["autoscaling"], hpa)
    assert replicas(kube, example) == before, "the Deployment's spec.replicas moved"
    assert is_true(found, "Ready"), "autoscaling must not take the gate's Ready away"
    return str(name)


def check_scale_up_window(kube: Kube, example: Example, status: dict[str, Any], hpa: dict[str, Any]) -> None:
    """The HPA's scale-up window is derived from the pods' start-up as the kubelet reported it."""
    window = hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"]
    assert status["scaleUpStabilizationSeconds"] == window
    selector = f"{names.LABEL_POLICY}={policy_label_value(example.policy)}"
    listed = kube.json("-n", APP_NAMESPACE, "get", "pods", "-l", selector, hint="kubectl get pods")["items"]
    measured = median_startup_s([p for p in listed if not is_calibration_pod(p)])
    startup = status.get("podStartupSeconds")
    if startup is None:  # no pod became Ready once without a restart: counted as 0
        assert measured is None, (measured, status)
        assert window == 60 + 15
        return
    assert measured is not None, status
    assert startup > 0, status
    assert abs(measured - startup) <= SETTLED * startup + 1, (measured, status)  # pods may have come since
    assert window == math.ceil(startup + 60 + 15), (window, status)


def keda_judged(kube: Kube, example: Example, keda_installed: bool) -> dict[str, Any] | None:
    found = policy(kube, example)
    if keda_installed:
        objects = recorded_objects(found)
        return found if objects and objects[0].get("kind") == "ScaledObject" else None
    judged = condition(found, READY)
    return found if judged and judged.get("reason") == "KedaNotInstalled" else None


def check_keda_engine(kube: Kube, example: Example) -> None:
    keda_installed = kube.maybe_json("get", "crd", "scaledobjects.keda.sh") is not None
    patch_autoscaling(kube, example, {"engine": "keda"})
    found = wait_until(
        "the KEDA engine judged: its ScaledObject made, or KedaNotInstalled where KEDA is absent",
        lambda: keda_judged(kube, example, keda_installed),
        timeout_s=seconds(120),
        hint=f"kubectl -n {APP_NAMESPACE} describe admpol {example.policy}; {OPERATOR_LOGS}",
    )
    if not keda_installed:
        judged = condition(found, READY)
        assert judged is not None
        assert judged["status"] == "False"
        assert "install KEDA" in str(judged.get("message")), judged
        assert is_true(found, "Ready"), "a missing KEDA must not take the gate's Ready away"


def check_disabled(kube: Kube, example: Example, hpa: str) -> None:
    patch_autoscaling(kube, example, {"enabled": False})
    wait_until(
        "the policy's autoscalers deleted and status.autoscaling gone",
        lambda: not (policy(kube, example).get("status", {}).get("autoscaling")),
        timeout_s=seconds(120),
        hint=f"kubectl -n {APP_NAMESPACE} get hpa,scaledobjects; {OPERATOR_LOGS}",
    )
    assert kube.maybe_json("-n", APP_NAMESPACE, "get", "hpa", hpa) is None, f"HPA {hpa} outlived autoscaling"


def check_autoscaling(kube: Kube, example: Example) -> None:
    """HPA engine, KEDA engine, disabled: each as the module's docstring says."""
    hpa = check_hpa_engine(kube, example)
    check_keda_engine(kube, example)
    check_disabled(kube, example, hpa)
