"""The Grafana dashboard: every query parses (promtool) and reads only exported metrics; the
autoscaling panel's demand is the operator's query, evaluated by promtool on the same series;
the Tenants row's queries, evaluated by promtool too."""

from __future__ import annotations

from pathlib import Path

import yaml
from chart_tools import CHART, concrete, dashboard, dashboard_exprs, one, render, run_promtool
from sidecar_exposition import unknown_references

from slogate_operator.demand_query import OFFERED_WORK, demand_query


def test_dashboard_configmap_carries_grafanas_sidecar_label_and_the_file_verbatim() -> None:
    configmap = one(render(), "ConfigMap", "-dashboard")
    assert configmap.obj["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap.obj["data"]["slogate.json"].strip() == (CHART / "dashboards" / "slogate.json").read_text().strip()
    elsewhere = one(render({"monitoring": {"dashboard": {"namespace": "monitoring"}}}), "ConfigMap", "-dashboard")
    assert elsewhere.obj["metadata"]["namespace"] == "monitoring"


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool has no offline `query` parser; a recording rule per query is parsed the same way."""
    exprs = list(dashboard_exprs(dashboard()))
    rules = [{"record": f"slogate_dashboard:query_{i}", "expr": concrete(expr)} for i, (_, expr) in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = run_promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_a_broken_query_is_caught(tmp_path: Path) -> None:
    """The parse check can fail: an unbalanced query is refused."""
    path = tmp_path / "broken.yaml"
    broken = concrete('sum by (class) (rate(slogate_requests_total{namespace=~"$namespace"}[$__rate_interval])')
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [{"record": "x:y", "expr": broken}]}]}))
    assert run_promtool("check", "rules", str(path)).returncode != 0


def test_queries_read_only_metrics_and_labels_the_sidecar_exports() -> None:
    problems = {where: unknown_references(expr) for where, expr in dashboard_exprs(dashboard())}
    assert {where: p for where, p in problems.items() if p} == {}


def test_dashboard_shows_what_the_issue_asks_for() -> None:
    """Decisions by reason and class, rejection ratio, queued tokens, predicted vs actual
    TTFT, SLO attainment, thresholds and calibration changes: each has a panel."""
    # (the sidecar's and the operator's metrics)
    board = dashboard()
    by_metric: dict[str, list[str]] = {}
    for where, expr in dashboard_exprs(board):
        for word in expr.replace("(", " ").replace("{", " ").split():
            if word.startswith("slogate_"):
                by_metric.setdefault(word, []).append(where)
    wanted = {
        "slogate_decisions_total",  # decisions by reason and class
        "slogate_requests_total",  # rejection ratio
        "slogate_deferral_outcomes_total",  # ... including deferrals that timed out
        "slogate_queued_prefill_tokens",
        "slogate_threshold_token_budget",
        "slogate_ttft_predicted_seconds_bucket",
        "slogate_ttft_actual_seconds_bucket",
        "slogate_ttft_prediction_error_ratio_bucket",
        "slogate_slo_requests_total",  # SLO attainment
        "slogate_thresholds_info",  # which calibration is in force
        "slogate_threshold_updates_total",  # calibration / threshold changes
        "slogate_upstream_up",
        "slogate_thresholds_loaded",
        "slogate_operator_alerting_rejection_ratio",  # each policy's alert ratios
        "slogate_operator_calibrations_total",  # calibrations by outcome
        OFFERED_WORK,  # the autoscaling demand
        "slogate_retried_requests_total",  # retry pressure beside it
        "slogate_tenant_admitted_prompt_tokens_total",  # the Tenants row
        "slogate_tenant_refused_prompt_tokens_total",
        "slogate_tenant_share_refusals_total",
        "slogate_tenant_served_tokens",
    }
    assert wanted - set(by_metric) == set()
    reasons = [e for _, e in dashboard_exprs(board) if "slogate_decisions_total" in e]
    assert any("by (reason, class)" in e for e in reasons)
    assert board["uid"] == "slogate-admission"
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "namespace", "workload"]
    # Panels do not overlap on Grafana's 24-column grid.
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert g["x"] + g["w"] <= 24, panel["title"]
        assert not cells & mine, f"panel {panel['title']!r} overlaps another"
        cells |= mine


def autoscaling_targets() -> dict[str, str]:
    """refId -> PromQL of the "Autoscaling" row's panel, Grafana's variables filled in."""
    (panel,) = [p for p in dashboard()["panels"] if p["title"] == "Demand in pods' worth vs replicas"]
    return {t["refId"]: concrete(t["expr"]) for t in panel["targets"]}


def test_the_autoscaling_panel_reads_the_operators_demand_and_the_pods_with_thresholds(tmp_path: Path) -> None:
    """promtool evaluates the panel on two pods with thresholds and one without (no series).

    Work 0.75 + 1.25 server-s/s: 2 pods' worth, what the operator's query gives too. First
    tries 1 + 3 /s at 0.5 server-s each, so 0.5 retries/s weigh 0.25 pods. The capacity
    gauges (0.5 reference requests/s) are no divisor: requests over them would read 8.
    """
    targets = autoscaling_targets()
    assert set(targets) == {"A", "B", "C"}
    pod = 'namespace="llm", policy="smollm2", workload="smollm2", pod="{}"'
    other = 'namespace="llm", policy="other", workload="other", pod="other-1"'
    # Counters grow per 15 s step: 11.25 server-seconds a step is 0.75 server-s/s.
    series = {
        f"{OFFERED_WORK}{{{pod.format('a')}}}": "0+11.25x40",
        f"{OFFERED_WORK}{{{pod.format('b')}}}": "0+18.75x40",
        f"{OFFERED_WORK}{{{other}}}": "0+15x40",
        f"slogate_offered_requests_total{{{pod.format('a')}}}": "0+15x40",
        f"slogate_offered_requests_total{{{pod.format('b')}}}": "0+45x40",
        f"slogate_offered_requests_total{{{other}}}": "0+15x40",
        f"slogate_retried_requests_total{{{pod.format('a')}}}": "0+7.5x40",
        f"slogate_retried_requests_total{{{pod.format('b')}}}": "0+0x40",
        f"slogate_retried_requests_total{{{other}}}": "0+0x40",
        f"slogate_capacity_requests_per_second{{{pod.format('a')}}}": "0.5x40",
        f"slogate_capacity_requests_per_second{{{pod.format('b')}}}": "0.5x40",
        f"slogate_capacity_requests_per_second{{{other}}}": "0.5x40",
    }
    smollm2 = {"namespace": "llm", "workload": "smollm2"}
    expected = {
        targets["A"]: [(smollm2, 2), ({"namespace": "llm", "workload": "other"}, 1)],
        demand_query("llm", "smollm2", 60): [({}, 2)],
        targets["B"]: [(smollm2, 2), ({"namespace": "llm", "workload": "other"}, 1)],
        targets["C"]: [(smollm2, 0.25), ({"namespace": "llm", "workload": "other"}, 0)],
    }
    assert_evaluates(tmp_path / "dashboard.test.yaml", series, expected)


def assert_evaluates(
    path: Path, series: dict[str, str], expected: dict[str, list[tuple[dict[str, str], float]]]
) -> None:
    """promtool evaluates each query at 5 m over ``series`` (sampled every 15 s) to exactly
    the samples ``expected`` names."""
    tests = [
        {
            "interval": "15s",
            "input_series": [{"series": name, "values": values} for name, values in series.items()],
            "promql_expr_test": [
                {
                    "expr": expr,
                    "eval_time": "5m",
                    "exp_samples": [{"labels": _labels(labels), "value": value} for labels, value in samples],
                }
                for expr, samples in expected.items()
            ],
        }
    ]
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "15s", "tests": tests}, sort_keys=False))
    checked = run_promtool("test", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _labels(labels: dict[str, str]) -> str:
    """promtool's label set notation: {a="b", ...}."""
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def row_targets(row: str) -> dict[str, str]:
    """Panel title -> its one query (Grafana's variables filled in), for the panels under ``row``."""
    panels = dashboard()["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == row)
    found: dict[str, str] = {}
    for panel in panels[start + 1 :]:
        if panel["type"] == "row":
            break
        (target,) = panel["targets"]
        found[panel["title"]] = concrete(target["expr"])
    return found


def test_the_tenants_row_sums_the_pods_and_keeps_the_ten_largest_tenants(tmp_path: Path) -> None:
    """promtool evaluates the Tenants row on two pods and twelve tenants; the Decisions panel
    shows reason tenant_share.

    Tenant t<i> is admitted i + 1 prompt tokens/s on pod a; t0 another 100 on pod b. The ten
    largest are t0 (101) and t3..t11; t1 and t2 are left out. Refused tokens and share refusals
    come from one tenant on both pods; served tokens are gauges, summed over the pods.
    """
    targets = row_targets("Tenants")
    assert set(targets) == {
        "Admitted prompt tokens/s by tenant (top 10)",
        "Refused prompt tokens/s by tenant (top 10)",
        "Share refusals by tenant (top 10)",
        "Served tokens by tenant (top 10)",
    }
    pod = 'namespace="llm", workload="smollm2", pod="{}", tenant="{}"'
    # Counters grow per 15 s step: 15 x (tokens/s) a step.
    series = {f"slogate_tenant_admitted_prompt_tokens_total{{{pod.format('a', f't{i}')}}}": f"0+{15 * (i + 1)}x40"
              for i in range(12)}  # fmt: skip
    series |= {
        f"slogate_tenant_admitted_prompt_tokens_total{{{pod.format('b', 't0')}}}": "0+1500x40",
        f"slogate_tenant_refused_prompt_tokens_total{{{pod.format('a', 't5')}}}": "0+300x40",
        f"slogate_tenant_refused_prompt_tokens_total{{{pod.format('b', 't5')}}}": "0+150x40",
        f"slogate_tenant_refused_prompt_tokens_total{{{pod.format('a', 't0')}}}": "0+0x40",
        f"slogate_tenant_share_refusals_total{{{pod.format('a', 't5')}}}": "0+15x40",
        f"slogate_tenant_share_refusals_total{{{pod.format('b', 't5')}}}": "0+7.5x40",
        f"slogate_tenant_served_tokens{{{pod.format('a', 't5')}}}": "4000x40",
        f"slogate_tenant_served_tokens{{{pod.format('b', 't5')}}}": "1000x40",
        f"slogate_tenant_served_tokens{{{pod.format('a', '_other')}}}": "250x40",
        'slogate_decisions_total{namespace="llm", workload="smollm2", pod="a", outcome="reject", '
        'reason="tenant_share", class="batch"}': "0+30x40",
    }
    reasons = next(concrete(e) for w, e in dashboard_exprs(dashboard()) if "Decisions by reason and class" in w)
    admitted = [({"tenant": "t0"}, 101)] + [({"tenant": f"t{i}"}, i + 1) for i in range(3, 12)]
    expected = {
        targets["Admitted prompt tokens/s by tenant (top 10)"]: admitted,
        targets["Refused prompt tokens/s by tenant (top 10)"]: [({"tenant": "t5"}, 30), ({"tenant": "t0"}, 0)],
        targets["Share refusals by tenant (top 10)"]: [({"tenant": "t5"}, 1.5)],
        targets["Served tokens by tenant (top 10)"]: [({"tenant": "t5"}, 5000), ({"tenant": "_other"}, 250)],
        reasons: [({"reason": "tenant_share", "class": "batch"}, 2)],
    }
    assert_evaluates(tmp_path / "tenants.test.yaml", series, expected)
