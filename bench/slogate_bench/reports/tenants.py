"""The noisy neighbour's numbers (``noisy_neighbour``): means over seeds, the issue's goals, the
"Tenants" section of docs/benchmarks.md and docs/bench/tenants.png.

``summary`` and ``goals`` are computed once, when the bench writes tenants.json, and stored in
it; the section and the figure read them (and the runs) from the JSON alone, so
`python -m slogate_bench.reports.benchmarks` re-renders a run without measuring again.

The goals (issue 17.4), on the means over seeds: with tenants, B's goodput and B's SLO
attainment are each at least 90% of B alone's; the total goodput with tenants is at least 95%
of the same traffic's without; and B's goodput without tenants as a share of B alone's (the
collapse) is reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_bench.reports.intervals import mean_interval
from slogate_bench.results import OUTCOME_COLUMNS, outcome_counts

NOISY, LIGHT, TOTAL = "A", "B", "total"
"""The noisy tenant, the light one, and the key of a run's tally over every tenant."""
B_ALONE, WITHOUT, WITH, DIRECT_NAME = "B alone", "A+B without tenants", "A+B with tenants", "A+B direct"
"""The runs' names (``noisy_neighbour.VARIANTS``)."""
LIGHT_KEEPS = 0.90
"""With tenants, B keeps at least this share of its goodput and SLO attainment alone."""
TOTAL_KEEPS = 0.95
"""With tenants, the total goodput is at least this share of the total without."""
MEASURES = ("goodput_rps", "attainment")
PLOT = "tenants.png"
HEADING = "## Tenants: the noisy neighbour (issue 17.4)"
A_COLOR, TOTAL_COLOR = "#ff7f0e", "#7f7f7f"
COLORS = {B_ALONE: "#2ca02c", WITHOUT: "#d62728", WITH: "#1f77b4", DIRECT_NAME: "#7f7f7f"}

Raw = Mapping[str, Any]


def _runs(raw: Raw, variant: str) -> list[Mapping[str, Any]]:
    return [r for r in raw["runs"] if r["variant"] == variant]


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean of the per-seed ``values`` and the half-width of its 95% interval (None: one value
    only, or none), with the values themselves."""
    if not values:
        return {"mean": None, "half_width": None, "n": 0, "values": []}
    interval = mean_interval(values)
    half = None if math.isnan(interval.half_width) else interval.half_width
    return {"mean": interval.mean, "half_width": half, "n": interval.n, "values": list(values)}


def summary(raw: Raw) -> dict[str, dict[str, dict[str, Any]]]:
    """Per variant, per tenant (and ``total``), each measure's ``spread`` over the seeds. A seed
    whose tenant had nothing admitted has no attainment and is left out of its mean."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for variant in raw["variants"]:
        runs = _runs(raw, variant)
        tenants = list(dict.fromkeys(t for r in runs for t in r["tenants"]))
        out[variant] = {
            tenant: {
                measure: spread([v for r in runs if (v := r["tenants"][tenant][measure]) is not None])
                for measure in MEASURES
            }
            for tenant in tenants
        }
    return out


def _mean(summed: Mapping[str, Any], variant: str, tenant: str, measure: str) -> float | None:
    value: float | None = summed.get(variant, {}).get(tenant, {}).get(measure, {}).get("mean")
    return value


def _paired(raw: Raw, new: str, old: str, tenant: str, measure: str) -> list[float | None]:
    """Per seed run in both variants: ``new``'s value over ``old``'s (None where it cannot be said)."""
    olds = {r["seed"]: r["tenants"][tenant][measure] for r in _runs(raw, old)}
    ratios: list[float | None] = []
    for run in _runs(raw, new):
        value, base = run["tenants"][tenant][measure], olds.get(run["seed"])
        ratios.append(value / base if value is not None and base else None)
    return ratios


def goal(
    raw: Raw,
    summed: Mapping[str, Any],
    name: str,
    *,
    new: str,
    old: str,
    tenant: str,
    measure: str,
    at_least: float | None,
) -> dict[str, Any]:
    """``new``'s mean of ``measure`` for ``tenant`` as a share of ``old``'s, against ``at_least``
    (None: reported, no goal); ``met`` None where the share cannot be said."""
    value, base = _mean(summed, new, tenant, measure), _mean(summed, old, tenant, measure)
    ratio = value / base if value is not None and base else None
    met = None if at_least is None or ratio is None else ratio >= at_least
    unit = "/s" if measure == "goodput_rps" else ""
    shown = "-" if value is None else f"{value:.3f}{unit}" if unit else f"{value:.1%}"
    shown_base = "-" if base is None else f"{base:.3f}{unit}" if unit else f"{base:.1%}"
    return {
        "goal": name,
        "tenant": tenant,
        "measure": measure,
        "variant": new,
        "baseline": old,
        "value": value,
        "baseline_value": base,
        "ratio": ratio,
        "at_least": at_least,
        "per_seed": _paired(raw, new, old, tenant, measure),
        "met": met,
        "verdict": "reported" if at_least is None else "met" if met else "not met",
        "measured": f"{shown} against {shown_base} = " + ("-" if ratio is None else f"{ratio:.0%}"),
    }


def goals(raw: Raw) -> list[dict[str, Any]]:
    """The issue's goals, on the means over seeds (each with its per-seed ratios)."""
    summed = raw.get("summary") or summary(raw)
    keeps = f"≥ {LIGHT_KEEPS:.0%} of B alone"
    return [
        goal(raw, summed, f"B's goodput with tenants {keeps}", new=WITH, old=B_ALONE, tenant=LIGHT,
             measure="goodput_rps", at_least=LIGHT_KEEPS),
        goal(raw, summed, f"B's SLO attainment with tenants {keeps}", new=WITH, old=B_ALONE, tenant=LIGHT,
             measure="attainment", at_least=LIGHT_KEEPS),
        goal(raw, summed, f"total goodput with tenants ≥ {TOTAL_KEEPS:.0%} of A+B without tenants", new=WITH,
             old=WITHOUT, tenant=TOTAL, measure="goodput_rps", at_least=TOTAL_KEEPS),
        goal(raw, summed, "B's goodput without tenants, as a share of B alone (the collapse)", new=WITHOUT,
             old=B_ALONE, tenant=LIGHT, measure="goodput_rps", at_least=None),
    ]  # fmt: skip


def _fmt_spread(cell: Mapping[str, Any] | None, *, percent: bool = False) -> str:
    if not cell or cell.get("mean") is None:
        return "-"
    mean, half = cell["mean"], cell.get("half_width")
    if percent:
        return f"{mean:.1%}" + ("" if half is None else f" ± {half:.1%}")
    return f"{mean:.3f}" + ("" if half is None else f" ± {half:.3f}") + "/s"


def summed_counts(runs: Sequence[Mapping[str, Any]], tenant: str) -> tuple[int, list[int]]:
    """A tenant's requests sent and their outcome counts, summed over ``runs`` (each checked to add up)."""
    per_run = [outcome_counts(r["tenants"][tenant]) for r in runs]
    return sum(r["tenants"][tenant]["requests"] for r in runs), [sum(c) for c in zip(*per_run, strict=True)]


def share_refusals(runs: Sequence[Mapping[str, Any]], tenant: str) -> str:
    """Refusals naming ``tenant_share``, as the sidecar counted them, summed over ``runs`` ("-": the
    sidecar kept no tenant books, no policy being in force)."""
    books = [((r.get("gate") or {}).get("tenants") or {}) for r in runs]
    if not any(books):
        return "-"
    if tenant == TOTAL:
        return str(sum(c["share_refusals"] for b in books for c in b.values()))
    return str(sum(b.get(tenant, {}).get("share_refusals", 0) for b in books))


def outcomes_table(raw: Raw) -> list[str]:
    """Per run and tenant: every request sent, by fate (summed over seeds), goodput and attainment."""
    header = ("run", "tenant", "sent", *OUTCOME_COLUMNS, "goodput", "SLO attainment of admitted",
              "refused for tenant_share")  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for variant in raw["variants"]:
        runs = _runs(raw, variant)
        for tenant, measures in raw["summary"][variant].items():
            sent, counts = summed_counts(runs, tenant)
            cells = [variant, tenant, sent, *counts, _fmt_spread(measures["goodput_rps"]),
                     _fmt_spread(measures["attainment"], percent=True), share_refusals(runs, tenant)]  # fmt: skip
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def table_rows(raw: Raw) -> int:
    """Rows of ``outcomes_table`` (each adds up to its `sent`)."""
    return sum(len(tenants) for tenants in raw["summary"].values())


def goals_table(raw: Raw) -> list[str]:
    lines = ["| goal | measured (means over seeds) | per seed | met |", "| --- | --- | --- | --- |"]
    for g in raw["goals"]:
        seeds = ", ".join("-" if r is None else f"{r:.0%}" for r in g["per_seed"]) or "-"
        verdict = {"met": "yes", "not met": "no"}.get(g["verdict"], "(reported)")
        lines.append(f"| {g['goal']} | {g['measured']} | {seeds} | {verdict} |")
    return lines


def reasons_lines(raw: Raw) -> list[str]:
    """The sidecar's reject decisions by failed predicate, per run kind, summed over seeds."""
    lines = []
    for variant in raw["variants"]:
        totals: dict[str, int] = {}
        for run in _runs(raw, variant):
            for reason, n in ((run.get("gate") or {}).get("reject_reasons") or {}).items():
                totals[reason] = totals.get(reason, 0) + n
        if totals:
            lines.append(f"- **{variant}**: " + ", ".join(f"`{k}` {v}" for k, v in sorted(totals.items())))
    return lines


def derived(raw: Raw) -> Thresholds:
    """What the gate enforced, derived again from the JSON's profile and policy (deterministic:
    only ``derivedAt`` differs, and no number here reads it)."""
    profile = CalibrationProfile.model_validate(raw["profile"])
    return derive_thresholds(Policy.model_validate(raw["policy"]), profile, derived_at=datetime(2026, 1, 1, tzinfo=UTC))


def gate_line(raw: Raw, thresholds: Thresholds) -> str:
    """The class's derived limits, in words."""
    (cls,) = thresholds.classes
    wait = thresholds.max_wait_seconds
    cap_on_wait = "" if wait is None else f", at most maxWaitSeconds {wait:g} s"
    return (
        f"The class's derived limits: concurrency cap {cls.concurrency_cap}; a request that finds the slots taken "
        f"waits when the slot it would get is expected within its {raw['slo_s']:g} s SLO less its own prefill"
        f"{cap_on_wait}, else it is refused at once; queue budget {cls.token_budget:.0f} prompt tokens."
    )


def reading_lines(raw: Raw, thresholds: Thresholds) -> list[str]:
    """What the runs with tenants say of B's refusals, from the counts alone."""
    runs = _runs(raw, WITH)
    if not runs:
        return []
    sent, counts = summed_counts(runs, LIGHT)
    refused = counts[OUTCOME_COLUMNS.index("rejected")] + counts[OUTCOME_COLUMNS.index("refused")]
    light_share, noisy_share = share_refusals(runs, LIGHT), share_refusals(runs, NOISY)
    lines = [
        f"**Reading.** With tenants, B had {refused} of its {sent} requests refused, {light_share} of them for "
        f"`tenant_share`; A had {noisy_share} refused for it."
    ]
    light_goal = next((g for g in raw["goals"] if g["variant"] == WITH and g["tenant"] == LIGHT), None)
    if light_share == "0" and refused and light_goal is not None and light_goal["met"] is False:
        (cls,) = thresholds.classes
        lines.append(
            "B's refusals were all for the server's own predicates (the sidecar counts reasons per decision, "
            "not per tenant: above). The share rule bounds a tenant's part of the class's queued prompt "
            "tokens, not its streams; here a stream holds its slot for the whole decode. A B arrival "
            f"that finds the {cls.concurrency_cap} slots taken (by A, which sends "
            f"{raw['rates_rps'][NOISY] / raw['rates_rps'][LIGHT]:.0f} times as many requests) leaves the deferral "
            "queue before A's waiters, but may wait only when the slot it would get is expected within its SLO "
            "less its own prefill; else it is refused at once, within its share or not."
        )
    return [*lines, ""]


def tenants_section(raw: Raw) -> list[str]:
    """The section "Tenants: the noisy neighbour (issue 17.4)", every number from tenants.json."""
    env, profile, tenants = raw["environment"], raw["profile"], raw.get("tenant_thresholds") or {}
    rates, loads = raw["rates_rps"], raw["loads"]
    deferral = (raw["policy"].get("deferral") or {}).get("maxWaitSeconds")
    seeds = raw["seeds"]
    thresholds = derived(raw)
    lines = [
        HEADING,
        "",
        f"`make bench-tenants` ({env['date']}, {env['cpu']}, calibration {profile['id']},",
        f"{raw['duration_min']:g} min). One llama-server with one thread",
        f"({raw['llama_server']}; at nice {raw['llama_niceness']}), the `{raw['workload']}` mix in one class, "
        f"TTFT SLO {raw['slo_s']:g} s"
        + (f" (deferral.maxWaitSeconds {deferral:g} s)" if deferral is not None else "")
        + f", clients patient for {raw['client_timeout_s']:g} s;",
        f"μ = {raw['capacity_rps']:.2f} req/s at the concurrency cap ({raw['concurrency_cap']}). Tenant A offers "
        f"{loads[NOISY]:g}x μ ({rates[NOISY]:.2f} req/s),",
        f"tenant B {loads[LIGHT]:g}x μ ({rates[LIGHT]:.2f} req/s), each its own Poisson arrivals named by "
        "`X-Slogate-Tenant`.",
        "A tenant's arrivals depend on the seed and its name only, so B is sent the very same requests",
        "in every run of a seed. Each run starts a fresh llama-server and a fresh sidecar: **B alone**",
        "(the tenant policy in force; a tenant alone in its class is not limited), **A+B without tenants**",
        "(`spec.tenants` unset: one stream of requests), **A+B with tenants** (`spec.tenants: {}`: equal",
        f"weights, half-life {tenants.get('halfLifeSeconds', 0):g} s, output weight "
        f"{tenants.get('outputWeight', 0):.2f}, {'measured' if tenants.get('outputWeightMeasured') else 'set'})"
        + (", and **A+B direct** (llama-server alone)" if DIRECT_NAME in raw["variants"] else "")
        + f". {len(seeds)} seeds ({', '.join(map(str, seeds))}) of "
        f"{raw['duration_s']:g} s of",
        "arrivals; each value is the mean over the seeds ± the half-width of its 95% interval.",
        "*Admitted*: not answered 429 or 400; *SLO attainment*: the share of the admitted whose first",
        "token came within the SLO (a client that gave up counts as a miss); *refused for tenant_share*:",
        "the sidecar's own count (`slogate_tenant_share_refusals_total`).",
        gate_line(raw, thresholds),
        "",
        *goals_table(raw),
        "",
        "Sent and outcomes summed over the seeds:",
        "",
        *outcomes_table(raw),
        "",
    ]
    reasons = reasons_lines(raw)
    if reasons:
        lines += ["The sidecar's reject decisions by failed predicate, summed over the seeds (a decision that",
                  "fails two counts under both):", "", *reasons, ""]  # fmt: skip
    return [
        *lines,
        *reading_lines(raw, thresholds),
        f"![the noisy neighbour: B's goodput and SLO attainment, A's and the total goodput](bench/{PLOT})",
        "",
    ]


def _bars(
    ax: Any, raw: Raw, tenant: str, measure: str, *, offset: float = 0.0, width: float = 0.6, color: str | None = None
) -> None:
    """One bar per run kind (coloured by kind unless ``color``): the mean over seeds, its 95%
    interval, and each seed as a dot."""
    for i, variant in enumerate(raw["variants"]):
        cell = raw["summary"][variant].get(tenant, {}).get(measure)
        if not cell or cell["mean"] is None:
            continue
        shade = color or COLORS.get(variant, "#1f77b4")
        ax.bar(i + offset, cell["mean"], width, yerr=cell["half_width"] or 0.0, color=shade, alpha=0.85, capsize=3)
        ax.scatter([i + offset] * len(cell["values"]), cell["values"], color="black", s=8, zorder=3)


def tenants_plot(raw: Raw, path: Path) -> None:
    """B's goodput and SLO attainment in each run, then A's and the total goodput: bars are means
    over the seeds with their 95% intervals, dots the seeds."""
    names = raw["variants"]
    fig, (good, attain, others) = plt.subplots(1, 3, figsize=(14, 4.4))
    # B's panels are coloured by run kind; the third by tenant.
    _bars(good, raw, LIGHT, "goodput_rps")
    good.set_title("B's goodput (first token within SLO)")
    good.set_ylabel("req/s")
    _bars(attain, raw, LIGHT, "attainment")
    attain.set_title("B's SLO attainment of admitted")
    attain.set_ylim(0, 1.05)
    _bars(others, raw, NOISY, "goodput_rps", offset=-0.2, width=0.4, color=A_COLOR)
    _bars(others, raw, TOTAL, "goodput_rps", offset=0.2, width=0.4, color=TOTAL_COLOR)
    others.set_title("A's and the total goodput")
    others.set_ylabel("req/s")
    others.legend(handles=[Patch(color=A_COLOR, label="A"), Patch(color=TOTAL_COLOR, label="total (A + B)")])
    for ax in (good, attain, others):
        ax.set_xticks(
            range(len(names)), [n.replace(" without", "\nwithout").replace(" with ", "\nwith ") for n in names]
        )
    fig.suptitle(
        f"Noisy neighbour: A at {raw['loads'][NOISY]:g}x μ, B at {raw['loads'][LIGHT]:g}x μ, "
        f"TTFT SLO {raw['slo_s']:g} s ({len(raw['seeds'])} seeds)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
