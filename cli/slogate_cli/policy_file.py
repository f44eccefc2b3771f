"""``--policy FILE``: the AdmissionPolicy a user applies, read as the commands need it.

The file may be YAML or JSON (JSON is YAML), and may hold the whole AdmissionPolicy object
(``kind: AdmissionPolicy``, possibly among other documents, as examples/smollm2.yaml holds a
Deployment beside it), its ``spec``, or the bare policy. The fields only the operator reads
(``targetRef``, ``selector``, ``calibration``, ``autoscaling``, ...) mean nothing to a command run
by hand: they are left out, and the command says which (``PolicyFile.ignored``). Any other field
the Policy does not know is an error, as the API server would refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from slogate_admission.schema import Policy
from slogate_cli.arguments import one_line
from slogate_operator.spec import POLICY_KEYS, OperatorSpec

KIND = "AdmissionPolicy"
OPERATOR_KEYS = frozenset(field.alias or name for name, field in OperatorSpec.model_fields.items())
"""The spec keys only the operator reads (camelCase)."""


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """A policy as read from a file, and what of the file was left out."""

    policy: Policy
    ignored: tuple[str, ...] = ()
    """Operator-only spec fields present in the file, which the command does not use."""

    def note(self) -> str | None:
        """One line for stderr naming the ignored fields, or None."""
        if not self.ignored:
            return None
        return f"note: ignoring {', '.join(self.ignored)}: only the operator reads them"


def read_policy(path: Path) -> PolicyFile:
    """The policy in ``path``; a one-line ValueError naming the file for anything wrong with it."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"cannot read {error.filename}: {error.strerror}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not YAML or JSON: {' '.join(str(error).split())}") from None
    try:
        return policy_of(_the_policy_document(documents))
    except ValidationError as error:
        raise ValueError(f"{path}: {one_line(error)}") from None
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def policy_of(document: Mapping[str, Any]) -> PolicyFile:
    """An AdmissionPolicy object, its spec, or a bare policy, as a Policy; operator-only fields
    left out and named. ValidationError for a policy the Policy model refuses."""
    spec = document.get("spec") if document.get("kind") == KIND or "apiVersion" in document else document
    if not isinstance(spec, Mapping):
        raise ValueError(f"the {KIND}'s spec must be an object")
    ignored = tuple(key for key in spec if key in OPERATOR_KEYS and key not in POLICY_KEYS)
    return PolicyFile(Policy.model_validate({k: v for k, v in spec.items() if k not in ignored}), ignored)


def _the_policy_document(documents: list[Any]) -> Mapping[str, Any]:
    """The one AdmissionPolicy among the documents, or the one document there is."""
    policies = [d for d in documents if isinstance(d, Mapping) and d.get("kind") == KIND]
    if len(policies) > 1:
        names = ", ".join(str((d.get("metadata") or {}).get("name", "?")) for d in policies)
        raise ValueError(f"holds {len(policies)} {KIND}s ({names}); give a file with one")
    if policies:
        return policies[0]
    if len(documents) == 1 and isinstance(documents[0], Mapping) and "kind" not in documents[0]:
        return documents[0]
    if not documents:
        raise ValueError("is empty")
    kinds = ", ".join(sorted({str(d.get("kind")) for d in documents if isinstance(d, Mapping)})) or "no object"
    raise ValueError(f"holds no {KIND} (found {kinds})")
