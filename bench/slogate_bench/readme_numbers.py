"""The README's "Latest numbers", written from the benchmark's results (never by hand).

``make bench`` (``report.write_report``) rewrites the block between the markers; the rest
of the README is left as it is.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from slogate_bench.figures import find_run, main_runs
from slogate_bench.published import replace_block

BEGIN = "<!-- latest-numbers:begin (written by `make bench`, slogate_bench.readme_numbers) -->"
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


def block(raw: dict[str, Any], mu: float) -> str:
    """The README block: where and how it was measured, the goodput table, what it shows."""
    env, runs = raw["environment"], main_runs(raw)
    lines = [
        BEGIN,
        f"From [docs/benchmarks.md](docs/benchmarks.md) (`make bench`, {env['date']}, {env['cpu']},",
        f"SmolLM2-135M Q4_1, chat mix, TTFT SLO {raw['slo_s']:g} s, clients giving up after 10 s,",
        f"{raw.get('seconds', 40.0):g} s per run, the four fronts side by side on the same llama-server build):",
        "",
        WORDS,
        "",
        "| offered load | direct goodput | count cap | rate limit | slogate | slogate: admitted within SLO |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for load in LOADS:
        found = [find_run(runs, front, load) for front in FRONTS]
        cells = [f"{r['goodput_rps']:.2f}/s" if r else "-" for r in found]
        gate = found[-1]
        on_time = f"{gate['within_slo']}/{gate['ok']}" if gate else "-"
        lines.append(f"| {load:g}x | {' | '.join(cells)} | {on_time} |")
    lines += ["", summary(raw, mu), END]
    return "\n".join(lines)


def summary(raw: dict[str, Any], mu: float) -> str:
    """One paragraph of the numbers that matter, each from the runs."""
    runs = main_runs(raw)
    direct4, gate4 = find_run(runs, "direct", 4.0), find_run(runs, "slogate", 4.0)
    gates = [r for r in (find_run(runs, "slogate", load) for load in (0.5, *LOADS)) if r]
    within, ok = sum(r["within_slo"] for r in gates), sum(r["ok"] for r in gates)
    rejections = sorted(x for r in gates for x in r["rejection_latencies"])
    said = []
    if direct4 and gate4:
        times = gate4["goodput_rps"] / direct4["goodput_rps"] if direct4["goodput_rps"] else float("inf")
        said.append(
            f"At 4x llama-server alone delivers {direct4['goodput_rps'] / mu:.0%} of its capacity (clients time out "
            f"behind an unbounded queue); slogate delivers {times:.1f}x that"
        )
    if ok:
        said.append(f"{within} of {ok} requests slogate admitted (all loads) met the SLO")
    if rejections:
        p50 = statistics.median(rejections) * 1000
        p99 = rejections[min(len(rejections) - 1, int(0.99 * len(rejections)))] * 1000
        said.append(f"its 429s came back in {p50:.1f} ms at the median, {p99:.1f} ms at p99 (this busy 2-core VM)")
    heavy = {f: find_run(raw["runs"], f, 2.0, workload="heavy_tail", retry="none") for f in ("count-cap", "slogate")}
    c, g = heavy["count-cap"], heavy["slogate"]
    if c and g:
        said.append(
            f"on the heavy-tailed mix at 2x slogate served {g['goodput_rps']:.2f}/s with "
            f"{_on_time(g):.0%} of served requests on time, "
            f"the count cap {c['goodput_rps']:.2f}/s with {_on_time(c):.0%}"
        )
    return "; ".join(said) + ". Every target, met or not, is in [docs/benchmarks.md](docs/benchmarks.md)."


def _on_time(run: dict[str, Any]) -> float:
    return float(run["within_slo"] / run["ok"]) if run["ok"] else 0.0


def write(readme: Path, raw: dict[str, Any], mu: float) -> None:
    """Rewrite the README's block."""
    replace_block(readme, BEGIN, END, block(raw, mu))
