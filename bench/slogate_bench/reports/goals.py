"""The benchmark issues' targets, checked against the measured points: met, short, or reported.

Every number is computed from the runs (``points``); a target is never edited by hand.
Where a point ran on several schedules the comparison is of means, and "ahead" of
another front means the 95% intervals separate (``intervals.compare``).
"""

from __future__ import annotations

from typing import Any

from slogate_bench.reports.intervals import compare
from slogate_bench.reports.points import Key, Point, find

Target = tuple[str, str, bool | None]
"""(target, measured, met); met None: reported, no target."""
BASELINES = ("direct", "count-cap", "rate-limit")
MIXES = ("chat", "heavy_tail")


def quantile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile of sorted or unsorted values (None for none)."""
    if not values:
        return None
    return sorted(values)[min(len(values) - 1, round(q * (len(values) - 1)))]


REJECTION_P99_TARGET_S = 0.002
"""The 429's target at the client, p99 (issue 1)."""


def rejection_latency(all_points: dict[Key, Point]) -> tuple[float, float] | None:
    """p50 and p99, seconds, of every 429 slogate sent in the runs (the goals table and the
    README quote this one figure); None without any."""
    rejections = [x for p in all_points.values() if p.scenario == "slogate" for x in p.pooled("rejection_latencies")]
    p50, p99 = quantile(rejections, 0.5), quantile(rejections, 0.99)
    return None if p50 is None or p99 is None else (p50, p99)


def attainment(point: Point) -> float:
    """Share of served requests whose first token met the SLO, over the point's runs."""
    ok = point.total("ok")
    return point.total("within_slo") / ok if ok else 0.0


def ahead_everywhere(all_points: dict[Key, Point], loads: list[float]) -> Target:
    """slogate against every baseline at every load of both mixes: where the intervals separate."""
    verdicts: dict[str, list[str]] = {"ahead": [], "not separated": [], "behind": []}
    for mix in MIXES:
        for load in loads:
            gate = find(all_points, mix, "slogate", load)
            for baseline in BASELINES:
                other = find(all_points, mix, baseline, load)
                if gate and other:
                    verdicts[compare(gate.goodput, other.goodput)].append(f"{baseline} {mix} {load:g}x")
    total = sum(len(v) for v in verdicts.values())
    said = f"ahead in {len(verdicts['ahead'])} of {total}"
    if verdicts["not separated"]:
        said += f"; not separated: {', '.join(verdicts['not separated'])}"
    if verdicts["behind"]:
        said += f"; behind: {', '.join(verdicts['behind'])}"
    return ("slogate's goodput ahead of every baseline, every load, both mixes (95% intervals separate)",
            said, total > 0 and len(verdicts["ahead"]) == total)  # fmt: skip


def promise(all_points: dict[Key, Point], quantile_q: float) -> Target:
    """Admitted requests within the SLO, every slogate run of both mixes, against the SLO's quantile."""
    gates = [p for p in all_points.values() if p.scenario == "slogate" and p.key[3] == "none"]
    ok, within = sum(p.total("ok") for p in gates), sum(p.total("within_slo") for p in gates)
    share = within / ok if ok else 0.0
    return (f"≥ {quantile_q:.0%} of admitted requests within the TTFT SLO (all loads, both mixes)",
            f"{within}/{ok} = {share:.1%}", ok > 0 and share >= quantile_q)  # fmt: skip


def targets(all_points: dict[Key, Point], mu: float, loads: list[float], quantile_q: float) -> list[Target]:
    """(target, measured, met) for each target of the benchmark issues."""
    rows: list[Target] = []
    gate = {load: find(all_points, "chat", "slogate", load) for load in loads}
    direct = {load: find(all_points, "chat", "direct", load) for load in loads}
    one = gate.get(1.0)
    for load in (2.0, 4.0):
        g = gate.get(load)
        if g and one:
            ratio = g.goodput.mean / one.goodput.mean
            rows.append((f"slogate goodput at {load:g}x ≥ 90% of its 1x (chat, means)", f"{ratio:.0%}", ratio >= 0.9))
    rows.append(promise(all_points, quantile_q))
    rows.append(ahead_everywhere(all_points, loads))
    latency = rejection_latency(all_points)
    if latency is not None:
        p50, p99 = latency
        rows.append(("rejection latency p99 ≤ 2 ms at the client (each layer's floor: docs/reject-latency.md)",
                     f"{p99 * 1000:.2f} ms (p50 {p50 * 1000:.2f} ms)", p99 <= REJECTION_P99_TARGET_S))  # fmt: skip
    d4, g4 = direct.get(4.0), gate.get(4.0)
    if d4 and g4:
        rows.append(("direct at 4x: goodput as a share of μ (the collapse)", f"{d4.goodput.mean / mu:.0%}", None))
        ratio = g4.goodput.mean / d4.goodput.mean if d4.goodput.mean else float("inf")
        rows.append(("slogate / direct goodput at 4x ≥ 3x",
                     "∞ (direct delivered nothing)" if ratio == float("inf") else f"{ratio:.1f}x", ratio >= 3))  # fmt: skip
    for load in loads:
        c, g = find(all_points, "heavy_tail", "count-cap", load), find(all_points, "heavy_tail", "slogate", load)
        if c and g:
            rows.append((f"heavy-tailed mix at {load:g}x: SLO attainment of served requests, slogate vs count cap",
                         f"{attainment(g):.0%} vs {attainment(c):.0%}", attainment(g) >= attainment(c)))  # fmt: skip
    for kind in ("immediate", "backoff", "budget"):
        r = find(all_points, "chat", "slogate", 2.0, kind)
        if r:
            p = r.interval("rejection_probability").mean
            lam, eff = r.interval("offered_rps").mean, r.interval("effective_rps").mean
            predicted = f"{lam / (1 - p):.2f}" if p < 1 else "∞"
            rows.append((f"retries ({kind}) at 2x: effective arrivals vs λ and λ/(1−p)",
                         f"λ {lam:.2f}/s, λ_eff {eff:.2f}/s, λ/(1−p) {predicted}/s (p = {p:.2f})", None))  # fmt: skip
    d5, g5 = direct.get(0.5), gate.get(0.5)
    if d5 and g5:
        dp, gp = quantile(d5.pooled("ttfts"), 0.5), quantile(g5.pooled("ttfts"), 0.5)
        if dp and gp:
            rows.append(("overhead at 0.5x: median TTFT through the gate within 5% of direct (the 0.5x runs)",
                         f"{gp / dp - 1:+.1%}", abs(gp / dp - 1) <= 0.05))  # fmt: skip
    errors = [
        r["gate"]["ttftPrediction"]["medianAbsRelativeError"]
        for p in all_points.values()
        if p.scenario == "slogate"
        for r in p.runs
        if r.get("gate") and r["gate"]["ttftPrediction"]["medianAbsRelativeError"] is not None
    ]
    if errors:
        rows.append(("prediction: median |predicted − actual| TTFT ≤ 15% of actual (median over runs; worst)",
                     f"{quantile(errors, 0.5):.0%} (worst {max(errors):.0%})",
                     (quantile(errors, 0.5) or 0.0) <= 0.15))  # fmt: skip
    shares = [
        r["client_cpu_share"] for p in all_points.values() for r in p.runs if r.get("client_cpu_share") is not None
    ]
    if shares:
        rows.append(("load generator's own CPU share (max over runs)", f"{max(shares):.1%} of one core", None))
    return rows


def overhead_targets(raw: dict[str, Any]) -> list[Target]:
    """The gate's own cost: TTFT through it on an idle server (requests in turn), the decision
    in-process and the one-core sidecar throughput (slogate_bench.runs.overhead)."""
    rows: list[Target] = []
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
