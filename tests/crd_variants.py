"""An AdmissionPolicy's variants, valid and invalid, and the models' verdict on each: one table
shared by the offline CRD test (tests/unit/operator/test_operator_crd.py, the API server's
rules emulated) and the real API server's (e2e/test_api_server.py), so both judge the same
objects."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from slogate_admission.tenant_schema import DEFAULT_MAX_TRACKED, MAX_LISTED_TENANTS, OTHER_TENANTS
from slogate_operator.spec import SpecError, parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def model_errors(policy: dict[str, Any]) -> list[str]:
    try:
        parse_spec(policy.get("spec"))
    except SpecError as error:
        return [str(error)]
    return []


def example_policies() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "AdmissionPolicy":
                found.append((f"{path.name}:{doc['metadata']['name']}", doc))
    return found


EXAMPLE_POLICIES = example_policies()


def base_policy() -> dict[str, Any]:
    return copy.deepcopy(dict(EXAMPLE_POLICIES)["smollm2.yaml:smollm2"])


def set_at(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(policy: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = policy["spec"]
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if value is DELETE:
            del node[leaf]
        else:
            node[int(leaf) if isinstance(node, list) else leaf] = value

    return change


def all_of(*changes: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def change(policy: dict[str, Any]) -> None:
        for one in changes:
            one(policy)

    return change


DELETE = object()
INVALID: dict[str, Callable[[dict[str, Any]], None]] = {
    "ttft zero": set_at("slo.ttftSeconds", 0),
    "ttft negative": set_at("slo.ttftSeconds", -1.5),
    "quantile one": set_at("slo.quantile", 1),
    "quantile zero": set_at("slo.quantile", 0),
    "quantile below a median": set_at("slo.quantile", 0.4),
    "tpot zero": set_at("slo.timePerOutputTokenSeconds", 0),
    # slo.ttftSeconds is the TTFT SLO of every class without its own: required exactly when
    # one lacks it (or no classes are listed), refused when every class sets its own.
    "slo.ttftSeconds beside classes that all set their own (CEL)": set_at("slo.ttftSeconds", 2.0),
    "a class without ttftSeconds and no slo.ttftSeconds (CEL)": set_at("classes.1.ttftSeconds", DELETE),
    "no slo, a class without ttftSeconds (CEL)": all_of(set_at("slo", DELETE), set_at("classes.0.ttftSeconds", DELETE)),
    "no classes and no slo.ttftSeconds (CEL)": set_at("classes", DELETE),
    "an empty class list and no slo.ttftSeconds (CEL)": set_at("classes", []),
    "unknown estimate": set_at("outputTokens.estimate", "Mean"),
    "output default zero": set_at("outputTokens.default", 0),
    "output quantile above one": set_at("outputTokens.quantile", 1.2),
    "concurrency zero": set_at("concurrency.max", 0),
    "class name upper case": set_at("classes.0.name", "Interactive"),
    "class ttft zero": set_at("classes.0.ttftSeconds", 0),
    "negative reserved slots": set_at("classes.0.reservedSlots", -1),
    "reserved slots leave the lowest class none (CEL)": set_at("classes.0.reservedSlots", 4),
    "class name repeated (list map)": set_at("classes.1.name", "interactive"),
    "default class unknown (CEL)": set_at("defaultClass", "premium"),
    "max wait negative": set_at("deferral.maxWaitSeconds", -1),
    # (not "yes": pydantic's lax mode reads it as true; the API server refuses it first)
    "clamp not a boolean": set_at("degradation.clampMaxTokens", "maybe"),
    "both targetRef and selector (CEL)": set_at("selector", {"matchLabels": {"app": "x"}}),
    "neither targetRef nor selector (CEL)": set_at("targetRef", DELETE),
    "target kind StatefulSet": set_at("targetRef.kind", "StatefulSet"),
    "target name not DNS": set_at("targetRef.name", "Smol_LM"),
    "container name not DNS": set_at("container", "Llama_1"),
    "budget above timeout (CEL)": set_at("calibration.budgetSeconds", 400),
    "timeout below 30": set_at("calibration.timeoutSeconds", 10),
    "same sidecar ports (CEL)": set_at("sidecar.adminPort", 8081),
    "port out of range": set_at("sidecar.port", 70000),
    "unknown prompt counting": set_at("sidecar.promptCounting", "guess"),
    "warning not below critical (CEL)": set_at("alerting.rejectionRatioWarning", 0.5),
    "warning ratio above one": set_at("alerting.rejectionRatioWarning", 1.5),
    "sidecar quantity garbage": set_at("sidecar.resources", {"requests": {"cpu": "lots"}}),
    "autoscaling enabled without maxReplicas (CEL)": set_at("autoscaling", {"enabled": True}),
    "autoscaling maxReplicas below minReplicas (CEL)": set_at("autoscaling", {"minReplicas": 3, "maxReplicas": 2}),
    "autoscaling maxReplicas below the default minReplicas": set_at("autoscaling", {"enabled": True, "maxReplicas": 0}),
    "autoscaling minReplicas zero": set_at("autoscaling", {"enabled": True, "minReplicas": 0, "maxReplicas": 2}),
    "autoscaling unknown engine": set_at("autoscaling", {"enabled": True, "maxReplicas": 2, "engine": "vpa"}),
    "autoscaling target utilization zero": set_at("autoscaling", {"maxReplicas": 2, "targetUtilization": 0}),
    "autoscaling target utilization below 1%": set_at("autoscaling", {"maxReplicas": 2, "targetUtilization": 1e-9}),
    "autoscaling target utilization above one": set_at("autoscaling", {"maxReplicas": 2, "targetUtilization": 1.2}),
    "autoscaling scale-down window above an hour": set_at("autoscaling", {"scaleDownStabilizationSeconds": 3601}),
    "autoscaling scale-up window negative": set_at("autoscaling", {"scaleUpStabilizationSeconds": -1}),
    "autoscaling polling interval zero": set_at("autoscaling", {"pollingIntervalSeconds": 0}),
    "autoscaling metric window zero": set_at("autoscaling", {"metricWindowSeconds": 0}),
    "autoscaling server address not a URL": set_at("autoscaling", {"prometheus": {"serverAddress": "prometheus:9090"}}),
    "tenants weights past maxTracked (CEL)": set_at("tenants", {"maxTracked": 2, "weights": {"a": 1, "b": 2, "c": 3}}),
    "tenants weights past the default maxTracked (CEL)": set_at(
        "tenants", {"weights": {f"team-{i}": 1 for i in range(DEFAULT_MAX_TRACKED + 1)}}
    ),
    "tenants weights past 1,000": set_at(
        "tenants", {"maxTracked": 10_000, "weights": {f"team-{i}": 1 for i in range(MAX_LISTED_TENANTS + 1)}}
    ),
    "tenants weight zero": set_at("tenants", {"weights": {"acme": 0}}),
    "tenants weight negative": set_at("tenants", {"weights": {"acme": -2}}),
    "tenants weight above a million": set_at("tenants", {"weights": {"acme": 2e6}}),
    "tenants weight not a number": set_at("tenants", {"weights": {"acme": "heavy"}}),
    "tenants name starting with _ (CEL)": set_at("tenants", {"weights": {OTHER_TENANTS: 2}}),
    "tenants name with a space (CEL)": set_at("tenants", {"weights": {"acme corp": 2}}),
    "tenants name of 129 characters (CEL)": set_at("tenants", {"weights": {"a" * 129: 2}}),
    "tenants empty name (CEL)": set_at("tenants", {"weights": {"": 2}}),
    "tenants header with an underscore": set_at("tenants", {"header": "X_Tenant"}),
    "tenants header empty": set_at("tenants", {"header": ""}),
    "tenants header of 65 characters": set_at("tenants", {"header": "X" * 65}),
    "tenants maxTracked zero": set_at("tenants", {"maxTracked": 0}),
    "tenants maxTracked above 10000": set_at("tenants", {"maxTracked": 10_001}),
    "tenants output weight zero": set_at("tenants", {"outputWeight": 0}),
    "tenants half-life zero": set_at("tenants", {"halfLifeSeconds": 0}),
    "tenants half-life negative": set_at("tenants", {"halfLifeSeconds": -60}),
}


def selector_variant(selector: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def change(policy: dict[str, Any]) -> None:
        del policy["spec"]["targetRef"]
        policy["spec"]["selector"] = selector

    return change


INVALID |= {
    "empty selector (CEL)": selector_variant({}),
    "In without values (CEL)": selector_variant({"matchExpressions": [{"key": "a", "operator": "In"}]}),
    "Exists with values (CEL)": selector_variant(
        {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}
    ),
    "unknown selector operator": selector_variant({"matchExpressions": [{"key": "a", "operator": "Near"}]}),
}


EVERY_AUTOSCALING_FIELD = {
    "enabled": True, "engine": "hpa", "minReplicas": 2, "maxReplicas": 2, "targetUtilization": 1,
    "scaleUpStabilizationSeconds": 3600, "scaleDownStabilizationSeconds": 0, "pollingIntervalSeconds": 1,
    "metricWindowSeconds": 30, "prometheus": {"serverAddress": "https://prometheus.example:9090/"},
}  # fmt: skip
EVERY_TENANTS_FIELD = {
    "header": "X-Team", "weights": {"acme": 3, "globex": 0.5}, "maxTracked": 10_000, "outputWeight": 2.5,
    "halfLifeSeconds": 30,
}  # fmt: skip
VALID: dict[str, Callable[[dict[str, Any]], None]] = {
    "slo.ttftSeconds for the one class without its own": all_of(
        set_at("slo.ttftSeconds", 20), set_at("classes.1.ttftSeconds", DELETE)
    ),
    "no slo at all, every class its own ttftSeconds": set_at("slo", DELETE),
    "no classes, slo.ttftSeconds": all_of(set_at("classes", DELETE), set_at("slo.ttftSeconds", 2)),
    "autoscaling with every field": set_at("autoscaling", EVERY_AUTOSCALING_FIELD),
    "autoscaling disabled without maxReplicas": set_at("autoscaling", {"enabled": False, "minReplicas": 4}),
    "tenants with every field": set_at("tenants", EVERY_TENANTS_FIELD),
    "tenants empty: every default": set_at("tenants", {}),
    "tenants weights exactly maxTracked": set_at("tenants", {"maxTracked": 2, "weights": {"a": 1, "b": 0.5}}),
    "tenants names of every allowed character": set_at(
        "tenants", {"weights": {"9" + "a" * 127: 1, "org/team:app@eu.west-1_x": 3, "A": 1e6}}
    ),
}
