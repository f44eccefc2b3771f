"""Files of this repository the tests read: its root and the AdmissionPolicy CRD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD_PATH = ROOT / "crds" / "admissionpolicies.slogate.dev.yaml"
CRD: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
SCHEMA: dict[str, Any] = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
"""The AdmissionPolicy openAPIV3Schema (OpenAPI 3.0: JSON-schema draft 4 with extensions)."""
