"""KEDA's own ScaledObject CRD, reference data kept outside the repository (never copied in):
``../shared/reference/keda-scaledobjects-crd.yaml`` from the repository root. A test that
validates against it skips, with that reason, only where the file is absent."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import pytest
import yaml
from test_operator_crd import cel_and_list_map_errors

from project_files import ROOT

KEDA_CRD_NAME = "../shared/reference/keda-scaledobjects-crd.yaml"
KEDA_CRD = ROOT / KEDA_CRD_NAME
ABSENT = f"{KEDA_CRD_NAME} is absent: KEDA's ScaledObject CRD, the schema to validate against"


@functools.cache
def keda_schema() -> dict[str, Any] | None:
    """The ScaledObject openAPIV3Schema (v1alpha1), or None if the file is absent."""
    if not KEDA_CRD.is_file():
        return None
    (crd,) = [doc for doc in yaml.safe_load_all(KEDA_CRD.read_text()) if doc]
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == ("keda.sh", "ScaledObject")
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def required_keda_schema() -> dict[str, Any]:
    """The schema, or skip the test (the one reason a test of it may skip)."""
    schema = keda_schema()
    if schema is None:
        pytest.skip(ABSENT)
    return schema


def keda_errors(scaled_object: dict[str, Any]) -> list[str]:
    """What KEDA's CRD refuses in ``scaled_object``: its openAPIV3Schema, then its CEL rules."""
    schema = required_keda_schema()
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft4Validator(schema).iter_errors(scaled_object)]
    return errors or cel_and_list_map_errors(scaled_object, schema)
