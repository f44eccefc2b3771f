"""What the API server checks of a custom resource beyond its JSON schema, offline: structural
defaulting, the list-map key uniqueness of ``x-kubernetes-list-type: map``, and every CEL rule
(``x-kubernetes-validations``) evaluated with cel-python (``sum()`` is the one Kubernetes list
function the rules use, supplied here). Our CRD's tests and KEDA's ScaledObject checks use it."""

from __future__ import annotations

import copy
from typing import Any

import celpy

CEL = celpy.Environment()


def _sum(values: celpy.celtypes.ListType) -> celpy.celtypes.IntType:
    return celpy.celtypes.IntType(sum(int(v) for v in values))


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: missing fields with a default get it."""
    if isinstance(value, dict) and schema.get("type") == "object":
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(value[name], sub)
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def to_cel(value: Any, schema: dict[str, Any]) -> Any:
    """A value typed as the API server types it for CEL: by its schema (a number is a double)."""
    kind = schema.get("type")
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else {}
        return celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): to_cel(v, properties.get(k, extra)) for k, v in value.items()}
        )
    if isinstance(value, list):
        return celpy.celtypes.ListType([to_cel(v, schema.get("items") or {}) for v in value])
    if isinstance(value, bool):
        return celpy.celtypes.BoolType(value)
    if kind == "number":
        return celpy.celtypes.DoubleType(float(value))
    if isinstance(value, int):
        return celpy.celtypes.IntType(value)
    return celpy.json_to_cel(value)


def cel_and_list_map_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations") or ():
        program = CEL.program(CEL.compile(rule["rule"]), functions={"sum": _sum})
        if program.evaluate({"self": to_cel(value, schema)}) != celpy.celtypes.BoolType(True):
            errors.append(f"{path or '.'}: {rule['message']}")
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                errors += cel_and_list_map_errors(value[name], sub, f"{path}.{name}")
    if isinstance(value, list) and "items" in schema:
        keys = schema.get("x-kubernetes-list-map-keys")
        if schema.get("x-kubernetes-list-type") == "map" and keys:
            seen = [tuple(item.get(k) for k in keys) for item in value]
            if len(set(seen)) != len(seen):
                errors.append(f"{path}: duplicate entries for key {keys}")
        for index, item in enumerate(value):
            errors += cel_and_list_map_errors(item, schema["items"], f"{path}[{index}]")
    return errors
