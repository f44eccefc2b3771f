"""Every rendered object is valid: built-in kinds against Kubernetes' own schemas (strict:
no unknown fields), custom resources against their CRD or structural schemas; helm lint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
from chart_tools import CHART, CI_VALUES, CUSTOM_GROUPS, chart_crds, load_values, render
from prometheus_operator_shapes import SCHEMAS

# The oldest version the chart supports (Chart.yaml kubeVersion) and a current one.
KUBERNETES_VERSIONS = ("1.29.0", "1.32.0", "1.35.0")
VALUES = [None, *CI_VALUES]


def values_of(path: Path | None) -> dict[str, Any]:
    return load_values(path) if path else {}


def crd_schema(group: str, kind: str) -> dict[str, Any]:
    """openAPIV3Schema of the storage version of a CRD the chart ships."""
    for crd in chart_crds():
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(f"the chart ships no CRD for {group} {kind}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_file", VALUES, ids=lambda p: p.name if p else "default")
def test_built_in_objects_validate_strictly(values_file: Path | None, version: str) -> None:
    built_in = [o for o in render(values_of(values_file)) if o.group not in CUSTOM_GROUPS]
    assert built_in
    for o in built_in:
        try:
            kubernetes_validate.validate(o.obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{o.template}: {o.kind} {o.name} invalid for Kubernetes {version}: {error.message}")


@pytest.mark.parametrize("values_file", VALUES, ids=lambda p: p.name if p else "default")
def test_custom_resources_match_their_schemas(values_file: Path | None) -> None:
    custom = [o for o in render(values_of(values_file)) if o.group in CUSTOM_GROUPS]
    for o in custom:
        # prometheus-operator kinds: their structural shapes; kopf's peerings: the CRD shipped.
        schema = SCHEMAS[o.kind] if o.group == "monitoring.coreos.com" else crd_schema(o.group, o.kind)
        # CRD schemas are OpenAPI 3.0 (draft-4 keywords); the shapes here are draft-7.
        validator = jsonschema.Draft7Validator if o.group == "monitoring.coreos.com" else jsonschema.Draft4Validator
        errors = [e.message for e in validator(schema).iter_errors(o.obj)]
        assert errors == [], f"{o.template}: {o.kind} {o.name}"


def test_the_shapes_catch_a_typo() -> None:
    """The structural schemas can fail: a misspelt field or a bad duration is refused."""
    (monitor,) = [o.obj for o in render() if o.kind == "PodMonitor"]
    misspelt = {**monitor, "spec": {**monitor["spec"], "podMetricEndpoints": []}}
    assert list(jsonschema.Draft7Validator(SCHEMAS["PodMonitor"]).iter_errors(misspelt))
    (rules,) = [o.obj for o in render() if o.kind == "PrometheusRule"]
    group = rules["spec"]["groups"][0]
    bad_for = {**group, "rules": [{**group["rules"][0], "for": "10 minutes"}]}
    broken = {**rules, "spec": {"groups": [bad_for]}}
    assert list(jsonschema.Draft7Validator(SCHEMAS["PrometheusRule"]).iter_errors(broken))


@pytest.mark.parametrize("values_file", VALUES, ids=lambda p: p.name if p else "default")
def test_helm_lint_finds_nothing(values_file: Path | None) -> None:
    report = helm_python.lint(str(CHART), values_of(values_file), strict=True, kube_version="v1.32.0")
    assert report["errors"] == []
    # severity 1 is informational (e.g. "icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_helm_lint_reports_a_broken_chart(tmp_path: Path) -> None:
    """Lint can fail: a template that renders invalid YAML is an error."""
    broken = tmp_path / "slogate"
    chart = helm_python.Chart.load(str(CHART))
    try:
        chart.save_dir(tmp_path)
    finally:
        chart.close()
    (broken / "templates" / "broken.yaml").write_text("apiVersion: v1\nkind: ConfigMap\ndata: [unclosed\n")
    report = helm_python.lint(str(broken), {}, strict=True)
    assert any("unable to parse YAML" in m["error"] for m in report["messages"] if m["severity"] == 3)
