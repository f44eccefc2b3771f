"""docs/benchmarks.md and its plots, from the suite's raw results.

Every number in the report is computed here from the measured runs; the targets of the
benchmark issue are checked against them and reported as met or short, never edited.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_bench import readme_numbers
from slogate_bench.capacity import CAPACITY_DRAWS, MU_DEFINITION, ServerModel, capacity_rps
from slogate_bench.figures import (
    SCENARIOS,
    SIMULATED_GATES,
    SIMULATED_SEEDS,
    find_run,
    main_runs,
    plots,
    simulated_goodput,
    simulated_time_in_system,
)
from slogate_bench.load import OUTCOME_COLUMNS, outcome_counts
from slogate_bench.workloads import DESCRIPTIONS, preset


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return sorted(values)[min(len(values) - 1, round(q * (len(values) - 1)))]


def _attainment(run: dict[str, Any]) -> float:
    """Share of served requests whose first token met the SLO."""
    return float(run["within_slo"] / run["ok"]) if run["ok"] else 0.0


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _row(*cells: object) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def _rule(columns: int) -> str:
    return "|" + " --- |" * columns


def _rejection_ms(run: dict[str, Any]) -> str:
    """Client-side rejection latency p50 / p99 in ms, over every rejected attempt."""
    values = run["rejection_latencies"]
    p50, p99 = _quantile(values, 0.5), _quantile(values, 0.99)
    return "-" if p50 is None or p99 is None else f"{p50 * 1000:.1f} / {p99 * 1000:.1f} ms"


def overhead_targets(raw: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The gate's own cost: TTFT through it on an idle server (requests in turn), the decision
    in-process and the one-core sidecar throughput (slogate_bench.overhead)."""
    rows: list[tuple[str, str, bool | None]] = []
    paired = raw.get("paired_overhead")
    if paired:
        ratio = paired["ratio"]
        rows.append((
            "overhead: median TTFT through the gate within 5% of direct (idle server, requests in turn)",
            f"{ratio - 1:+.1%} ({paired['slogate_ttft_p50_s'] * 1000:.0f} vs {paired['direct_ttft_p50_s'] * 1000:.0f} ms, "
            f"{paired['pairs']} pairs)",
            abs(ratio - 1) <= 0.05,
        ))  # fmt: skip
    overhead = raw.get("overhead") or {}
    decision = overhead.get("decision")
    if decision:
        rows.append(("the core's decision in-process: median ≤ 10 µs",
                     f"{decision['median_us']:.1f} µs (p99 {decision['p99_us']:.1f} µs)",
                     decision["median_us"] <= 10))  # fmt: skip
    one_core = overhead.get("sidecar_one_core") or {}
    for key, label, target in (("rejected", "rejections", 2000), ("proxied", "proxied small requests", 1000)):
        r = one_core.get(key)
        if r:
            rows.append((f"sidecar alone on one core: ≥ {target:,} {label}/s",
                         f"{r['requests_per_s']:,.0f}/s ({r['requests']:,} requests)", r["requests_per_s"] >= target))  # fmt: skip
    return rows


def targets(raw: dict[str, Any], mu: float) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for each target of the benchmark issue."""
    runs = main_runs(raw)
    rows: list[tuple[str, str, bool | None]] = []
    gate = {load: find_run(runs, "slogate", load) for load in (0.5, 1.0, 2.0, 4.0)}
    direct = {load: find_run(runs, "direct", load) for load in (0.5, 1.0, 2.0, 4.0)}
    one = gate[1.0]["goodput_rps"] if gate[1.0] else None
    for load in (2.0, 4.0):
        g = gate[load]
        if g and one:
            ratio = g["goodput_rps"] / one
            rows.append((f"slogate goodput at {load:g}x ≥ 90% of its 1x", f"{ratio:.0%}", ratio >= 0.9))
    admitted = [r for r in gate.values() if r]
    ok = sum(r["ok"] for r in admitted)
    within = sum(r["within_slo"] for r in admitted)
    if ok:
        rows.append(
            (
                "≥ 99% of admitted requests within the TTFT SLO (all loads)",
                f"{within}/{ok} = {within / ok:.1%}",
                within / ok >= 0.99,
            )
        )
    rejections = [x for r in admitted for x in r["rejection_latencies"]]
    p99, p50 = _quantile(rejections, 0.99), _quantile(rejections, 0.5)
    if p99 is not None and p50 is not None:
        rows.append(
            (
                "rejection latency p99 ≤ 2 ms at the client",
                f"{p99 * 1000:.2f} ms (p50 {p50 * 1000:.2f} ms)",
                p99 <= 0.002,
            )
        )
    d4, g4 = direct[4.0], gate[4.0]
    if d4 and g4:
        rows.append(("direct at 4x: goodput as a share of μ (the collapse)", f"{d4['goodput_rps'] / mu:.0%}", None))
        ratio = g4["goodput_rps"] / d4["goodput_rps"] if d4["goodput_rps"] else float("inf")
        rows.append(
            (
                "slogate / direct goodput at 4x ≥ 3x",
                "∞ (direct delivered nothing)" if ratio == float("inf") else f"{ratio:.1f}x",
                ratio >= 3,
            )
        )
    heavy = {s: find_run(raw["runs"], s, 2.0, workload="heavy_tail", retry="none") for s in ("count-cap", "slogate")}
    if all(heavy.values()):
        c, g = heavy["count-cap"], heavy["slogate"]
        assert c is not None
        assert g is not None
        rows.append(
            (
                "heavy-tailed mix at 2x: goodput, slogate vs count cap",
                f"{g['goodput_rps']:.2f} vs {c['goodput_rps']:.2f} req/s",
                g["goodput_rps"] >= c["goodput_rps"],
            )
        )
        rows.append(
            (
                "heavy-tailed mix at 2x: SLO attainment of served requests, slogate vs count cap",
                f"{_attainment(g):.0%} vs {_attainment(c):.0%}",
                _attainment(g) >= _attainment(c),
            )
        )
    for kind in ("immediate", "backoff", "budget"):
        r = find_run(raw["runs"], "slogate", 2.0, workload="chat", retry=kind)
        if r:
            p = r["rejection_probability"]
            predicted = r["offered_rps"] / (1 - p) if p is not None and p < 1 else None
            rows.append(
                (
                    f"retries ({kind}) at 2x: effective arrivals vs λ and λ/(1−p)",
                    f"λ {r['offered_rps']:.2f}/s, λ_eff {r['effective_rps']:.2f}/s, λ/(1−p) {_fmt(predicted)}/s (p = {_fmt(p)})",
                    None,
                )
            )
    d5, g5 = direct[0.5], gate[0.5]
    if d5 and g5 and d5["ttft_p50_s"] and g5["ttft_p50_s"]:
        ratio = g5["ttft_p50_s"] / d5["ttft_p50_s"]
        rows.append(
            (
                "overhead at 0.5x: median TTFT through the gate within 5% of direct (the 0.5x runs, ~18 requests)",
                f"{ratio - 1:+.1%}",
                abs(ratio - 1) <= 0.05,
            )
        )
    errors = [r["gate"]["ttftPrediction"]["medianAbsRelativeError"] for r in admitted if r.get("gate")]
    errors = [e for e in errors if e is not None]
    if errors:
        worst = max(errors)
        rows.append(
            ("prediction: median |predicted − actual| TTFT ≤ 15% of actual (worst run)", f"{worst:.0%}", worst <= 0.15)
        )
    shares = [r["client_cpu_share"] for r in raw["runs"] if r.get("client_cpu_share") is not None]
    if shares:
        rows.append(("load generator's own CPU share (max over runs)", f"{max(shares):.1%} of one core", None))
    return rows


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
        lines.append(
            f"- **{name}**: L_max = cap {d['concurrency_cap']} + ⌊μ {d['mu_rps']:.2f}/s x W "
            f"{d['deferral_wait_s']:.1f} s⌋ = {d['l_max']}"
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


def write_report(
    raw: dict[str, Any],
    profile: CalibrationProfile,
    thresholds: Thresholds,
    out: Path,
    plot_dir: Path,
    *,
    readme: Path | None = None,
) -> None:
    """Write the markdown report and the plots (and the README's latest numbers, if given)."""
    mu = capacity_rps(ServerModel.from_profile(profile), preset("chat"), thresholds.concurrency_cap)
    if readme is not None:
        readme_numbers.write(readme, raw, mu)
    loads = sorted({r["load"] for r in main_runs(raw)})
    simulated = simulated_goodput(profile, thresholds, mu, loads, slo_s=raw["slo_s"], seconds=raw.get("seconds", 40.0))
    names = plots(raw, mu, plot_dir, simulated, simulated_time_in_system(profile, mu, slo_s=raw["slo_s"]))
    env = raw["environment"]
    lines = [
        "# Benchmarks",
        "",
        "Measured by `make bench` (`python -m slogate_bench.suite`). Every run starts a fresh",
        "llama-server; scenarios run one after another on the same machine, so compare them",
        "as ratios. This is a shared 2-core VM: the load generator, the gate and llama-server",
        "compete for the same cores.",
        "",
        "| | |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in env.items()],
        f"| model | {profile.model.name} {profile.model.quantization}, llama-server `-t 2 -np 4 -c 8192` |",
        f"| calibration | {profile.id}: prefill {thresholds.prefill_tokens_per_second:.0f} tok/s at {thresholds.reference_prompt_tokens} tokens, decode per stream "
        + " / ".join(f"{p.tokens_per_second:.0f}" for p in profile.decode)
        + " tok/s at B = 1..4 |",
        f"| SLO | TTFT ≤ {raw['slo_s']:g} s; deferral up to 0.5 s. A request whose own prefill alone exceeds it is refused at once by slogate (400, counted as *refused*, never as served) |",
        f"| workload `chat` | {DESCRIPTIONS['chat']}; streaming, Poisson arrivals, clients give up after 10 s |",
        f"| workload `heavy_tail` | {DESCRIPTIONS['heavy_tail']} |",
        f"| runs | {raw.get('seconds', '?')} s of arrivals each, a fresh llama-server (at nice {raw.get('llama_niceness', 0)}) per run, every front in its own process |",
        f"| capacity μ (chat) | {mu:.2f} req/s at the concurrency cap ({thresholds.concurrency_cap}), over {CAPACITY_DRAWS:,} requests of the mix |",
        "",
        f"**Capacity μ**, the unit of every offered load below, of the fair count cap and rate limit, of `slogate simulate`, `slogate demo` and `make soak` (one definition, `slogate_bench.capacity`): {MU_DEFINITION}",
        "",
        "Scenarios: **direct** (llama-server alone, its own unbounded queue); **count-cap** (4 in",
        "flight + a FIFO queue of ⌊SLO · μ⌋, 503 when full: the depth a careful operator derives",
        "from the same SLO and calibration); **rate-limit** (token bucket at μ, burst 4, 429);",
        "**slogate** (the sidecar with derived thresholds).",
        "",
        "Goodput may exceed μ: μ is for the whole mix, and a gate that serves the shorter",
        "requests of the mix (slogate refuses prompts whose own prefill cannot fit the SLO and,",
        "under load, those the queue leaves no room for) completes more of them per second.",
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "| --- | --- | --- |",
        *[
            f"| {t} | {m} | {'yes' if ok else 'no' if ok is not None else '(reported)'} |"
            for t, m, ok in targets(raw, mu) + overhead_targets(raw)
        ],
        "",
        "## Plots",
        "",
        *[f"![{n}](bench/{n})" for n in names],
        "",
    ]
    runs = main_runs(raw)
    for load in sorted({r["load"] for r in runs}):
        lines += [
            f"## {load:g}x offered load (chat)",
            "",
            _row("scenario", "sent", *OUTCOME_COLUMNS, "goodput", "p50 TTFT", "p99 TTFT", "rejection p50 / p99"),
            _rule(5 + len(OUTCOME_COLUMNS)),
        ]
        for scenario in SCENARIOS:
            r = find_run(runs, scenario, load)
            if r:
                lines.append(_row(
                    scenario, r["requests"], *outcome_counts(r), f"{r['goodput_rps']:.2f}/s",
                    _fmt(r["ttft_p50_s"], " s"), _fmt(r["ttft_p99_s"], " s"), _rejection_ms(r),
                ))  # fmt: skip
        lines.append("")
    lines += [
        "## Simulator vs measurement (chat, goodput req/s)",
        "",
        f"`slogate simulate` with this calibration: the same λ and {raw.get('seconds', '?')} s window as the measured",
        f"runs, the mean of {SIMULATED_SEEDS} seeds per point (dotted lines in the goodput plot).",
        "",
        "| load | " + " | ".join(f"{s} measured | {s} simulated" for s in SIMULATED_GATES) + " |",
        "| --- | " + " | ".join("--- | ---" for _ in SIMULATED_GATES) + " |",
    ]
    for i, load in enumerate(loads):
        cells = []
        for scenario in SIMULATED_GATES:
            measured = find_run(runs, scenario, load)
            cells += [_fmt(measured["goodput_rps"] if measured else None), f"{simulated[scenario][i][1]:.2f}"]
        lines.append(f"| {load:g}x | " + " | ".join(cells) + " |")
    lines.append("")
    extra = [r for r in raw["runs"] if r["workload"] != "chat" or r["retry"] != "none"]
    if extra:
        lines += [
            "## Heavy-tailed mix and retries (2x)",
            "",
            _row("scenario", "workload", "retry", "sent", "attempts", *OUTCOME_COLUMNS, "goodput", "p99 TTFT"),
            _rule(7 + len(OUTCOME_COLUMNS)),
        ]
        for r in extra:
            lines.append(_row(
                r["scenario"], r["workload"], r["retry"], r["requests"], r["arrivals"], *outcome_counts(r),
                f"{r['goodput_rps']:.2f}/s", _fmt(r["ttft_p99_s"], " s"),
            ))  # fmt: skip
        lines.append("")
    deferral = plot_dir / "deferral.json"  # `make bench-deferral`
    if deferral.exists():
        lines += deferral_section(json.loads(deferral.read_text()))
    out.write_text("\n".join(lines))


def main() -> None:
    """Re-render docs/benchmarks.md and the plots from a results file, without re-running."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--raw", type=Path, default=Path("docs/bench/results.json"))
    parser.add_argument("--profile", type=Path, default=Path("docs/bench/profile.json"),
                        help="the calibration profile the runs used")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    args = parser.parse_args()
    raw = json.loads(args.raw.read_text())
    profile = CalibrationProfile.model_validate_json(args.profile.read_text())
    if profile.id != raw["profile"]:
        parser.error(f"{args.profile} is {profile.id}, the runs used {raw['profile']}")
    policy = Policy.model_validate({"slo": {"ttftSeconds": raw["slo_s"]}, "deferral": {"maxWaitSeconds": 0.5}})
    thresholds = derive_thresholds(policy, profile, derived_at=datetime.now(UTC))
    write_report(raw, profile, thresholds, args.out, args.raw.parent, readme=Path("README.md"))


if __name__ == "__main__":
    main()
