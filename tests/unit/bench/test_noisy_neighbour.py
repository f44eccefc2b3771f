"""The noisy neighbour's analysis (``noisy_neighbour``, ``reports.tenants``) on canned
results: the arrivals each tenant is sent, the per-tenant tallies, the sidecar's counts read from
its metrics, the means and goals, the section and the figure. No llama-server, no sidecar."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from canned_profiles import smollm2_profile
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy
from slogate_bench.reports import sections as report_sections
from slogate_bench.reports.benchmarks import write_report
from slogate_bench.reports.sections import tenants_sections
from slogate_bench.reports.tenants import (
    B_ALONE,
    HEADING,
    LIGHT,
    NOISY,
    PLOT,
    TOTAL,
    WITH,
    WITHOUT,
    goals,
    summary,
    table_rows,
    tenants_plot,
    tenants_section,
)
from slogate_bench.results import OUTCOME_COLUMNS, Outcome, Result, Run
from slogate_bench.runs.noisy_neighbour import (
    LOADS,
    VARIANTS,
    gate_tallies,
    policies,
    run_row,
    tally,
    tenant_tallies,
)
from slogate_sim.tenant_traffic import tenant_schedule
from slogate_sim.workloads import preset

SLO = 2.0
REPO = Path(__file__).resolve().parents[3]
PROFILE = smollm2_profile()
SMOLLM2_VOCABULARY = 49_152
"""Token ids llama-server accepts for the bundled model: a prompt beyond them is answered 400."""


def result(tenant: str | None, outcome: Outcome, ttft: float | None = None) -> Result:
    status = {"rejected": 429, "refused": 400, "timeout": 0}.get(outcome, 200)
    return Result(outcome, status, ttft, (ttft or 0.0) + 1.0, tenant=tenant)


# --- arrivals --------------------------------------------------------------------------------------------------------


def test_each_tenant_is_sent_the_same_requests_whoever_else_sends() -> None:
    chat = preset("chat")
    alone = tenant_schedule({LIGHT: 0.5}, 60.0, chat, seed=2)
    beside = tenant_schedule({NOISY: 3.0, LIGHT: 0.5}, 60.0, chat, seed=2)
    light = [a for a in beside if a.tenant == LIGHT]
    assert alone == light  # times, prompts, lengths: the very same requests
    assert len(beside) > len(light) > 10
    assert [a.at_s for a in beside] == sorted(a.at_s for a in beside)
    assert {a.tenant for a in beside} == {NOISY, LIGHT}
    assert tenant_schedule({LIGHT: 0.5}, 60.0, chat, seed=3) != alone  # another seed, other arrivals


def test_every_prompt_is_made_of_tokens_the_model_has() -> None:
    arrivals = tenant_schedule({NOISY: 4.0, LIGHT: 0.25, "C": 1.0}, 60.0, preset("chat"), seed=1)
    assert max(a.first_token_id + a.prompt_tokens for a in arrivals) <= SMOLLM2_VOCABULARY
    assert all(a.headers()["X-Slogate-Tenant"] == a.tenant for a in arrivals)


def test_the_policies_differ_in_the_tenant_policy_only() -> None:
    without, with_tenants = policies()
    assert without.tenants is None
    assert with_tenants.tenants is not None
    assert with_tenants.model_copy(update={"tenants": None}) == without
    profile = smollm2_profile()
    derived = [
        derive_thresholds(p, profile, derived_at=datetime(2026, 1, 1, tzinfo=UTC)) for p in (without, with_tenants)
    ]
    assert derived[0].tenants is None
    assert derived[1].tenants is not None
    assert derived[1].tenants.output_weight_measured
    assert derived[0].concurrency_cap == derived[1].concurrency_cap  # the same gate otherwise
    assert [v.tenant_policy for v in VARIANTS] == [True, False, True]
    assert LOADS == {NOISY: 4.0, LIGHT: 0.25}


# --- tallies ---------------------------------------------------------------------------------------------------------


def test_a_tally_counts_the_admitted_and_their_attainment() -> None:
    results = [
        result(LIGHT, "ok", 0.5),
        result(LIGHT, "ok", 1.9),
        result(LIGHT, "ok", 2.5),  # admitted, late
        result(LIGHT, "timeout"),  # admitted, its client gave up: a miss
        result(LIGHT, "rejected"),  # not admitted
        result(LIGHT, "refused"),  # not admitted (400: never fits)
    ]
    counted = tally(results, duration_s=10.0, slo_s=SLO)
    assert (counted["requests"], counted["admitted"], counted["within_slo"]) == (6, 4, 2)
    assert (counted["ok"], counted["rejected"], counted["refused"], counted["timeout"]) == (3, 1, 1, 1)
    assert counted["attainment"] == pytest.approx(0.5)
    assert counted["goodput_rps"] == pytest.approx(0.2)
    assert tally([result(LIGHT, "rejected")], 10.0, SLO)["attainment"] is None  # nothing admitted


def test_tenant_tallies_add_up_to_the_total() -> None:
    results = [result(NOISY, "ok", 0.4)] * 3 + [result(NOISY, "rejected")] * 5 + [result(LIGHT, "ok", 3.0)]
    run = Run(10.0, results)
    tallies = tenant_tallies(run, (NOISY, LIGHT), SLO)
    assert set(tallies) == {NOISY, LIGHT, TOTAL}
    for key in ("requests", "ok", "within_slo", "rejected", "admitted"):
        assert tallies[NOISY][key] + tallies[LIGHT][key] == tallies[TOTAL][key], key
    assert (tallies[NOISY]["requests"], tallies[NOISY]["within_slo"], tallies[LIGHT]["within_slo"]) == (8, 3, 0)
    assert tallies[LIGHT]["attainment"] == 0.0
    row = run_row(VARIANTS[2], 1, run, None, SLO)
    assert (row["variant"], row["seed"], row["tenant_policy"], row["tenants"]) == (WITH, 1, True, tallies)


def metrics_text(decisions: Mapping[tuple[str, str], int], tenants: Mapping[str, tuple[int, int, int]]) -> str:
    """A sidecar's /metrics as prometheus_client prints it (with the `_created` samples too)."""
    registry = CollectorRegistry()
    counted = Counter("slogate_decisions_total", "d", ("outcome", "reason", "class"), registry=registry)
    for (outcome, reason), n in decisions.items():
        counted.labels(outcome, reason, "default").inc(n)
    per_tenant = [
        Counter(name, "t", ("tenant",), registry=registry)
        for name in (
            "slogate_tenant_admitted_requests_total",
            "slogate_tenant_refused_requests_total",
            "slogate_tenant_share_refusals_total",
        )
    ]
    for tenant, counts in tenants.items():
        for counter, n in zip(per_tenant, counts, strict=True):
            counter.labels(tenant).inc(n)
    return generate_latest(registry).decode()


def test_the_sidecars_counts_are_read_from_its_metrics() -> None:
    text = metrics_text(
        {("reject", "ttft"): 4, ("reject", "tenant_share"): 7, ("admit", "none"): 30, ("defer", "concurrency"): 2},
        {NOISY: (20, 11, 7), LIGHT: (10, 0, 0), "_other": (0, 0, 0)},
    )
    books = gate_tallies(text)
    assert books["reject_reasons"] == {"tenant_share": 7, "ttft": 4}  # rejects only
    assert books["tenants"][NOISY] == {"admitted": 20, "refused": 11, "share_refusals": 7}
    assert books["tenants"][LIGHT] == {"admitted": 10, "refused": 0, "share_refusals": 0}
    assert gate_tallies(metrics_text({("reject", "ttft"): 1}, {}))["tenants"] == {}  # no policy: no tenant series


# --- summary, goals, section -----------------------------------------------------------------------------------------


def tenant_counts(sent: int, within: int, *, late: int = 0, rejected: int = 0, timeout: int = 0) -> dict[str, Any]:
    admitted = within + late + timeout
    assert sent == admitted + rejected
    return {
        "requests": sent, "ok": within + late, "within_slo": within, "rejected": rejected, "refused": 0,
        "timeout": timeout, "error": 0, "admitted": admitted, "goodput_rps": within / 60.0,
        "attainment": within / admitted if admitted else None, "ttft_p50_s": 0.5, "ttft_p99_s": 1.5,
    }  # fmt: skip


def canned_run(
    variant: str, seed: int, tenants: Mapping[str, dict[str, Any]], share: Mapping[str, int] | None
) -> dict[str, Any]:
    total = {k: sum(t[k] for t in tenants.values()) for k in ("requests", "ok", "within_slo", "rejected", "refused",
                                                              "timeout", "error", "admitted")}  # fmt: skip
    total |= {"goodput_rps": total["within_slo"] / 60.0, "attainment": total["within_slo"] / total["admitted"]}
    gate = None
    if share is not None:
        books = {t: {"admitted": c["admitted"], "refused": c["rejected"], "share_refusals": share.get(t, 0)}
                 for t, c in tenants.items()}  # fmt: skip
        gate = {"reject_reasons": {"tenant_share": sum(share.values()), "ttft": 3}, "tenants": books}
    elif variant == WITHOUT:
        gate = {"reject_reasons": {"ttft": 40}, "tenants": {}}
    return {"variant": variant, "seed": seed, "front": "slogate", "tenant_policy": share is not None,
            "duration_s": 60.0, "tenants": {**tenants, TOTAL: total}, "gate": gate}  # fmt: skip


def canned_raw(light_with: Sequence[int] = (12, 11, 12), seeds: Sequence[int] = (1, 2, 3)) -> dict[str, Any]:
    """B sends 12 a seed and gets all 12 within the SLO alone, 2-3 beside A without tenants and
    ``light_with`` with them; A's and the total goodput hold."""
    runs = []
    for i, seed in enumerate(seeds):
        runs.append(canned_run(B_ALONE, seed, {LIGHT: tenant_counts(12, 12)}, {}))
        runs.append(canned_run(WITHOUT, seed, {NOISY: tenant_counts(190, 40, late=10, rejected=140),
                                               LIGHT: tenant_counts(12, 2 + i % 2, late=2, rejected=7 + (1 - i % 2))},
                               None))  # fmt: skip
        b = light_with[i]
        runs.append(canned_run(WITH, seed, {NOISY: tenant_counts(190, 38, late=2, rejected=150),
                                            LIGHT: tenant_counts(12, b, rejected=12 - b)}, {NOISY: 120}))  # fmt: skip
    raw: dict[str, Any] = {
        "environment": {"date": "2026-12-03 23:00 UTC", "cpu": "AMD EPYC, 2 cores"},
        "profile": PROFILE.model_dump(mode="json", by_alias=True), "duration_min": 14.2, "llama_server": "-t 1 -np 4 -c 8192",
        "llama_niceness": 10, "workload": "chat", "slo_s": SLO, "client_timeout_s": 10.0, "capacity_rps": 0.8,
        "concurrency_cap": 4, "loads": {NOISY: 4.0, LIGHT: 0.25}, "rates_rps": {NOISY: 3.2, LIGHT: 0.2},
        "policy": policies()[1].model_dump(mode="json", by_alias=True),
        "tenant_thresholds": {"halfLifeSeconds": 60.0, "outputWeight": 2.1, "outputWeightMeasured": True},
        "duration_s": 60.0, "seeds": list(seeds), "variants": [B_ALONE, WITHOUT, WITH], "runs": runs,
    }  # fmt: skip
    raw["summary"] = summary(raw)
    raw["goals"] = goals(raw)
    return raw


def by_goal(raw: Mapping[str, Any], start: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [g for g in raw["goals"] if g["goal"].startswith(start)]
    assert len(found) == 1
    return found[0]


def test_the_summary_is_the_mean_over_seeds_with_its_interval() -> None:
    raw = canned_raw(light_with=(12, 9, 12))
    light = raw["summary"][WITH][LIGHT]["goodput_rps"]
    assert light["values"] == pytest.approx([12 / 60, 9 / 60, 12 / 60])
    assert light["mean"] == pytest.approx(11 / 60)
    assert light["n"] == 3
    assert light["half_width"] > 0
    assert raw["summary"][B_ALONE][LIGHT]["goodput_rps"]["half_width"] == 0.0  # the same every seed
    assert set(raw["summary"][B_ALONE]) == {LIGHT, TOTAL}
    assert set(raw["summary"][WITH]) == {NOISY, LIGHT, TOTAL}
    one = canned_raw(light_with=(12,), seeds=(1,))
    assert one["summary"][WITH][LIGHT]["goodput_rps"]["half_width"] is None  # one seed: no interval


def test_a_seed_with_nothing_admitted_has_no_attainment() -> None:
    raw = canned_raw()
    raw["runs"][2]["tenants"][LIGHT] = tenant_counts(12, 0, rejected=12)
    attainment = summary(raw)[WITH][LIGHT]["attainment"]
    assert (attainment["n"], attainment["values"]) == (2, [1.0, 1.0])


def test_the_goals_are_met_when_b_keeps_its_service() -> None:
    raw = canned_raw(light_with=(12, 11, 12))
    light = by_goal(raw, "B's goodput with tenants")
    assert light["ratio"] == pytest.approx(35 / 36)
    assert light["verdict"] == "met"
    assert light["per_seed"] == pytest.approx([1.0, 11 / 12, 1.0])
    assert by_goal(raw, "B's SLO attainment")["verdict"] == "met"
    total = by_goal(raw, "total goodput")
    assert total["ratio"] == pytest.approx((38 * 3 + 35) / (40 * 3 + 2 + 3 + 2))
    assert total["verdict"] == "met"
    collapse = by_goal(raw, "B's goodput without tenants")
    assert collapse["ratio"] == pytest.approx(7 / 36)
    assert (collapse["met"], collapse["verdict"]) == (None, "reported")


def test_a_goal_missed_is_reported_as_missed() -> None:
    raw = canned_raw(light_with=(9, 10, 10))
    light = by_goal(raw, "B's goodput with tenants")
    assert light["ratio"] == pytest.approx(29 / 36)
    assert (light["met"], light["verdict"]) == (False, "not met")
    assert by_goal(raw, "B's SLO attainment")["verdict"] == "met"  # every B admitted was on time


def test_a_share_of_nothing_cannot_be_said() -> None:
    raw = canned_raw()
    for run in raw["runs"]:
        if run["variant"] == B_ALONE:
            run["tenants"][LIGHT] = tenant_counts(12, 0, rejected=12)
    raw["summary"] = summary(raw)
    light = goals(raw)[0]
    assert (light["ratio"], light["met"], light["per_seed"]) == (None, None, [None, None, None])


def rendered_tables(lines: Sequence[str]) -> list[list[dict[str, str]]]:
    """The section's markdown tables, as rows of {header: cell}."""
    tables: list[list[dict[str, str]]] = []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("| ") and lines[i + 1].startswith("| ---"):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for body in lines[i + 2 :]:
                if not body.startswith("|"):
                    break
                rows.append(dict(zip(header, [c.strip() for c in body.strip("|").split("|")], strict=True)))
            tables.append(rows)
    return tables


def test_the_section_renders_every_number_from_the_json() -> None:
    raw = canned_raw(light_with=(9, 10, 10))
    lines = tenants_section(raw)
    text = "\n".join(lines)
    assert lines[0] == HEADING
    thresholds = derive_thresholds(policies()[1], PROFILE, derived_at=datetime(2026, 1, 1, tzinfo=UTC))
    (cls,) = thresholds.classes
    for shown in ("2026-12-03 23:00 UTC", PROFILE.id, "3.20 req/s", "output weight 2.10, measured",
                  f"concurrency cap {cls.concurrency_cap};", f"queue budget {cls.token_budget:.0f} prompt tokens"):  # fmt: skip
        assert shown in text
    assert "B had 7 of its 36 requests refused, 0 of them for `tenant_share`; A had 360 refused for it." in text
    assert "B's refusals were all for the server's own predicates" in text  # its goal missed, no share refused
    goals_table, outcomes = rendered_tables(lines)
    verdicts = {row["goal"]: row["met"] for row in goals_table}
    assert list(verdicts.values()) == ["no", "yes", "yes", "(reported)"]
    assert goals_table[0]["per seed"] == "75%, 83%, 83%"
    assert len(outcomes) == table_rows(raw) == 2 + 3 + 3
    for row in outcomes:
        assert sum(int(row[c]) for c in OUTCOME_COLUMNS) == int(row["sent"]), row
    light_with = next(r for r in outcomes if (r["run"], r["tenant"]) == (WITH, LIGHT))
    assert (light_with["sent"], light_with["within SLO"], light_with["rejected"]) == ("36", "29", "7")
    assert light_with["refused for tenant_share"] == "0"
    assert next(r for r in outcomes if (r["run"], r["tenant"]) == (WITH, NOISY))["refused for tenant_share"] == "360"
    assert next(r for r in outcomes if (r["run"], r["tenant"]) == (WITHOUT, LIGHT))["refused for tenant_share"] == "-"
    assert "`tenant_share` 360" in text  # the reject decisions by reason
    assert f"](bench/{PLOT})" in text


def test_the_reading_explains_only_a_miss_without_share_refusals() -> None:
    met = "\n".join(tenants_section(canned_raw(light_with=(12, 11, 12))))
    assert "B had 1 of its 36 requests refused, 0 of them" in met
    assert "server's own predicates" not in met  # the goal was met: nothing to explain
    shared = canned_raw(light_with=(9, 10, 10))
    for run in shared["runs"]:
        if run["variant"] == WITH:
            run["gate"]["tenants"][LIGHT]["share_refusals"] = 1
    assert "server's own predicates" not in "\n".join(tenants_section(shared))


def test_a_run_that_does_not_add_up_is_refused() -> None:
    raw = canned_raw()
    raw["runs"][1]["tenants"][LIGHT]["requests"] += 1
    with pytest.raises(ValueError, match="!= 13 sent"):
        tenants_section(raw)


def test_the_figure_is_drawn(tmp_path: Path) -> None:
    tenants_plot(canned_raw(), tmp_path / PLOT)
    assert (tmp_path / PLOT).read_bytes().startswith(b"\x89PNG")


def test_the_benchmark_report_has_the_section_only_with_its_json(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    assert tenants_sections(bench) == []
    raw = canned_raw()
    (bench / "tenants.json").write_text(json.dumps(raw))
    assert tenants_sections(bench) == tenants_section(copy.deepcopy(raw))
    # The whole report, from the published suite's results with this JSON beside them.
    published = json.loads((REPO / "docs" / "bench" / "results.json").read_text())
    profile = CalibrationProfile.model_validate_json((REPO / "docs" / "bench" / "profile.json").read_text())
    policy = Policy.model_validate({"slo": {"ttftSeconds": published["slo_s"]}, "deferral": {"maxWaitSeconds": 0.5}})
    thresholds = derive_thresholds(policy, profile, derived_at=datetime(2026, 1, 1, tzinfo=UTC))
    write_report(published, profile, thresholds, tmp_path / "benchmarks.md", bench)
    report = (tmp_path / "benchmarks.md").read_text()
    assert report[report.index(HEADING) :] == "\n".join(tenants_section(raw))  # the last section, whole


def test_the_simulated_subsection_follows_the_measured_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``make bench-tenants-sim``'s JSON is handed to its own renderer; alone, it gets the heading."""
    seen: list[dict[str, Any]] = []

    def simulated(raw: dict[str, Any]) -> list[str]:
        seen.append(raw)
        return ["### Simulated", ""]

    monkeypatch.setattr(report_sections, "tenant_simulation_section", simulated)
    (tmp_path / "tenants-simulated.json").write_text(json.dumps({"seeds": [1, 2]}))
    assert tenants_sections(tmp_path) == [HEADING, "", "### Simulated", ""]
    raw = canned_raw()
    (tmp_path / "tenants.json").write_text(json.dumps(raw))
    assert tenants_sections(tmp_path) == [*tenants_section(raw), "### Simulated", ""]
    assert seen == [{"seeds": [1, 2]}] * 2
