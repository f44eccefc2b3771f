"""The README's "Latest numbers", written from the benchmark's results (never by hand).

``make bench-full`` (``report.write_report``) rewrites the block between the markers; the rest
of the README is left as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slogate_bench.published import replace_block
from slogate_bench.reports.goals import REJECTION_P99_TARGET_S, rejection_latency
from slogate_bench.reports.intervals import compare
from slogate_bench.reports.points import Key, Point, find

BEGIN = "<!-- latest-numbers:begin (written by `make bench-full`, slogate_bench.reports.readme_numbers) -->"
END = "<!-- latest-numbers:end -->"
LOADS = (1.0, 2.0, 4.0)
FRONTS = ("direct", "count-cap", "rate-limit", "slogate")

WORDS = (
    "Words used below: *goodput* is requests completed within the TTFT SLO per second; an\n"
    "*offered load* of 2x is twice the calibrated capacity μ (the completions per second the\n"
    "server sustains for this mix at its concurrency cap: one over the mean server time of a\n"
    "request, docs/benchmarks.md); *direct* is llama-server alone; *count cap* is a proxy\n"
    "admitting at most the slot count plus a queue sized from the same calibration (503\n"
    "beyond); *rate limit* is a token bucket at μ (429 beyond)."
)


def block(raw: dict[str, Any], all_points: dict[Key, Point], mu: float) -> str:
    """The README block: where and how it was measured, the goodput table, what it shows."""
    env = raw["environment"]
    seeds = len(raw.get("seeds", [1]))
    lines = [
        BEGIN,
        f"From [docs/benchmarks.md](docs/benchmarks.md) (`make bench-full`, {env['date']}, {env['cpu']},",
        f"SmolLM2-135M Q4_1, chat mix, TTFT SLO {raw['slo_s']:g} s, clients giving up after 10 s,",
        f"{raw.get('seconds', 40.0):g} s per run, the four fronts side by side on the same llama-server build;",
        f"each cell the mean of {seeds} arrival schedules ± its 95% interval):",
        "",
        WORDS,
        "",
        "| offered load | direct goodput | count cap | rate limit | slogate | slogate: admitted within SLO |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for load in LOADS:
        found = [find(all_points, "chat", front, load) for front in FRONTS]
        cells = [p.goodput.fmt(unit="/s") if p else "-" for p in found]
        gate = found[-1]
        on_time = f"{gate.total('within_slo')}/{gate.total('ok')}" if gate else "-"
        lines.append(f"| {load:g}x | {' | '.join(cells)} | {on_time} |")
    lines += ["", summary(all_points, mu), END]
    return "\n".join(lines)


def summary(all_points: dict[Key, Point], mu: float) -> str:
    """One paragraph of the numbers that matter, each from the runs."""
    direct4, gate4 = find(all_points, "chat", "direct", 4.0), find(all_points, "chat", "slogate", 4.0)
    gates = [p for p in all_points.values() if p.scenario == "slogate" and p.key[3] == "none"]
    within, ok = sum(p.total("within_slo") for p in gates), sum(p.total("ok") for p in gates)
    latency = rejection_latency(all_points)
    said = []
    if direct4 and gate4:
        d, g = direct4.goodput.mean, gate4.goodput.mean
        times = g / d if d else float("inf")
        said.append(
            f"At 4x llama-server alone delivers {d / mu:.0%} of its capacity (clients time out "
            f"behind an unbounded queue); slogate delivers {times:.1f}x that"
        )
    if ok:
        said.append(f"{within} of {ok} requests slogate admitted (all loads, both mixes) met the SLO")
    versus = [
        (load, find(all_points, "chat", "count-cap", load), find(all_points, "chat", "slogate", load))
        for load in (2.0, 4.0)
    ]
    verdicts = {load: compare(g.goodput, c.goodput) for load, c, g in versus if c and g}
    tied = [f"{load:g}x" for load, verdict in verdicts.items() if verdict != "ahead"]
    if tied:
        said.append(
            f"on the chat mix its goodput is not separated from the count cap's at {' and '.join(tied)} "
            "(their 95% intervals overlap)"
        )
    if latency is not None:
        p50, p99 = latency
        met = "meeting" if p99 <= REJECTION_P99_TARGET_S else "missing"
        said.append(
            f"its 429s came back in {p50 * 1000:.2f} ms at the median and {p99 * 1000:.2f} ms at p99, {met} the "
            f"{REJECTION_P99_TARGET_S * 1000:g} ms p99 target (this busy 2-core VM; each layer's floor: "
            "docs/reject-latency.md)"
        )
    gate = [p for p in gates if p.key[0] == "chat" and p.share_of_clairvoyant is not None]
    if gate:
        worst = min(gate, key=lambda p: p.share_of_clairvoyant.mean if p.share_of_clairvoyant else 1.0)
        share = worst.share_of_clairvoyant
        assert share is not None
        said.append(
            f"on the chat mix slogate reaches at least {share.mean:.0%} of the clairvoyant's goodput on the same "
            f"traces (at {worst.key[2]:g}x)"
        )
    return "; ".join(said) + ". Every target, met or not, is in [docs/benchmarks.md](docs/benchmarks.md)."


def write(readme: Path, raw: dict[str, Any], all_points: dict[Key, Point], mu: float) -> None:
    """Rewrite the README's block."""
    replace_block(readme, BEGIN, END, block(raw, all_points, mu))
