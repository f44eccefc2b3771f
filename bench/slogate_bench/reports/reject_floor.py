"""The reject-latency benchmark's numbers and its block of docs/reject-latency.md.

Pure: the raw run (``reject_floor.measure``'s JSON) in, statistics and markdown out, so a
run can be re-rendered (``python -m slogate_bench.runs.reject_floor --render``) and the tables
tested without a machine. A cell is a quantile of every rejection of that layer in that
condition, pooled over the repeats, with the lowest and highest of the repeats' own values
beside it: the spread that machine drift leaves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DOC_BEGIN = "<!-- reject-floor:begin (written by `make bench-reject`) -->"
DOC_END = "<!-- reject-floor:end -->"
GOAL_S = 0.002
"""The published goal: rejection latency p99 ≤ 2 ms at the client, at 4x."""
REJECTED = 429
CARRIER = "loaded"
"""The target key of the sidecar that carries the load (whichever loop's it is in a condition)."""


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile the benchmark report uses (``report._quantile``); ValueError if empty."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Spread:
    """A quantile over all repeats pooled, and the lowest and highest of the repeats' own."""

    pooled: float
    low: float
    high: float

    def ms(self) -> str:
        """``2.31 (2.10–2.52)``, milliseconds."""
        return f"{self.pooled * 1e3:.2f} ({self.low * 1e3:.2f}–{self.high * 1e3:.2f})"


@dataclass(frozen=True)
class Summary:
    """One layer in one condition."""

    rejections: int
    """429s timed, over all repeats."""
    p50: Spread
    p99: Spread


def summarize(repeats: Sequence[Sequence[float]], q50: float = 0.5, q99: float = 0.99) -> Summary | None:
    """Each repeat's rejection latencies (seconds) -> the pooled quantiles and their spread;
    None when no repeat has any. A repeat without rejections takes no part in the spread."""
    present = [r for r in repeats if r]
    if not present:
        return None
    pooled = [x for r in present for x in r]

    def spread(q: float) -> Spread:
        each = [quantile(r, q) for r in present]
        return Spread(quantile(pooled, q), min(each), max(each))

    return Summary(len(pooled), spread(q50), spread(q99))


def latencies(raw: Mapping[str, Any], condition: str, target: str) -> list[list[float]]:
    """The 429 latencies of ``target`` in each repeat of ``condition``."""
    return [
        phase["probes"][target]["rejected_s"]
        for phase in raw["phases"]
        if phase["condition"] == condition and target in phase["probes"]
    ]


def table(raw: Mapping[str, Any]) -> dict[tuple[str, str], Summary | None]:
    """(condition, target) -> its summary."""
    return {
        (c["key"], t["key"]): summarize(latencies(raw, c["key"], t["key"]))
        for c in raw["conditions"]
        for t in raw["targets"]
    }


def not_rejected(raw: Mapping[str, Any]) -> dict[str, Counter[str]]:
    """target -> how many probes got anything but a 429, by status (0: a client error or timeout)."""
    found: dict[str, Counter[str]] = {t["key"]: Counter() for t in raw["targets"]}
    for phase in raw["phases"]:
        for target, probes in phase["probes"].items():
            found[target].update({str(k): v for k, v in probes["other"].items()})
    return found


CLIENT_WAIT_LABEL = "*the aiohttp client's own wait for a CPU during a probe*"
"""The extra row under each table: not a layer, the part of every aiohttp-timed cell that is the
measuring client's scheduling (its run-queue time, /proc/thread-self/schedstat)."""


def client_waits(raw: Mapping[str, Any], condition: str) -> list[list[float]]:
    """Per repeat of ``condition``: the probing client's run-queue wait across each 429 it timed
    itself (curl's probes are timed by curl, so left out)."""
    return [
        [
            w
            for key, probes in phase["probes"].items()
            if not key.startswith("curl-")
            for w in probes.get("client_wait_s", [])
        ]
        for phase in raw["phases"]
        if phase["condition"] == condition
    ]


def _grid(raw: Mapping[str, Any], cells: Mapping[tuple[str, str], Summary | None], which: str) -> list[str]:
    conditions = raw["conditions"]
    lines = [
        "| layer | " + " | ".join(c["short"] for c in conditions) + " |",
        "| --- |" + " --- |" * len(conditions),
    ]
    for t in raw["targets"]:
        row = []
        for c in conditions:
            s = cells[c["key"], t["key"]]
            row.append("-" if s is None else getattr(s, which).ms())
        lines.append(f"| {t['label']} | " + " | ".join(row) + " |")
    waits = [summarize(client_waits(raw, c["key"])) for c in conditions]
    if any(waits):
        lines.append(
            f"| {CLIENT_WAIT_LABEL} | " + " | ".join("-" if w is None else getattr(w, which).ms() for w in waits) + " |"
        )
    return lines


def _q(cells: Mapping[tuple[str, str], Summary | None], condition: str, target: str, which: str) -> float | None:
    s = cells.get((condition, target))
    return None if s is None else float(getattr(s, which).pooled)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f} ms"


def _delta(high: float | None, low: float | None) -> str:
    return "-" if high is None or low is None else f"{(high - low) * 1e3:+.2f} ms"


def attribution(raw: Mapping[str, Any], cells: Mapping[tuple[str, str], Summary | None]) -> list[str]:
    """What is the machine's and what is Python's: each layer over the one below it, at p50 (where
    the layers part clearly) and at p99 (the tail), in the condition the benchmarks run (the first);
    then the conditions, for the sidecar that carries the load."""
    keys = [c["key"] for c in raw["conditions"]]
    short = {c["key"]: c["short"] for c in raw["conditions"]}
    base = keys[0]

    def q(target: str, condition: str = base, which: str = "p99") -> float | None:
        return _q(cells, condition, target, which) if condition in short else None

    def step(high: str, low: str, condition: str = base) -> str:
        """``high`` over ``low``: p50 and p99 differences."""
        return (
            f"p50 {_delta(q(high, condition, 'p50'), q(low, condition, 'p50'))}, "
            f"p99 {_delta(q(high, condition), q(low, condition))}"
        )

    def both(target: str, condition: str = base) -> str:
        return f"p50 {_ms(q(target, condition, 'p50'))}, p99 {_ms(q(target, condition))}"

    def wait(condition: str) -> float | None:
        summary = summarize(client_waits(raw, condition)) if condition in short else None
        return None if summary is None else summary.p99.pooled

    def across(target: str) -> str:
        return ", ".join(f"{short[k]} {_ms(q(target, k))}" for k in keys if q(target, k) is not None)

    measured = [(k, v) for k in keys if (v := q(CARRIER, k)) is not None]
    goal = f"- **The goal** (p99 ≤ {GOAL_S * 1e3:g} ms at the client at 4x, the sidecar carrying the load): "
    if measured:
        best_key, best = min(measured, key=lambda kv: kv[1])
        goal += f"{_ms(q(CARRIER))} as the benchmarks run it; the best condition, {short[best_key]}, {_ms(best)}: " + (
            "met." if best <= GOAL_S else "not met."
        )
    else:
        goal += "not measured."
    return [
        f"- **The machine** (nginx's `return 429` timed by curl: no Python anywhere): {both('curl-nginx-return')} "
        f"under the load; {both('curl-nginx-return', 'no-load')} with none.",
        f"- **The Python client** (aiohttp's time over curl's, both against nginx): "
        f"{step('nginx-return', 'curl-nginx-return')} under the load; "
        f"{step('nginx-return', 'curl-nginx-return', 'no-load')} with none. The aiohttp client's own wait for a "
        f"CPU during a probe reaches {_ms(wait(base))} at p99 under the load, {_ms(wait('no-load'))} with none.",
        f"- **Python and aiohttp serving** (a bare aiohttp 429 over nginx's `return 429`, both timed by aiohttp): "
        f"{step('bare-asyncio', 'nginx-return')} on asyncio; {step('bare-uvloop', 'nginx-return')} on uvloop.",
        f"- **slogate's own code** (read, parse, count, decide, its JSON error and access log: the sidecar with no "
        f"load of its own over the bare server on the same loop): {step('idle-asyncio', 'bare-asyncio')} on "
        f"asyncio; {step('idle-uvloop', 'bare-uvloop')} on uvloop.",
        f"- **Carrying the load** (the sidecar relaying its 4x load's streams, over one with none): "
        f"{step(CARRIER, 'idle-asyncio')}. Timed by curl, the sidecar carrying the load: {both('curl-' + CARRIER)}.",
        f"- **The conditions**, the sidecar carrying the load, p99: timed by aiohttp {across(CARRIER)}; "
        f"timed by curl {across('curl-' + CARRIER)}.",
        goal,
    ]


def load_table(raw: Mapping[str, Any]) -> list[str]:
    """The background load each condition ran under, summed over its repeats."""
    lines = [
        "| condition | what changes | load through | ended | served (within SLO) | rejected | refused | timed out "
        "| errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in raw["conditions"]:
        counts: Counter[str] = Counter()
        for phase in raw["phases"]:
            if phase["condition"] == c["key"]:
                counts.update(phase["load"])
        lines.append(
            f"| {c['short']} | {c['label']} | {c['carrier'] or 'no'} sidecar | {counts['ended']} | {counts['ok']} "
            f"({counts['within_slo']}) | {counts['rejected']} | {counts['refused']} | {counts['timeout']} | "
            f"{counts['error']} |"
        )
    return lines


def markdown(raw: Mapping[str, Any]) -> str:
    """The generated block of docs/reject-latency.md, markers included."""
    s = raw["settings"]
    cells = table(raw)
    env = raw["environment"]
    others = not_rejected(raw)
    other_text = "; ".join(
        f"{t['label']}: "
        + ", ".join(f"{n} × {'no answer' if k == '0' else k}" for k, n in sorted(others[t["key"]].items()))
        for t in raw["targets"]
        if others[t["key"]]
    )
    lines = [
        DOC_BEGIN,
        "",
        "| | |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in env.items()),
        f"| load | the chat mix at {s['load']:g}x μ = {raw['rate_rps']:.2f} req/s (μ {raw['mu_rps']:.2f} req/s, "
        f"calibration {raw['profile']}), open loop, through the sidecar that carries it |",
        f"| run | {len(raw['conditions'])} conditions × {s['repeats']} repeats, in rotating order; each "
        f"{s['warmup_s']:g} s of load before {s['seconds']:g} s of probes; {raw['wall_s'] / 60:.1f} min in all |",
        f"| probes | one at a time, every layer in a shuffled order each round, {s['gap_ms'][0]:g}–"
        f"{s['gap_ms'][1]:g} ms apart; a fresh TCP connection each (no keep-alive, as the benchmarks' "
        f"clients); a POST of a 100-token completion request; timed from sending to the whole answer read |",
        "",
        "**p99 of the client-side rejection latency, ms** (pooled over the repeats; lowest–highest repeat):",
        "",
        *_grid(raw, cells, "p99"),
        "",
        "**p50, ms:**",
        "",
        *_grid(raw, cells, "p50"),
        "",
        f"Each cell pools {min((c.rejections for c in cells.values() if c), default=0)} rejections or more."
        + (f" Probes not answered 429 (left out): {other_text}." if other_text else " Every probe was answered 429."),
        "",
        "**Where the time goes** (condition `default` unless said; differences of pooled quantiles, so at p99 "
        "within the spread above they are noise):",
        "",
        *attribution(raw, cells),
        "",
        "**The background load** in each condition (what became of the load generator's requests that "
        "ended before each phase's stop):",
        "",
        *load_table(raw),
        "",
        DOC_END,
    ]
    return "\n".join(lines)
