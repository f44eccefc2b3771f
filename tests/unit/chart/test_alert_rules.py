"""The alert rules, rendered from the chart (their one source) and checked by promtool.

`promtool check rules` parses every expression and template; `promtool test rules` runs
alerts.test.yaml, in which every alert fires on some series and stays quiet on others.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from chart_tools import (
    CHART,
    CI_VALUES,
    REPO,
    alerts_by_name,
    load_values,
    render,
    render_files,
    rule_groups,
    run_promtool,
)
from sidecar_exposition import unknown_references

UNIT_TESTS = Path(__file__).with_name("alerts.test.yaml")

# values.yaml key -> the alert it configures, and the values key of its main threshold.
ALERTS = {
    "sheddingWarning": ("SlogateSheddingWarning", "ratio"),
    "sheddingCritical": ("SlogateSheddingCritical", "ratio"),
    "admittedMissingSlo": ("SlogateAdmittedMissingSlo", "missRatio"),
    "ttftPredictionDrift": ("SlogateTTFTPredictionDrift", "optimisticAbove"),
    "calibrationFailing": ("SlogateCalibrationFailing", None),
    "thresholdsMissing": ("SlogateSidecarWithoutThresholds", None),
    "thresholdsRejected": ("SlogateThresholdsRejected", None),
    "upstreamUnreachable": ("SlogateUpstreamUnreachable", None),
    "sheddingAtMaxReplicas": ("SlogateSheddingAtMaxReplicas", None),
    "sheddingWhileScalingUp": ("SlogateSheddingWhileScalingUp", None),
}


def write_suite(tmp_path: Path, values: dict[str, Any] | None = None) -> Path:
    """rules.yaml rendered with `values`, and the unit tests pointing at it."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups(values)}, sort_keys=False))
    suite = yaml.safe_load(UNIT_TESTS.read_text())
    suite["rule_files"] = [rules.name]
    path = tmp_path / "alerts.test.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def unit_test_cases() -> list[dict[str, Any]]:
    suite = yaml.safe_load(UNIT_TESTS.read_text())
    return [case for test in suite["tests"] for case in test.get("alert_rule_test", [])]


@pytest.mark.parametrize("values_file", [None, *CI_VALUES], ids=lambda p: p.name if p else "default")
def test_promtool_check_rules_accepts_every_rendering(tmp_path: Path, values_file: Path | None) -> None:
    values = load_values(values_file) if values_file else {}
    if not any(o.kind == "PrometheusRule" for o in render(values)):
        assert values["monitoring"]["prometheusRule"]["enabled"] is False
        return
    groups = rule_groups(values)
    count = sum(len(g["rules"]) for g in groups)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    checked = run_promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {count} rules found" in checked.stdout, checked.stdout


def test_promtool_unit_tests_pass_on_the_default_rules(tmp_path: Path) -> None:
    tested = run_promtool("test", "rules", str(write_suite(tmp_path)), cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def promtool_failures(output: str) -> dict[str, str]:
    """Test-case name -> promtool's report of it (`name: ...` starts each failed case)."""
    cases = re.split(r"^\s+name: ", output, flags=re.MULTILINE)[1:]
    return {case.split(",\n", 1)[0]: case for case in cases}


def test_promtool_fails_when_the_values_move_a_threshold(tmp_path: Path) -> None:
    """The harness can fail: with a 20 % fallback warning ratio, the 10 % cases without the
    operator's figures stop firing (the ceiling alert's too: it reuses the warning's ratio),
    while those with a policy figure, or 40 % shedding, still fire."""
    values = {"alerts": {"sheddingWarning": {"fallbackRatio": 0.2}}}
    tested = run_promtool("test", "rules", str(write_suite(tmp_path, values)), cwd=tmp_path)
    assert tested.returncode != 0
    failed = promtool_failures(tested.stdout + tested.stderr)
    silenced = sorted(name for name, report in failed.items() if "got:[]" in report)
    assert [name.split(" ")[0] for name in silenced] == ["ceiling", "deferrals", "moderate"], list(failed)
    # The policy figures (40 % over 5 %, 3 % over a strict 2 %) still fire; only the
    # description, which names the fallback, differs from the pinned text.
    still_firing = sorted(name.split(" ")[0] for name, report in failed.items() if "got:[]" not in report)
    assert still_firing == ["a", "heavy", "scale-up"], list(failed)
    for name, report in failed.items():
        if "got:[]" not in report:
            assert "(20% where the operator's figure is not scraped)" in report, name


def test_one_template_writes_every_rule_from_a_dict_and_no_promql_is_printf_built() -> None:
    """The design of _alerts.tpl: "slogate.alertRule" is the only place a rule is written,
    fed one dict per alert; PromQL lives in multi-line "slogate.expr.*" templates."""
    text = (CHART / "templates" / "_alerts.tpl").read_text()
    assert text.count("- alert:") == 1
    assert text.count('include "slogate.alertRule" (dict ') == len(ALERTS)
    formats = re.findall(r'printf "((?:[^"\\]|\\.)*)"', text)
    assert formats, "the pattern finds the printf formats"
    promql = [f for f in formats if re.search(r"slogate_[a-z_]+|\b(rate|increase|sum by)\b", f)]
    assert promql == []


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    alerts = set(alerts_by_name(rule_groups()))
    cases = unit_test_cases()
    fired = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert {c["alertname"] for c in cases} <= alerts, "tests name an alert the rules do not have"
    assert alerts - fired == set(), "alerts never shown firing"
    assert alerts - quiet == set(), "alerts never shown quiet"
    assert len(alerts) == len(ALERTS)


def test_rules_read_only_metrics_and_labels_that_exist() -> None:
    problems = {name: unknown_references(rule["expr"]) for name, rule in alerts_by_name(rule_groups()).items()}
    assert {name: p for name, p in problems.items() if p} == {}


def test_every_alert_carries_summary_description_severity_and_a_runbook_section() -> None:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    sections = {line[3:].strip().lower() for line in runbooks.splitlines() if line.startswith("## ")}
    for name, rule in alerts_by_name(rule_groups()).items():
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert all(annotations[k].strip() for k in annotations), name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        url, anchor = annotations["runbook_url"].split("#")
        # No docs.baseURL by default: the path of the runbooks in the slogate source, no host.
        assert url == "docs/runbooks.md"
        assert anchor == name.lower()
        assert anchor in sections, f"docs/runbooks.md has no section '## {name}'"


def runbook_urls(values: dict[str, Any]) -> set[str]:
    """Each alert's runbook_url with its own anchor taken off (one page for all)."""
    pages = set()
    for name, rule in alerts_by_name(rule_groups(values)).items():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert anchor == name.lower(), rule["annotations"]["runbook_url"]
        pages.add(page)
    return pages


def test_runbook_urls_are_made_from_docs_base_url_and_pretend_no_host_without_it() -> None:
    assert runbook_urls({}) == {"docs/runbooks.md"}
    fork = "https://git.example.com/team/slogate/blob/main"
    assert runbook_urls({"docs": {"baseURL": fork}}) == {f"{fork}/docs/runbooks.md"}
    assert runbook_urls({"docs": {"baseURL": fork + "/"}}) == {f"{fork}/docs/runbooks.md"}
    # A page of your own (a wiki copy of the runbooks) wins over docs.baseURL.
    wiki = {"docs": {"baseURL": fork}, "alerts": {"runbookBaseUrl": "https://wiki.example.com/slogate-runbooks"}}
    assert runbook_urls(wiki) == {"https://wiki.example.com/slogate-runbooks"}
    # Nothing in the chart names a host of its own.
    rendered = "\n".join(render_files().values()) + (CHART / "Chart.yaml").read_text()
    assert "http" not in "".join(re.findall(r"runbook_url: .*", rendered))
    assert "github.com" not in rendered


@pytest.mark.parametrize("url", ["github.com/me/slogate", "https://x.example.com/a#b", "https://x.example.com/a b"])
def test_the_schema_refuses_a_base_url_that_would_make_broken_links(url: str) -> None:
    for values in ({"docs": {"baseURL": url}}, {"alerts": {"runbookBaseUrl": url}}):
        with pytest.raises(helm_python.HelmError, match="schema"):
            render(values)


@pytest.mark.parametrize("key", sorted(ALERTS))
def test_each_alert_can_be_switched_off_alone(key: str) -> None:
    name, _ = ALERTS[key]
    default = yaml.safe_load((CHART / "values.yaml").read_text())["alerts"][key]
    off = copy.deepcopy(default) | {"enabled": False}
    remaining = set(alerts_by_name(rule_groups({"alerts": {key: off}})))
    assert remaining == {n for n, _ in ALERTS.values()} - {name}


@pytest.mark.parametrize("key", sorted(ALERTS))
def test_each_alerts_for_and_threshold_can_be_overridden(key: str) -> None:
    name, threshold = ALERTS[key]
    override: dict[str, Any] = {"for": "17m", "severity": "page"}
    if threshold is not None:
        override[threshold] = 0.123
    rule = alerts_by_name(rule_groups({"alerts": {key: override}}))[name]
    assert rule["for"] == "17m"
    assert rule["labels"]["severity"] == "page"
    if threshold is not None:
        assert re.search(r"> 0\.123\b", rule["expr"]), rule["expr"]


def test_shedding_compares_each_policy_with_its_own_figures_and_falls_back_to_the_crds_defaults() -> None:
    """Default: the operator's per-policy spec.alerting ratios; the fallback equals the
    CRD's defaults; a fixed ratio in the values replaces both."""
    rules = alerts_by_name(rule_groups())
    for name, severity, fallback in (
        ("SlogateSheddingWarning", "warning", 0.05),
        ("SlogateSheddingCritical", "critical", 0.25),
    ):
        expr = rules[name]["expr"]
        assert f'slogate_operator_alerting_rejection_ratio{{severity="{severity}"}}' in expr
        assert f"+ {fallback}\n" in expr
    assert alerting_defaults_in_crd() == {"rejectionRatioWarning": 0.05, "rejectionRatioCritical": 0.25}
    fixed = alerts_by_name(rule_groups({"alerts": {"sheddingWarning": {"ratio": 0.07}}}))
    assert "slogate_operator" not in fixed["SlogateSheddingWarning"]["expr"]
    assert "> 0.07\n" in fixed["SlogateSheddingWarning"]["expr"]
    assert "more than 7%" in fixed["SlogateSheddingWarning"]["annotations"]["description"]


def test_per_policy_thresholds_need_policy_in_group_by() -> None:
    with pytest.raises(helm_python.HelmError, match=r"alerts\.groupBy must include namespace and policy"):
        rule_groups({"alerts": {"groupBy": ["namespace", "workload"]}})
    fixed = {
        "groupBy": ["namespace", "workload"],
        "sheddingWarning": {"ratio": 0.05},
        "sheddingCritical": {"ratio": 0.25},
    }
    groups = rule_groups({"alerts": fixed})
    assert "sum by (namespace, workload)" in alerts_by_name(groups)["SlogateSheddingWarning"]["expr"]


def test_the_autoscaling_alerts_join_on_namespace_and_workload_and_need_them_in_group_by() -> None:
    rules = alerts_by_name(rule_groups())
    for name, op in (("SlogateSheddingAtMaxReplicas", ">="), ("SlogateSheddingWhileScalingUp", "<")):
        expr = rules[name]["expr"]
        # The warning's shedding condition, whole, then the workload's HPA.
        assert " ".join(rules["SlogateSheddingWarning"]["expr"].split()) in " ".join(expr.split()), name
        assert "and on (namespace, workload)" in expr
        assert 'kube_horizontalpodautoscaler_info{scaletargetref_kind="Deployment"}' in expr
        assert f"\n    {op}\n" in expr, expr
    without_workload = {"groupBy": ["namespace", "policy"]}
    with pytest.raises(helm_python.HelmError, match=r"alerts\.groupBy must include namespace and workload"):
        rule_groups({"alerts": without_workload})
    off = {"enabled": False, "for": "1m", "severity": "warning"}
    quiet = {**without_workload, "sheddingAtMaxReplicas": off, "sheddingWhileScalingUp": off}
    assert "SlogateSheddingWarning" in alerts_by_name(rule_groups({"alerts": quiet}))


def test_the_reference_check_knows_kube_state_metrics_names_and_labels() -> None:
    """The check the autoscaling alerts pass can fail: a misspelt series, a label it lacks."""
    assert unknown_references('kube_horizontalpodautoscaler_info{scaletargetref_kind="Deployment"}') == []
    assert unknown_references("kube_horizontalpodautoscaler_status_max_replicas") != []
    assert unknown_references('kube_horizontalpodautoscaler_spec_max_replicas{scaletargetref_kind="Deployment"}') != []


def alerting_defaults_in_crd() -> dict[str, float]:
    """spec.alerting.*.default of the AdmissionPolicy CRD (the single source in crds/)."""
    for path in sorted((REPO / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition" or doc["spec"]["group"] != "slogate.dev":
                continue
            version = next(v for v in doc["spec"]["versions"] if v.get("storage"))
            alerting = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["alerting"]
            return {k: v["default"] for k, v in alerting["properties"].items() if "default" in v}
    raise AssertionError("no slogate.dev CustomResourceDefinition under crds/")


def test_group_by_and_tuned_values_reach_every_ratio_alert() -> None:
    tuned = load_values(CHART / "ci" / "tuned-alerts-values.yaml")
    rules = alerts_by_name(rule_groups(tuned))
    assert "SlogateTTFTPredictionDrift" not in rules
    assert "SlogateCalibrationFailing" not in rules
    for name in ("SlogateSheddingWarning", "SlogateSheddingCritical", "SlogateAdmittedMissingSlo"):
        assert "sum by (namespace, policy, workload, class)" in rules[name]["expr"], name
        assert rules[name]["labels"]["team"] == "inference"
        assert rules[name]["annotations"]["runbook_url"].startswith("https://runbooks.example.com/slogate#")
    assert "[10m]" in rules["SlogateSheddingWarning"]["expr"]
    assert "> 0.02\n" in rules["SlogateSheddingWarning"]["expr"]
    assert rules["SlogateSheddingCritical"]["for"] == "3m"
