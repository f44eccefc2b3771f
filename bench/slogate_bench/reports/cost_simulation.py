"""The measured block of docs/admission-math.md's "Cost order", from docs/bench/cost-simulated.json
(``runs.cost_simulation``). Every number comes from the JSON; nothing is run.
``python -m slogate_bench.reports cost-simulated`` renders it again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slogate_bench.published import replace_block
from slogate_bench.reports.intervals import mean_interval

RAW = Path("docs/bench/cost-simulated.json")
DOC = Path("docs/admission-math.md")
BEGIN = "<!-- cost-simulated:begin (make bench-cost-sim writes this block) -->"
END = "<!-- cost-simulated:end -->"
GOALS = {"share": 0.75, "quartile": 0.5, "token_goodput": 0.95, "within_slo": 0.99}
"""Issue 28's bars: at 2x and 4x at least 75% of the clairvoyant's goodput; each cost quartile
keeps at least half its on-time ratio under arrival order; token goodput at least 95% of arrival
order's; at least 99% of admitted requests within the SLO."""
Row = Mapping[str, Any]


def _runs(rows: Sequence[Row], mix: str, load: float, order: str) -> list[Row]:
    return sorted(
        (r for r in rows if r["mix"] == mix and r["load"] == load and r["order"] == order), key=lambda r: r["seed"]
    )


def _on_time_ratio(runs: Sequence[Row], quartile: str) -> float:
    offered = sum(r["quartiles"][quartile]["offered"] for r in runs)
    return sum(r["quartiles"][quartile]["on_time"] for r in runs) / offered if offered else float("nan")


def _verdict(ok: bool) -> str:
    return "" if ok else " **FAIL**"


def block(results: Mapping[str, Any]) -> str:
    """The block: a table per mix and load, the goals' verdicts, where and when it ran."""
    rows = results["runs"]
    env = results["environment"]
    lines = [
        BEGIN,
        "",
        f"Simulated by `make bench-cost-sim` on {env['date']} ({env['cpu']}; {results['duration_min']} min): "
        f"the pod `make bench-full` calibrated (profile {results['profile']}), TTFT SLO {results['slo_s']:g} s, "
        f"maxWaitSeconds {results['max_wait_s']:g} s, {results['cost_reserve_slots']} slot(s) held back, "
        f"{len({r['seed'] for r in rows})} arrival schedules of {results['window_s']:g} s per point, both orders on "
        "the very same arrivals. Shares are of the clairvoyant's goodput on each trace (mean ± 95% interval); "
        "the gain is the paired difference. Quartiles are the trace's own cost quartiles (Q1 cheapest); "
        "each cell is the cost order's on-time ratio over arrival order's.",
        "",
        "| mix | load | arrival | cost | gain | admitted within SLO | token goodput, cost ÷ arrival "
        "| Q1 | Q2 | Q3 | Q4 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    failures: list[str] = []
    for mix in dict.fromkeys(r["mix"] for r in rows):
        for load in sorted({r["load"] for r in rows if r["mix"] == mix}):
            arrival, cost = _runs(rows, mix, load, "arrival"), _runs(rows, mix, load, "cost")
            a_share, c_share = (mean_interval([r["share"] for r in runs]) for runs in (arrival, cost))
            gain = mean_interval([c["share"] - a["share"] for a, c in zip(arrival, cost, strict=True)])
            within = min(r["within_slo_of_admitted"] for r in cost if r["within_slo_of_admitted"] is not None)
            tokens = sum(r["token_goodput_per_s"] for r in cost) / sum(r["token_goodput_per_s"] for r in arrival)
            kept = [_on_time_ratio(cost, q) / _on_time_ratio(arrival, q) for q in ("q1", "q2", "q3", "q4")]
            overloaded = load > 1
            share_ok = not overloaded or c_share.mean >= GOALS["share"]
            quartiles_ok = min(kept) >= GOALS["quartile"]
            tokens_ok = tokens >= GOALS["token_goodput"]
            within_ok = within >= GOALS["within_slo"]
            for ok, what in (
                (share_ok, "share"),
                (quartiles_ok, "quartile"),
                (tokens_ok, "tokens"),
                (within_ok, "SLO"),
            ):
                if not ok:
                    failures.append(f"{mix} {load:g}x {what}")
            lines.append(
                f"| {mix} | {load:g}x | {a_share.fmt(3)} | {c_share.fmt(3)}{_verdict(share_ok)} | {gain.fmt(3)} "
                f"| {100 * within:.1f}%{_verdict(within_ok)} | {tokens:.3f}{_verdict(tokens_ok)} | "
                + " | ".join(f"{k:.2f}{_verdict(k >= GOALS['quartile'])}" for k in kept)
                + " |"
            )
    lines += [
        "",
        "Goals (issue 28): a share of at least "
        f"{GOALS['share']:.0%} at 2x and 4x, each quartile at least {GOALS['quartile']:.0%} of its "
        f"arrival-order ratio, token goodput at least {GOALS['token_goodput']:.0%} of arrival order's, "
        f"at least {GOALS['within_slo']:.0%} of admitted requests within the SLO. "
        + (f"Missed: {', '.join(failures)}." if failures else "All met."),
        "",
        END,
    ]
    return "\n".join(lines)


def render() -> None:
    """Rewrite the block of docs/admission-math.md from the JSON."""
    replace_block(DOC, BEGIN, END, block(json.loads(RAW.read_text())))


def main(argv: Sequence[str] | None = None) -> None:
    """Render the block (no arguments)."""
    del argv
    render()


if __name__ == "__main__":
    main()
