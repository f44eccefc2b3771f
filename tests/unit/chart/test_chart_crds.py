"""The chart's CRDs are generated copies of crds/ (one source), valid, and the examples/
custom resources validate against them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_tools import CHART, REPO, chart_crds

SYNC = CHART / "sync-crds.py"
EXAMPLES = REPO / "examples"


def run_sync(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60, check=False)


def test_chart_crds_are_the_repositorys_crds() -> None:
    checked = run_sync(SYNC, "--check")
    assert checked.returncode == 0, checked.stderr
    sources = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert sources, "crds/ holds no CRD: the AdmissionPolicy CRD's single source is missing"
    for name in sources:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes()


def test_the_sync_check_fails_on_drift_and_the_sync_repairs_it(tmp_path: Path) -> None:
    """In a scratch copy of the layout: an edited copy, a missing one and a stale one."""
    chart = tmp_path / "charts" / "slogate"
    (chart / "crds").mkdir(parents=True)
    (tmp_path / "crds").mkdir()
    script = chart / "sync-crds.py"
    shutil.copy(SYNC, script)
    shutil.copy(CHART / "crds" / "kopf.dev_peerings.yaml", chart / "crds")
    (tmp_path / "crds" / "a.yaml").write_text("kind: CustomResourceDefinition # a\n")
    (tmp_path / "crds" / "b.yaml").write_text("kind: CustomResourceDefinition # b\n")
    (chart / "crds" / "a.yaml").write_text("kind: CustomResourceDefinition # a, edited by hand\n")
    (chart / "crds" / "gone.yaml").write_text("kind: CustomResourceDefinition # removed upstream\n")

    drift = run_sync(script, "--check")
    assert drift.returncode == 1
    assert "differs from crds/a.yaml" in drift.stderr
    assert "missing in the chart: b.yaml" in drift.stderr
    assert "stale copy (no crds/gone.yaml)" in drift.stderr

    assert run_sync(script).returncode == 0
    assert run_sync(script, "--check").returncode == 0
    assert sorted(p.name for p in (chart / "crds").iterdir()) == ["a.yaml", "b.yaml", "kopf.dev_peerings.yaml"]
    assert (chart / "crds" / "a.yaml").read_text() == "kind: CustomResourceDefinition # a\n"


@pytest.mark.parametrize("version", ["1.29.0", "1.35.0"])
def test_chart_crds_are_valid_crds(version: str) -> None:
    crds = chart_crds()
    names = [c["metadata"]["name"] for c in crds]
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= set(names)
    assert any(c["spec"]["group"] == "slogate.dev" for c in crds), "no AdmissionPolicy CRD in the chart"
    assert len(names) == len(set(names)), "a CRD is defined twice"
    for crd in crds:
        kubernetes_validate.validate(crd, version, strict=True)


def admission_policy_schema() -> dict[str, Any]:
    for crd in chart_crds():
        if crd["spec"]["group"] == "slogate.dev" and crd["spec"]["names"]["kind"] == "AdmissionPolicy":
            version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError("the chart ships no AdmissionPolicy CRD")


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        docs.extend((path.name, d) for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_example_policies_validate_against_the_crd_schema() -> None:
    docs = example_documents()
    policies = [(name, d) for name, d in docs if d.get("kind") == "AdmissionPolicy"]
    assert policies, f"no AdmissionPolicy under {EXAMPLES}"
    # A CRD schema is OpenAPI 3.0, whose exclusiveMinimum/Maximum are draft-4 booleans.
    validator = jsonschema.Draft4Validator(admission_policy_schema())
    for name, policy in policies:
        assert [e.message for e in validator.iter_errors(policy)] == [], name
    # The schema can refuse: a negative SLO is not a policy.
    broken = {**policies[0][1], "spec": {**policies[0][1]["spec"], "slo": {"ttftSeconds": -1}}}
    assert list(validator.iter_errors(broken))


def test_example_built_in_objects_validate_strictly() -> None:
    built_in = [(name, d) for name, d in example_documents() if d["apiVersion"].split("/")[0] in {"v1", "apps"}]
    assert {d["kind"] for _, d in built_in} >= {"Deployment", "Service"}
    for name, obj in built_in:
        try:
            kubernetes_validate.validate(obj, "1.32.0", strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"examples/{name}: {obj['kind']} {obj['metadata']['name']}: {error.message}")
