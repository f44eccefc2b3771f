"""Every OperatorSettings field is reachable from the chart's values, or left out on purpose
and docs/operator.md says why; operator.settings reaches the operator's environment as the
operator reads it, with the bounds the operator checks, and no default is stated twice
without a test holding the two equal."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from chart_tools import CHART, REPO, one, render

from slogate_operator.settings import ENV_PREFIX, OperatorSettings, SettingsError

FIELDS = {field.name: field for field in dataclasses.fields(OperatorSettings)}
DEDICATED = {
    "namespaces": "operator.watch",
    "peering": "operator.peering.name",
    "image": "operator.sidecarImage",
    "admin_token_secret": "operator.adminTokenSecretName",
    "liveness_port": "operator.healthPort",
    "metrics_port": "operator.metricsPort",
    "webhook_port": "operator.webhook.port",
    "webhook_failure_policy": "operator.webhook.failurePolicy",
    "webhook_service": "operator.webhook",
    "webhook_configuration": "operator.webhook",
    "network_policy": "networkPolicy.enabled",
    "admin_peers": "networkPolicy.prometheus",
}
"""Settings the chart depends on itself, each from a value of its own."""
LEFT_OUT = {"standalone", "priority", "kube_api", "webhook_url", "webhook_address"}
"""No chart value, on purpose (docs/operator.md says why)."""

VALUES_SCHEMA = json.loads((CHART / "values.schema.json").read_text())
SETTINGS_SCHEMA: dict[str, Any] = VALUES_SCHEMA["properties"]["operator"]["properties"]["settings"]
DEFAULT_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def operator_env(values: dict[str, Any]) -> dict[str, str]:
    container = one(render(values), "Deployment", "-operator").obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if e["name"].startswith(ENV_PREFIX)}


def test_every_setting_is_reachable_from_values_or_left_out_on_purpose() -> None:
    in_settings = {snake(key) for key in SETTINGS_SCHEMA["properties"]}
    assert SETTINGS_SCHEMA["additionalProperties"] is False  # a typo is an error, not a no-op
    assert in_settings <= set(FIELDS), in_settings - set(FIELDS)
    assert not in_settings & (set(DEDICATED) | LEFT_OUT)
    assert in_settings | set(DEDICATED) | LEFT_OUT == set(FIELDS)
    # The dedicated values are in the environment by default; nothing else is (code defaults).
    assert set(operator_env({})) == {ENV_PREFIX + name.upper() for name in DEDICATED}


@pytest.mark.parametrize(
    "settings", [{"resyncSecond": 60}, {"standalone": True}, {"priority": 3}, {"kubeApi": "http://127.0.0.1:8001"}]
)
def test_helm_refuses_a_setting_the_chart_does_not_take(settings: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError, match="schema"):
        render({"operator": {"settings": settings}})


def changed(name: str) -> int | float | str:
    """A value of the setting other than its default, that the operator accepts."""
    default = FIELDS[name].default
    if isinstance(default, str):  # the one text setting: a URL
        return "https://prometheus.example:9090/"
    assert isinstance(default, int | float), name
    assert not isinstance(default, bool), name
    return default * 3 + 7 if isinstance(default, int) else default * 2.5 + 0.25


def test_operator_settings_reach_the_operator_as_it_reads_them() -> None:
    wanted = {key: changed(snake(key)) for key in SETTINGS_SCHEMA["properties"]}
    env = operator_env({"operator": {"settings": wanted}})
    settings = OperatorSettings.from_env(env)
    for key, value in wanted.items():
        assert getattr(settings, snake(key)) == value, key
        assert getattr(settings, snake(key)) != FIELDS[snake(key)].default, key


def test_a_large_whole_number_reaches_an_integer_setting_whole() -> None:
    """Helm holds YAML numbers as floats and would print 1000000 as 1e+06."""
    env = operator_env({"operator": {"settings": {"jobTtlSeconds": 1000000, "pushBackoffSeconds": 1e-7}}})
    assert env[ENV_PREFIX + "JOB_TTL_SECONDS"] == "1000000"
    assert OperatorSettings.from_env(env).job_ttl_seconds == 1000000
    assert OperatorSettings.from_env(env).push_backoff_seconds == 1e-7


def bounds(key: str) -> tuple[float, float]:
    """(the lowest value the schema takes, a value just below it, which it refuses)."""
    schema = SETTINGS_SCHEMA["properties"][key]
    if "exclusiveMinimum" in schema:
        return schema["exclusiveMinimum"] + 1e-6, schema["exclusiveMinimum"]
    low = schema["minimum"]
    return low, low - (1 if schema["type"] == "integer" else 1e-6)


NUMBERS = sorted(key for key, schema in SETTINGS_SCHEMA["properties"].items() if schema["type"] != "string")


@pytest.mark.parametrize("key", NUMBERS)
def test_the_schema_bounds_are_the_operators(key: str) -> None:
    validator = jsonschema.Draft7Validator(VALUES_SCHEMA)
    lowest, below = bounds(key)
    env = ENV_PREFIX + snake(key).upper()
    assert (
        list(
            validator.iter_errors(
                DEFAULT_VALUES | {"operator": {**DEFAULT_VALUES["operator"], "settings": {key: lowest}}}
            )
        )
        == []
    )
    OperatorSettings.from_env({env: repr(lowest)})
    assert list(validator.iter_errors({"operator": {"settings": {key: below}}}))
    with pytest.raises(SettingsError):
        OperatorSettings.from_env({env: repr(below)})


@pytest.mark.parametrize("url", ["prometheus:9090", "http://", "ftp://prometheus", "http://a b"])
def test_the_schema_and_the_operator_refuse_the_same_prometheus_urls(url: str) -> None:
    validator = jsonschema.Draft7Validator(VALUES_SCHEMA)
    assert list(validator.iter_errors({"operator": {"settings": {"prometheusUrl": url}}}))
    with pytest.raises(SettingsError):
        OperatorSettings.from_env({ENV_PREFIX + "PROMETHEUS_URL": url})


def test_values_that_restate_an_operator_default_agree_with_it() -> None:
    operator = DEFAULT_VALUES["operator"]
    assert operator["peering"]["name"] == FIELDS["peering"].default
    assert operator["adminTokenSecretName"] == FIELDS["admin_token_secret"].default
    assert operator["healthPort"] == FIELDS["liveness_port"].default
    assert operator["metricsPort"] == FIELDS["metrics_port"].default
    assert operator["settings"] == {}


def test_the_docs_say_where_each_setting_comes_from_in_the_chart() -> None:
    docs = (REPO / "docs" / "operator.md").read_text()
    chart_part = docs[docs.index("From the Helm chart") :]
    for name, value in DEDICATED.items():
        row = next(line for line in chart_part.splitlines() if f"`{ENV_PREFIX}{name.upper()}`" in line)
        assert f"`{value}" in row, name
    assert "`operator.settings.<field in camelCase>`" in chart_part
    left_out = chart_part[chart_part.index("Five settings have no chart value") :]
    for name in LEFT_OUT:
        assert f"- `{ENV_PREFIX}{name.upper()}`:" in left_out, name
