"""The CRD and the models cannot drift: every example validates against both, every invalid
variant is refused by both, and the two describe the same fields with the same defaults.

The CRD's verdict is the API server's, emulated offline: the openAPIV3Schema (OpenAPI 3.0
is JSON-schema draft 4 plus extensions), then defaulting, then the list-map key
uniqueness of ``x-kubernetes-list-type: map``, then every CEL rule
(``x-kubernetes-validations``) evaluated with cel-python (``sum()`` is the one
Kubernetes list function the rules use, supplied here).
"""

from __future__ import annotations

import copy
import types
import typing
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from canned_profiles import NOW, smollm2_profile
from crd_rules import apply_defaults, cel_and_list_map_errors
from crd_variants import (
    EXAMPLE_POLICIES,
    EXAMPLES,
    INVALID,
    VALID,
    base_policy,
    model_errors,
    selector_variant,
)
from project_files import CRD, SCHEMA
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_operator.spec import OperatorSpec, parse_spec
from slogate_operator.status import ConditionType, thresholds_summary


def crd_errors(policy: dict[str, Any]) -> list[str]:
    """Everything the API server would refuse the object for."""
    errors = [e.message for e in jsonschema.Draft4Validator(SCHEMA).iter_errors(policy)]
    if errors:
        return errors
    return cel_and_list_map_errors(apply_defaults(copy.deepcopy(policy), SCHEMA), SCHEMA)


def test_every_example_file_has_a_policy_and_smollm2_has_the_full_set() -> None:
    files = {name.split(":")[0] for name, _ in EXAMPLE_POLICIES}
    assert files == {p.name for p in EXAMPLES.glob("*.yaml")}
    full = yaml.safe_load_all((EXAMPLES / "smollm2.yaml").read_text())
    assert {d["kind"] for d in full} == {"Deployment", "Service", "AdmissionPolicy"}


@pytest.mark.parametrize(("name", "policy"), EXAMPLE_POLICIES, ids=[n for n, _ in EXAMPLE_POLICIES])
def test_examples_are_valid_for_the_crd_and_the_models(name: str, policy: dict[str, Any]) -> None:
    assert crd_errors(policy) == []
    assert model_errors(policy) == []


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_variants_are_refused_by_both(case: str) -> None:
    policy = base_policy()
    INVALID[case](policy)
    assert crd_errors(policy), f"the CRD accepts: {case}"
    assert model_errors(policy), f"the models accept: {case}"
    if "(CEL)" in case or "(list map)" in case:
        # Only the rule can refuse these: the plain schema must accept them, or the
        # rule would be untested.
        assert list(jsonschema.Draft4Validator(SCHEMA).iter_errors(policy)) == []


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_variants_pass_both(case: str) -> None:
    policy = base_policy()
    VALID[case](policy)
    assert crd_errors(policy) == []
    assert model_errors(policy) == []


def test_the_class_slo_rules_explain_themselves() -> None:
    both = base_policy()
    INVALID["slo.ttftSeconds beside classes that all set their own (CEL)"](both)
    assert crd_errors(both) == [
        ".spec: slo.ttftSeconds is the TTFT SLO of the classes without their own ttftSeconds, "
        "and every class sets its own: remove it"
    ]
    (problem,) = model_errors(both)
    assert "every class (interactive, batch) sets its own ttftSeconds; remove slo.ttftSeconds" in problem
    neither = base_policy()
    INVALID["a class without ttftSeconds and no slo.ttftSeconds (CEL)"](neither)
    assert crd_errors(neither) == [
        ".spec: slo.ttftSeconds is required: it is the TTFT SLO of every class without its own "
        "ttftSeconds (and of the one class, default, when no classes are listed)"
    ]
    (problem,) = model_errors(neither)
    assert "the classes without their own ttftSeconds (batch)" in problem


def test_a_valid_selector_variant_passes_both() -> None:
    policy = selector_variant({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]})
    changed = base_policy()
    policy(changed)
    assert crd_errors(changed) == []
    assert model_errors(changed) == []


# ------------------------------------------------------------------------------ same fields, same defaults


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (Optional[M], tuple[M, ...]), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _compare(model: type[BaseModel], schema: dict[str, Any], path: str, problems: list[str]) -> None:
    if schema.get("type") == "array":
        schema = schema["items"]
    fields = {(info.alias or name): info for name, info in model.model_fields.items()}
    properties = schema.get("properties") or {}
    if set(fields) != set(properties):
        problems.append(f"{path}: models {sorted(fields)} vs CRD {sorted(properties)}")
    required = {alias for alias, info in fields.items() if info.is_required()}
    if required != set(schema.get("required") or ()):
        problems.append(f"{path}: required {sorted(required)} vs CRD {schema.get('required')}")
    for alias, info in fields.items():
        sub = properties.get(alias)
        if sub is None:
            continue
        if "default" in sub:
            default = info.get_default(call_default_factory=True)
            if getattr(default, "value", default) != sub["default"]:
                problems.append(f"{path}.{alias}: default {default!r} vs CRD {sub['default']!r}")
        inner = _model_of(info.annotation)
        if inner is not None and inner.__name__ != "Resources":  # quantities: int-or-string leaves
            _compare(inner, sub, f"{path}.{alias}", problems)


def test_crd_spec_and_models_have_the_same_fields_required_and_defaults() -> None:
    spec_schema = SCHEMA["properties"]["spec"]
    problems: list[str] = []
    policy_part = {
        k: v for k, v in spec_schema["properties"].items() if k in {f.alias for f in Policy.model_fields.values()}
    }
    operator_part = {k: v for k, v in spec_schema["properties"].items() if k not in policy_part}
    policy_required = [k for k in spec_schema.get("required") or () if k in policy_part]
    _compare(Policy, {"properties": policy_part, "required": policy_required}, "spec", problems)
    _compare(OperatorSpec, {"properties": operator_part}, "spec", problems)
    # Nothing is required outright: targetRef or selector, and slo.ttftSeconds, are CEL rules.
    assert "required" not in spec_schema
    assert problems == []


def test_crd_metadata_printer_columns_and_status_conditions() -> None:
    names = CRD["spec"]["names"]
    assert (CRD["spec"]["group"], CRD["spec"]["scope"], names["kind"], names["shortNames"]) == (
        "slogate.dev", "Namespaced", "AdmissionPolicy", ["admpol"],
    )  # fmt: skip
    version = CRD["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert set(columns) == {
        "Target", "Default-TTFT", "Token-Budget", "Concurrency", "Calibrated", "Pushed", "Desired", "Current",
        "Ready", "Age",
    }  # fmt: skip
    assert columns["Desired"] == ".status.autoscaling.desiredReplicas"
    assert columns["Current"] == ".status.autoscaling.currentReplicas"
    # The default class's TTFT SLO as derived, beside the token budget derived from it.
    assert columns["Default-TTFT"] == ".status.thresholds.defaultClassTtftSeconds"
    assert columns["Token-Budget"] == ".status.thresholds.tokenBudget"
    condition_enum = SCHEMA["properties"]["status"]["properties"]["conditions"]["items"]["properties"]["type"]["enum"]
    assert set(condition_enum) == {c.value for c in ConditionType}


def _unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server would prune: not among the schema's properties."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        found = []
        for key, item in value.items():
            if key not in properties:
                found.append(f"{path}.{key}")
            else:
                found += _unknown_fields(item, properties[key], f"{path}.{key}")
        return found
    if isinstance(value, list):
        return [
            f for i, item in enumerate(value) for f in _unknown_fields(item, schema.get("items") or {}, f"{path}[{i}]")
        ]
    return []


def _column(status: dict[str, Any], json_path: str) -> Any:
    node: Any = {"status": status}
    for part in json_path.removeprefix(".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


@pytest.mark.parametrize(("name", "policy"), EXAMPLE_POLICIES, ids=[n for n, _ in EXAMPLE_POLICIES])
def test_the_default_ttft_column_reads_the_default_class_slo_in_force(name: str, policy: dict[str, Any]) -> None:
    parsed = parse_spec(policy["spec"]).policy
    thresholds = derive_thresholds(parsed, smollm2_profile(), derived_at=NOW)
    status = {"thresholds": thresholds_summary(thresholds, "x-thresholds")}
    assert _unknown_fields(status, SCHEMA["properties"]["status"]) == []  # nothing pruned
    columns = {c["name"]: c["jsonPath"] for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]}
    default = next(c for c in thresholds.classes if c.name == thresholds.default_class)
    assert _column(status, columns["Default-TTFT"]) == default.ttft_slo_seconds
    assert _column(status, columns["Token-Budget"]) == int(default.token_budget)
    expected = {"smollm2.yaml:smollm2": 10.0, "policy-minimal.yaml:chat": 3.0}
    if name in expected:  # smollm2: batch, the default class, sets its own 10 s
        assert default.ttft_slo_seconds == expected[name]
    assert [c["ttftSloSeconds"] for c in status["thresholds"]["classes"]] == [
        c.ttft_slo_seconds for c in thresholds.classes
    ]
