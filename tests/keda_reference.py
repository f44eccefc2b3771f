"""KEDA's own ScaledObject CRD, never copied into the repository: the one `make kube` takes
from KEDA's module on the Go module proxy (e2e/kube/versions.env's KEDA_VERSION, with KEDA's
LICENSE, into the versioned cache), else ``../shared/reference/keda-scaledobjects-crd.yaml``
from the repository root. A test that validates against it skips, with that reason, only
where neither is there (a clean clone that has not run `make kube`)."""

from __future__ import annotations

import functools
import sys
from typing import Any

import jsonschema
import pytest
import yaml

from crd_rules import cel_and_list_map_errors
from project_files import ROOT

sys.path.insert(0, str(ROOT / "e2e" / "kube"))  # as api_server.py: the versions and cache of `make kube`
from control_plane import cache_dir, versions

KEDA_CRD_NAME = "../shared/reference/keda-scaledobjects-crd.yaml"
CACHED = cache_dir() / f"keda-{versions()['KEDA_VERSION']}" / "keda.sh_scaledobjects.yaml"
KEDA_CRD = CACHED if CACHED.is_file() else ROOT / KEDA_CRD_NAME
ABSENT = f"neither {CACHED} (`make kube`) nor {KEDA_CRD_NAME}: KEDA's ScaledObject CRD, the schema to validate against"


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
