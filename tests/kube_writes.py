"""Pure rules of kube-apiserver's write path, used by tests/kube_emulation.py: applying a
patch, separating spec from status, server-owned metadata, a Job's generated selector, the
validation of an object (422) and the Status objects errors are answered with."""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer
import kmock

from kube_rules import label_selector_object, labels_match, pod_spec_errors, pod_spec_of, status_body


class StatusError(Exception):
    """Answer the request with a kube-apiserver Status of ``code``."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def response(self) -> kmock.Response:
        """The answer, as a kmock reaction returns one."""
        return kmock.Response(status=self.code, payload=status_body(self.code, self.reason, self.message, self.details))


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def apply_patch(old: dict[str, Any], patch: Any) -> dict[str, Any]:
    if isinstance(patch, dict):
        merged: dict[str, Any] = merge_patch(copy.deepcopy(old), patch)
        return merged
    if not isinstance(patch, list):
        raise StatusError(400, "BadRequest", "the patch is neither a merge patch (object) nor a JSON patch (list)")
    try:
        patched: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(old), patch)
    except jsonpatch.JsonPatchTestFailed as error:  # kopf and the operator test resourceVersion first
        raise StatusError(
            422, "Invalid", f"the server rejected our request due to an error in our request: {error}"
        ) from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError, TypeError) as error:
        raise StatusError(422, "Invalid", f"the server rejected our request: {error!r}") from None
    return patched


def separated(old: dict[str, Any], patched: dict[str, Any], sub: str | None, has_status: bool) -> dict[str, Any]:
    """The object a patch leaves: /status changes only the status; the main resource ignores
    status changes (if the kind has the subresource) and server-owned metadata."""
    if sub == "status":
        new = copy.deepcopy(old)
        new.pop("status", None)
        if "status" in patched:
            new["status"] = patched["status"]
        return new
    new = patched
    if has_status:
        new.pop("status", None)
        if "status" in old:
            new["status"] = old["status"]
    meta = new.setdefault("metadata", {})
    for key in ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp"):
        meta.pop(key, None)
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
    return new


def generate_job_selector(job: dict[str, Any]) -> None:
    """The Job strategy's PrepareForCreate: a selector on the Job's uid, and its labels on the template."""
    spec = job.setdefault("spec", {})
    if spec.get("manualSelector"):
        return
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    labels = spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
    labels.update({"controller-uid": uid, "batch.kubernetes.io/controller-uid": uid,
                   "job-name": name, "batch.kubernetes.io/job-name": name})  # fmt: skip
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}


def mutable_pod_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A pod spec without what a pod update may change."""
    rest = {
        k: v
        for k, v in spec.items()
        if k not in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")
    }
    for group in ("containers", "initContainers"):
        if group in rest:
            rest[group] = [{k: v for k, v in c.items() if k != "image"} for c in rest[group]]
    return rest


def object_errors(kind: str, new: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """kube-apiserver's validation of a created (``old`` None) or updated object, the part that
    matters here: its pod spec, a Deployment's selector, immutable fields, pod updates."""
    errors: list[tuple[str, str, str]] = []
    where = pod_spec_of(kind, new)
    if where is not None:
        errors += pod_spec_errors(where[0], where[1], kind)
    spec, old_spec = new.get("spec") or {}, (old or {}).get("spec") or {}
    if kind == "Deployment":
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
        if not labels_match(label_selector_object(spec.get("selector") or {}), labels):
            errors.append(("spec.template.metadata.labels", "FieldValueInvalid",
                           f"Invalid value: {json.dumps(labels)}: `selector` does not match template `labels`"))  # fmt: skip
    immutable = {"Deployment": ("selector",), "Job": ("selector", "template")}.get(kind, ())
    errors += [(f"spec.{key}", "FieldValueInvalid", "Invalid value: ...: field is immutable")
               for key in immutable if old is not None and spec.get(key) != old_spec.get(key)]  # fmt: skip
    if kind == "Pod" and old is not None and mutable_pod_spec(spec) != mutable_pod_spec(old_spec):
        errors.append(("spec", "FieldValueForbidden", "Forbidden: pod updates may not change fields other than "
                       "`spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
                       "`spec.tolerations` (only additions to existing tolerations), "
                       "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"))  # fmt: skip
    return errors


def invalid(kind: str, group: str, name: str, errors: list[tuple[str, str, str]]) -> StatusError:
    """The 422 kube-apiserver answers, e.g. 'Deployment.apps "x" is invalid: spec...: Not found: "v"'."""
    said = [f"{path}: {detail}" for path, _, detail in errors]
    text = said[0] if len(said) == 1 else "[" + ", ".join(said) + "]"
    causes = [{"reason": reason, "message": detail, "field": path} for path, reason, detail in errors]
    return StatusError(422, "Invalid", f'{kind}{"." + group if group else ""} "{name}" is invalid: {text}',
                       {"name": name, "group": group, "kind": kind, "causes": causes})  # fmt: skip
