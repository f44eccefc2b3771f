"""The chart's side of autoscaling: the prometheus-adapter rule it ships as an option (a file
generated from slogate_operator.adapter_rule, never stale), asking what KEDA's trigger asks,
and the operator's RBAC for the autoscalers (exactly what slogate_operator.rbac lists)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from chart_tools import CHART, NAMESPACE, one, render

from slogate_operator import adapter_rule
from slogate_operator.autoscaling import EXTERNAL_METRIC
from slogate_operator.demand_query import DEFAULT_WINDOW_S, demand_query, label_matchers, ratio_query
from slogate_operator.rbac import PERMISSIONS

ENABLED = {"autoscaling": {"prometheusAdapter": {"enabled": True}}}


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_the_generated_rule_file_is_current() -> None:
    committed = (CHART / "files" / "prometheus-adapter-rules.yaml").read_text()
    assert committed == adapter_rule.text(), "stale: regenerate it with `python -m slogate_operator.adapter_rule`"
    check = subprocess.run([sys.executable, "-m", "slogate_operator.adapter_rule", "--check"], capture_output=True,
                           text=True, check=False, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "rules.yaml"
    stale.write_text(adapter_rule.text().replace("[60s]", "[5m]"))
    assert adapter_rule.main(["--check", "--out", str(stale)]) == 1
    assert adapter_rule.main(["--out", str(stale)]) == 0
    assert adapter_rule.main(["--check", "--out", str(stale)]) == 0


def test_the_adapter_configmap_is_off_by_default() -> None:
    assert [o.name for o in render() if o.name.endswith("-prometheus-adapter")] == []


def test_the_adapter_configmap_holds_one_external_rule_asking_the_demand_query() -> None:
    configmap = one(render(ENABLED), "ConfigMap", "-prometheus-adapter")
    assert configmap.obj["metadata"]["namespace"] == NAMESPACE
    config = yaml.safe_load(configmap.obj["data"]["config.yaml"])
    assert config == adapter_rule.config()
    (rule,) = config["externalRules"]
    assert list(config) == ["externalRules"]
    # The work counter names the series: the one the query sums (a capacity gauge is no divisor).
    assert rule["seriesQuery"] == 'slogate_offered_work_seconds_total{namespace!="",workload!=""}'
    assert rule["name"]["matches"] == "^slogate_offered_work_seconds_total$"
    assert rule["resources"] == {"overrides": {"namespace": {"resource": "namespace"}}}
    assert rule["name"]["as"] == EXTERNAL_METRIC == "slogate_demand_pods"
    assert rule["metricsQuery"] == ratio_query("<<.LabelMatchers>>", 60)
    assert DEFAULT_WINDOW_S == 60
    # The adapter fills in the namespace and the HPA's selector (workload=<Deployment>): KEDA's query.
    filled = rule["metricsQuery"].replace("<<.LabelMatchers>>", label_matchers("llm", "smollm2"))
    assert filled == demand_query("llm", "smollm2", 60)


def test_the_adapter_configmap_goes_to_the_adapters_namespace() -> None:
    values = {"autoscaling": {"prometheusAdapter": {"enabled": True, "namespace": "monitoring"}}}
    assert one(render(values), "ConfigMap", "-prometheus-adapter").obj["metadata"]["namespace"] == "monitoring"


def test_the_operator_may_manage_autoscalers_and_never_deployment_scale() -> None:
    granted = grants(one(render(), "ClusterRole").obj["rules"])
    listed = {(p.group, p.resource, v) for p in PERMISSIONS for v in p.verbs if p.group in ("keda.sh", "autoscaling")}
    assert (
        {g for g in granted if g[0] in ("keda.sh", "autoscaling")}
        == listed
        == {("keda.sh", "scaledobjects", verb) for verb in ("list", "create", "patch", "delete")}
        | {("autoscaling", "horizontalpodautoscalers", verb) for verb in ("get", "list", "create", "patch", "delete")}
    )
    assert not [g for g in granted if g[1] == "deployments/scale"]
