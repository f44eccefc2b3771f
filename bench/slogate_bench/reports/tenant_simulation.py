"""The simulated tenants' part of docs/benchmarks.md, from docs/bench/tenants-simulated.json
(``tenant_simulation``): ``tenant_simulation_section`` (its lines, for ``report``) and the
figure docs/bench/tenants-simulated.png. Every number comes from the JSON; nothing is run.
``python -m slogate_bench.reports.tenant_simulation`` redraws the figure.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RAW = Path("docs/bench/tenants-simulated.json")
FIGURE = Path("docs/bench/tenants-simulated.png")
FIGURE_LINK = "bench/tenants-simulated.png"
"""The figure, as docs/benchmarks.md links it."""
GOALS = {"b_goodput": 0.9, "b_attainment": 0.9, "total_goodput": 0.95, "collapse": 0.5}
"""Issue 17's bars, the simulator's version: with the policy B keeps at least 90% of its goodput
and of its SLO attainment alone, and the pod 95% of its goodput without tenants; without the
policy B "collapses": below half its goodput alone."""
COLORS = {"without": "#d62728", "with": "#2ca02c"}
Row = Mapping[str, Any]


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.fmean(values), min(values), max(values)


def _fmt(values: Sequence[float | None], form: str = "{:.3f}") -> str:
    """Mean (least–most) over the seeds; one seed: the value; none: a dash."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    mean, low, high = _spread(present)
    if len(present) == 1 or low == high:
        return form.format(mean)
    return f"{form.format(mean)} ({form.format(low)}–{form.format(high)})"


def _pct(values: Sequence[float | None]) -> str:
    return _fmt([None if v is None else 100 * v for v in values], "{:.1f}%")


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _by_seed(runs: Sequence[Row], variant: str) -> dict[int, Row]:
    return {r["seed"]: r for r in runs if r["variant"] == variant}


def noisy_numbers(noisy: Row) -> dict[str, dict[str, list[float | None]]]:
    """Per variant (``alone``, ``without``, ``with``, the bound arms), per measure, one value per seed; B's
    goodput and attainment also as a ratio to B alone on the same seed (the same B arrivals)."""
    duration = noisy["duration_s"]
    alone = _by_seed(noisy["runs"], "alone")
    without = _by_seed(noisy["runs"], "without")
    out: dict[str, dict[str, list[float | None]]] = {}
    for variant in dict.fromkeys(r["variant"] for r in noisy["runs"]):
        cells: dict[str, list[float | None]] = {}
        for seed, run in sorted(_by_seed(noisy["runs"], variant).items()):
            b, b_alone = run["tenants"]["B"], alone[seed]["tenants"]["B"]
            a = run["tenants"].get("A")
            attainment = _ratio(b["completed_within_slo"], b["admitted"])
            attainment_alone = _ratio(b_alone["completed_within_slo"], b_alone["admitted"])
            values = {
                "b_offered_rps": b["offered"] / duration,
                "b_goodput_rps": b["completed_within_slo"] / duration,
                "b_goodput_vs_alone": _ratio(b["completed_within_slo"], b_alone["completed_within_slo"]),
                "b_attainment": attainment,
                "b_attainment_vs_alone": None
                if attainment is None or not attainment_alone
                else attainment / attainment_alone,
                "b_share_rejected": b["share_rejected"],
                "a_goodput_rps": a["completed_within_slo"] / duration if a else None,
                "total_goodput_rps": run["goodput_rps"],
                "total_vs_without": _ratio(run["goodput_rps"], without[seed]["goodput_rps"]),
            }
            for key, value in values.items():
                cells.setdefault(key, []).append(value)
        out[variant] = cells
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else "met" if ok else "not met"


def _at_least(value: float | None, bar: float) -> bool | None:
    return None if value is None else value >= bar


def noisy_lines(raw: Row) -> list[str]:
    """The noisy neighbour's table, its goals and why B was refused."""
    noisy = raw["noisy"]
    numbers = noisy_numbers(noisy)
    rates = noisy["rates_x_mu"]
    lines = [
        f"**The noisy neighbour's twin.** Tenant A at {rates['A']:g}x μ and B at {rates['B']:g}x μ, one class "
        "(the bounds: B's class above A's, the policy's `classes` with `reservedSlots`), "
        f"{noisy['duration_s']:g} s of arrivals per run; B is sent the same requests in each row of a seed.",
        "",
        "| run | B sent | B goodput | B goodput ÷ alone | B within SLO of admitted | B refused for its share "
        "| A goodput | total goodput | total ÷ without |",
        "|" + " --- |" * 9,
    ]
    labels = {"alone": "B alone", "without": "A + B, no tenant policy", "with": "A + B, `spec.tenants`",
              **BOUND_LABELS}  # fmt: skip
    for variant, label in labels.items():
        if variant not in numbers:
            continue
        n = numbers[variant]
        cells = [
            label,
            f"{_fmt(n['b_offered_rps'])}/s",
            f"{_fmt(n['b_goodput_rps'])}/s",
            _pct(n["b_goodput_vs_alone"]),
            _pct(n["b_attainment"]),
            _fmt(n["b_share_rejected"], "{:.1f}"),
            "-" if variant == "alone" else f"{_fmt(n['a_goodput_rps'])}/s",
            f"{_fmt(n['total_goodput_rps'])}/s",
            "-" if variant == "alone" else _pct(n["total_vs_without"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    with_, without = numbers["with"], numbers["without"]
    b_goodput, b_attainment = _mean(with_["b_goodput_vs_alone"]), _mean(with_["b_attainment_vs_alone"])
    total, collapse = _mean(with_["total_vs_without"]), _mean(without["b_goodput_vs_alone"])
    lines += [
        "",
        f"- B's goodput with the policy, of B alone: {_pct([b_goodput])} (goal ≥ {GOALS['b_goodput']:.0%}: "
        f"{_verdict(_at_least(b_goodput, GOALS['b_goodput']))})",
        f"- B's SLO attainment of admitted with the policy, of B alone: {_pct([b_attainment])} "
        f"(goal ≥ {GOALS['b_attainment']:.0%}: {_verdict(_at_least(b_attainment, GOALS['b_attainment']))})",
        f"- total goodput with the policy, of without: {_pct([total])} (goal ≥ {GOALS['total_goodput']:.0%}: "
        f"{_verdict(_at_least(total, GOALS['total_goodput']))})",
        f"- without the policy B keeps {_pct([collapse])} of its goodput alone (it collapses below "
        f"{GOALS['collapse']:.0%}: {'yes' if collapse is not None and collapse < GOALS['collapse'] else 'no'})",
        *_reason_lines(noisy),
        *_bound_lines(numbers),
        "",
    ]
    return lines


BOUND_LABELS = {
    "b_first": "A + B, B's class first (no slot kept)",
    "b_kept_1": "A + B, B's class first, 1 slot kept for it",
    "b_kept_2": "A + B, B's class first, 2 slots kept for it",
}
"""The bound arms (``tenant_simulation.KEPT_FOR_B``): B in a class above A's, with 0, 1 or 2 of
the cap's slots that only B's class may use (``reservedSlots``)."""


def _bound_lines(numbers: Mapping[str, Mapping[str, list[float | None]]]) -> list[str]:
    """What B gets when the gate favours it outright, and what that costs the pod."""
    arms = [v for v in BOUND_LABELS if v in numbers]
    if not arms:
        return []
    said = "; ".join(
        f"{BOUND_LABELS[v].removeprefix('A + B, ')}: B {_pct([_mean(numbers[v]['b_goodput_vs_alone'])])} of alone, "
        f"total {_pct([_mean(numbers[v]['total_vs_without'])])} of without"
        for v in arms
    )
    both = [
        v
        for v in ("with", *arms)
        if _at_least(_mean(numbers[v]["b_goodput_vs_alone"]), GOALS["b_goodput"])
        and _at_least(_mean(numbers[v]["total_vs_without"]), GOALS["total_goodput"])
    ]
    verdict = (
        f"Meeting both goals: {', '.join(BOUND_LABELS.get(v, v) for v in both)}."
        if both
        else "No run met both goals: going first among the waiters keeps every slot busy but cannot give B a slot "
        "before one of A's streams ends, and A's flood holds them all; B's share rises only with slots kept idle "
        "for it, and the pod's total falls with each."
    )
    return [f"- The bounds, B favoured outright ({said}). {verdict}"]


def _reason_lines(noisy: Row) -> list[str]:
    """B's refusals by reason, summed over the seeds, per run with A beside it."""
    lines = []
    for variant in ("without", "with"):
        reasons: dict[str, int] = {}
        refused = 0
        for run in noisy["runs"]:
            if run["variant"] == variant:
                b = run["tenants"]["B"]
                refused += b["rejected"]
                for reason, count in b.get("rejected_by_reason", {}).items():
                    reasons[reason] = reasons.get(reason, 0) + count
        listed = ", ".join(f"`{r}` {c}" for r, c in sorted(reasons.items(), key=lambda rc: -rc[1])) or "none"
        lines.append(f"- B's {refused} refusals {variant} the policy, by reason (one may give several): {listed}")
    return lines


def zipf_lines(raw: Row) -> list[str]:
    """The Zipf table: totals and fairness per load and gate."""
    zipf = raw["zipf"]
    satisfied = zipf["satisfied_at"]
    lines = [
        f"**{zipf['tenants']} tenants, Zipf({zipf['exponent']:g}) demand** (tenant k sends in proportion to "
        f"1/k^{zipf['exponent']:g}), {zipf['duration_s']:g} s of arrivals per run. A tenant's fair share is its "
        "max-min share of the goodput the run achieved (water-filling, equal weights): its demand if below the "
        "water level, else the level. *Light* tenants demand less than the level.",
        "",
        f"| load | gate | goodput | ÷ without | tenants ≥ {satisfied:.0%} of fair share | Jain's index "
        "(goodput ÷ fair share) | light tenants' goodput ÷ demand | refused | refused for a share |",
        "|" + " --- |" * 9,
    ]
    for load in zipf["loads"]:
        runs = [r for r in zipf["runs"] if r["load"] == load]
        without = _by_seed(runs, "without")
        for variant in ("without", "with"):
            mine = sorted(_by_seed(runs, variant).items())
            fair = [r["fairness"] for _, r in mine]
            lines.append(
                f"| {load:g}x | {variant} | {_fmt([r['goodput_rps'] for _, r in mine])}/s "
                f"| {_pct([_ratio(r['goodput_rps'], without[s]['goodput_rps']) for s, r in mine])} "
                f"| {_pct([f['satisfied_share'] for f in fair])} | {_fmt([f['jain'] for f in fair])} "
                f"| {_pct([f['light_goodput_ratio'] for f in fair])} "
                f"| {_pct([_ratio(r['rejected'], r['offered']) for _, r in mine])} "
                f"| {_pct([_ratio(r['share_rejected'], r['offered']) for _, r in mine])} |"
            )
    return [*lines, ""]


def tenant_simulation_section(raw: dict[str, Any]) -> list[str]:
    """The "Simulated" subsection of docs/benchmarks.md's tenants section, from the JSON alone."""
    env, policy = raw["environment"], raw["tenant_policy"]
    seeds = raw["seeds"]
    return [
        "### Simulated: the noisy neighbour's twin and 100 Zipf tenants",
        "",
        f"`make bench-tenants-sim` ({env['date']}, {env['cpu']}; {raw['wall_s']:.0f} s): the simulator with the "
        f"first pod `make bench-fleet` measured ({raw['measured_started_at']}), one pod, the `{raw['workload']}` "
        f"mix, TTFT SLO {raw['slo_s']:g} s, μ = {raw['mu_rps']:.3f} req/s, concurrency cap {raw['concurrency_cap']}, "
        f"clients patient for {raw['client_timeout_s']:g} s. The gate is the core's "
        "GateMachine with the pod's policy as it is (*without*) and with `spec.tenants` at its defaults (*with*: "
        f"half-life {policy['halfLifeSeconds']:g} s, maxTracked {policy['maxTracked']}, output weight "
        f"{policy['outputWeight']:.2f}{' measured' if policy['outputWeightMeasured'] else ''}). Each tenant is its "
        f"own Poisson stream, the same whatever else runs; {len(seeds)} seeds, mean (least–most).",
        "",
        *noisy_lines(raw),
        *zipf_lines(raw),
        f"![per-tenant goodput over demand by tenant rank, with and without the tenant policy]({FIGURE_LINK})",
        "",
    ]


# --------------------------------------------------------------------------- figure


def pooled_by_tenant(runs: Sequence[Row], field: Callable[[Row, int], float]) -> list[float]:
    """Per tenant, ``field`` summed over ``runs`` (the seeds), over its offered summed."""
    names = len(runs[0]["per_tenant"]["offered"])
    out = []
    for i in range(names):
        offered = sum(r["per_tenant"]["offered"][i] for r in runs)
        out.append(sum(field(r, i) for r in runs) / offered if offered else float("nan"))
    return out


def figure(raw: Row, path: Path) -> None:
    """Per tenant rank: goodput ÷ demand pooled over the seeds, without and with the policy (the
    band: least to most over the seeds), and the fair share ÷ demand, one panel per load."""
    zipf = raw["zipf"]
    duration = zipf["duration_s"]
    loads = zipf["loads"]
    fig, axes = plt.subplots(1, len(loads), figsize=(5.5 * len(loads), 4.2), squeeze=False, sharey=True)
    for ax, load in zip(axes[0], loads, strict=True):
        for variant in ("without", "with"):
            runs = [r for r in zipf["runs"] if r["load"] == load and r["variant"] == variant]
            ranks = range(1, len(runs[0]["per_tenant"]["offered"]) + 1)
            good = pooled_by_tenant(runs, lambda r, i: r["per_tenant"]["completed_within_slo"][i])
            fair = pooled_by_tenant(runs, lambda r, i: r["per_tenant"]["fair_share_rps"][i] * duration)
            per_seed = [
                [
                    w / o if o else float("nan")
                    for w, o in zip(r["per_tenant"]["completed_within_slo"], r["per_tenant"]["offered"], strict=True)
                ]
                for r in runs
            ]
            seen = [[x for x in v if not math.isnan(x)] or [math.nan] for v in zip(*per_seed, strict=True)]
            low, high = [min(v) for v in seen], [max(v) for v in seen]
            color = COLORS[variant]
            ax.fill_between(ranks, low, high, color=color, alpha=0.12, linewidth=0)
            ax.plot(ranks, good, color=color, label=f"goodput ÷ demand, {variant} tenants")
            ax.plot(ranks, fair, color=color, linestyle=":", linewidth=1, label=f"fair share ÷ demand, {variant}")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("tenant rank (1: the heaviest)")
        ax.set_title(f"{zipf['tenants']} Zipf({zipf['exponent']:g}) tenants at {load:g}x μ")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of the tenant's requests")
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    """Redraw the figure from the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--raw", type=Path, default=RAW)
    parser.add_argument("--figure", type=Path, default=FIGURE)
    args = parser.parse_args(argv)
    figure(json.loads(args.raw.read_text()), args.figure)


if __name__ == "__main__":
    main()
