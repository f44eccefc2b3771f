"""The benchmark report's sections from the side benchmarks: the SLO promise, deferral, tenants.

Each renders a results file its own command writes (``promise``: make bench-promise;
``deferral``: make bench-deferral; ``tenants``: make bench-tenants and make bench-tenants-sim)
into docs/benchmarks.md, every request accounted for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slogate_bench.reports.tenant_simulation import tenant_simulation_section
from slogate_bench.reports.tenants import HEADING as TENANTS_HEADING
from slogate_bench.reports.tenants import tenants_section
from slogate_bench.results import OUTCOME_COLUMNS, outcome_counts


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def promise_section(raw: dict[str, Any]) -> list[str]:
    """The "SLO promise" section: admitted requests within the SLO, run by run, per workload."""
    env = raw["environment"]
    q = raw["quantile"]
    lines = [
        "## The SLO promise on two workloads (issue 14.1)",
        "",
        f"`make bench-promise` ({env['date']}, {env['cpu']}, calibration {raw['profile']}): `slogate demo`'s",
        f"overload, {raw['load']:g}x μ for {raw['seconds']:g} s through the sidecar with the demo's policy (TTFT SLO",
        f"{raw['slo_s']:g} s at the default quantile {q:g}), on five arrival schedules; then the same on `long_tail`,",
        "a heavier workload no constant was tuned on. Each run starts a fresh gate on an idle server:",
        "the margin is learned within the run. *Admitted* counts requests the gate let through whose",
        "first token came; the margin is the gate's at the end of the run.",
        "",
        "| workload | schedule | sent | "
        + " | ".join(OUTCOME_COLUMNS)
        + " | admitted within SLO | margin at the end |",
        "|" + " --- |" * (5 + len(OUTCOME_COLUMNS)),
    ]
    totals: dict[str, list[int]] = {}
    for r in raw["runs"]:
        margins = ((r.get("ttft_error") or {}).get("margins") or {}).values()
        margin = ", ".join(f"{m['value']:.2f} ({m['samples']} judged)" for m in margins) or "prior"
        cells = [r["workload"], r["seed"], r["requests"], *outcome_counts(r),
                 f"{r['admitted_within_slo']}/{r['admitted']}", margin]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        total = totals.setdefault(r["workload"], [0, 0])
        total[0] += r["admitted_within_slo"]
        total[1] += r["admitted"]
    lines.append("")
    for name, (within, admitted) in totals.items():
        share = within / admitted if admitted else 0.0
        verdict = "met" if share >= q else "not met"
        lines.append(
            f"- **{name}**: {within} of {admitted} admitted within the SLO = {share:.1%} (goal ≥ {q:.0%}: {verdict})"
        )
    lines += ["", "![predicted against actual TTFT](bench/predicted-vs-actual.png)", ""]
    return lines


def deferral_section(raw: dict[str, Any]) -> list[str]:
    """The "Deferral" section of docs/benchmarks.md, every request accounted for."""
    env = raw["environment"]
    lines = [
        "## Deferral: what waiting for a slot buys (issue 12.7)",
        "",
        f"`make bench-deferral` ({env['date']}, {env['cpu']}, calibration {raw['profile']}): the chat mix",
        f"at 1x and 2x μ, one class with a {raw['slo_s']:g} s TTFT SLO, {raw['seconds']:g} s of arrivals, clients",
        f"patient for {raw['client_timeout_s']:g} s; each pair sends the same arrivals to a fresh llama-server.",
        "The two fronts differ only in `deferral.maxWaitSeconds`:",
        "",
    ]
    for name, d in raw["derived"].items():
        wait = d["max_wait_s"]
        rule = (
            "a request that finds the slots busy is refused at once"
            if wait == 0
            else "a request that finds the slots busy waits when the slot it would get is expected within its "
            "SLO less its own prefill" + ("" if wait is None else f", at most {wait:g} s")
        )
        lines.append(
            f"- **{name}** (`maxWaitSeconds` {'unset' if wait is None else f'{wait:g}'}): cap {d['concurrency_cap']}; {rule}"
        )
    header = (
        "variant",
        "load",
        "sent",
        *OUTCOME_COLUMNS,
        "goodput",
        "p50 / p99 TTFT",
        "deferred: admitted / timed out / left",
    )
    lines += ["", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in raw["runs"]:
        ended = r["deferrals"]
        cells = [
            r["variant"], f"{r['load']:g}x", r["requests"], *outcome_counts(r), f"{r['goodput_rps']:.2f}/s",
            f"{_fmt(r['ttft_p50_s'], ' s')} / {_fmt(r['ttft_p99_s'], ' s')}",
            f"{ended.get('admitted', 0)} / {ended.get('timed_out', 0)} / {ended.get('cancelled', 0)}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append("")
    return lines


TENANTS_MEASURED, TENANTS_SIMULATED = "tenants.json", "tenants-simulated.json"
"""The tenants' results files, beside the suite's (``noisy_neighbour``, ``tenant_simulation``)."""


def tenants_sections(bench_dir: Path) -> list[str]:
    """The "Tenants" section: the noisy neighbour measured (``tenants.json``), then the simulated
    subsection (``tenants-simulated.json``); nothing of a file that is absent."""
    measured, simulated = bench_dir / TENANTS_MEASURED, bench_dir / TENANTS_SIMULATED
    lines = tenants_section(json.loads(measured.read_text())) if measured.exists() else []
    if simulated.exists():
        lines = lines or [TENANTS_HEADING, ""]
        lines += tenant_simulation_section(json.loads(simulated.read_text()))
    return lines
