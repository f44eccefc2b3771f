"""Structural JSON schemas of the three prometheus-operator kinds the chart renders.

kubernetes-validate knows only built-in kinds. These schemas, written from the
monitoring.coreos.com/v1 API reference, pin what the chart relies on: field names and
types, no unknown fields, Prometheus durations and label names where they must be valid.
They are narrower than the real CRDs (only the fields the chart uses are allowed), so a
typo in a template fails here rather than at `kubectl apply`.
"""

from __future__ import annotations

from typing import Any

DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


def closed(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": required or []}


METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}

LABEL_SELECTOR = closed(
    {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": closed(
                {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
                ["key", "operator"],
            ),
        },
    }
)

NAMESPACE_SELECTOR = closed({"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}})

RELABEL = closed(
    {
        "sourceLabels": {"type": "array", "items": LABEL_NAME},
        "separator": {"type": "string"},
        "targetLabel": LABEL_NAME,
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
        "action": {
            "enum": [
                "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
                "lowercase", "uppercase", "keepequal", "dropequal",
            ]
        },
    }
)  # fmt: skip

ENDPOINT_COMMON = {
    "path": {"type": "string", "pattern": "^/"},
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "scheme": {"enum": ["http", "https"]},
    "relabelings": {"type": "array", "items": RELABEL},
    "metricRelabelings": {"type": "array", "items": RELABEL},
    "honorLabels": {"type": "boolean"},
}


def kind_schema(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return closed(
        {"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": METADATA, "spec": spec},
        ["apiVersion", "kind", "metadata", "spec"],
    )


POD_MONITOR = kind_schema(
    "monitoring.coreos.com/v1",
    "PodMonitor",
    closed(
        {
            "selector": LABEL_SELECTOR,
            "namespaceSelector": NAMESPACE_SELECTOR,
            "jobLabel": {"type": "string"},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}},
            "podMetricsEndpoints": {
                "type": "array",
                "minItems": 1,
                "items": closed({"port": {"type": "string", "minLength": 1}, **ENDPOINT_COMMON}, ["port"]),
            },
        },
        ["selector", "podMetricsEndpoints"],
    ),
)

SERVICE_MONITOR = kind_schema(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    closed(
        {
            "selector": LABEL_SELECTOR,
            "namespaceSelector": NAMESPACE_SELECTOR,
            "jobLabel": {"type": "string"},
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": closed({"port": {"type": "string", "minLength": 1}, **ENDPOINT_COMMON}, ["port"]),
            },
        },
        ["selector", "endpoints"],
    ),
)

RULE = {
    "oneOf": [
        closed(
            {
                "alert": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"},
                "expr": {"type": "string", "minLength": 1},
                "for": DURATION,
                "keep_firing_for": DURATION,
                "labels": STRING_MAP,
                "annotations": STRING_MAP,
            },
            ["alert", "expr"],
        ),
        closed(
            {"record": {"type": "string"}, "expr": {"type": "string", "minLength": 1}, "labels": STRING_MAP},
            ["record", "expr"],
        ),
    ]
}

PROMETHEUS_RULE = kind_schema(
    "monitoring.coreos.com/v1",
    "PrometheusRule",
    closed(
        {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": closed(
                    {
                        "name": {"type": "string", "minLength": 1},
                        "interval": DURATION,
                        "rules": {"type": "array", "items": RULE},
                    },
                    ["name", "rules"],
                ),
            }
        },
        ["groups"],
    ),
)

SCHEMAS = {"PodMonitor": POD_MONITOR, "ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}
