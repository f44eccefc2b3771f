"""The benchmark's plots (and the demo's), with the simulator's curves laid over the measured ones."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import ticker

from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_bench.reports.points import Key, Point, find
from slogate_bench.results import Run
from slogate_sim.capacity import ServerModel
from slogate_sim.engine import simulate
from slogate_sim.fronts import line_up
from slogate_sim.limits import fair_count_cap
from slogate_sim.scenario import GateKind, SimulationConfig
from slogate_sim.workloads import preset

SCENARIOS = ("direct", "count-cap", "rate-limit", "slogate")
COLORS = {"direct": "#d62728", "count-cap": "#ff7f0e", "rate-limit": "#9467bd", "slogate": "#2ca02c"}


def demo_plot(runs: dict[str, Run], slo_s: float, path: Path) -> None:
    """`slogate demo`'s picture: each run's TTFT CDF over all requests sent, and what became of them."""
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd"]
    for (name, run), color in zip(runs.items(), colors, strict=False):
        ttfts = sorted(r.ttft_s for r in run.results if r.outcome == "ok" and r.ttft_s is not None)
        if ttfts:
            cdf.step(
                ttfts, [(i + 1) / len(run.results) for i in range(len(ttfts))], where="post", label=name, color=color
            )
    cdf.axvline(slo_s, linestyle="--", color="grey", label=f"TTFT SLO {slo_s:g} s")
    cdf.set_xlabel("TTFT (s)")
    cdf.set_ylabel("fraction of requests sent")
    cdf.set_title("TTFT of served requests (tops out at the share served)")
    cdf.legend()
    names = list(runs)
    bottoms = [0.0] * len(names)
    for label, color, count in (
        ("within SLO", "#2ca02c", lambda r: len(r.within(slo_s))),
        ("served late", "#ff7f0e", lambda r: r.count("ok") - len(r.within(slo_s))),
        ("rejected at once", "#7f7f7f", lambda r: r.count("rejected") + r.count("refused")),
        ("timed out / error", "#d62728", lambda r: r.count("timeout") + r.count("error")),
    ):
        heights = [float(count(runs[n])) for n in names]
        bars.bar(names, heights, bottom=bottoms, label=label, color=color)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    bars.set_ylabel("requests")
    bars.set_title("What became of the same requests")
    bars.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def predicted_against_actual(raw: dict[str, Any], path: Path) -> None:
    """Every admitted request of the promise runs (``promise``): its predicted TTFT against the
    TTFT its client saw, per workload, with the SLO on both axes."""
    slo = raw["slo_s"]
    fig, ax = plt.subplots(figsize=(6.2, 5.6))
    for name, color in (("demo", "#1f77b4"), ("long_tail", "#d62728")):
        points = [p for r in raw["runs"] if r["workload"] == name for p in r["points"]]
        if points:
            ax.scatter([p for p, _ in points], [a for _, a in points], s=9, alpha=0.55, color=color,
                       label=f"{name} ({len(points)} admitted)")  # fmt: skip
    top = max([slo * 1.25] + [max(p) for r in raw["runs"] for p in r["points"]])
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8, label="actual = predicted")
    ax.axhline(slo, linestyle="--", color="black", linewidth=0.8, label=f"TTFT SLO {slo:g} s")
    ax.axvline(slo, linestyle=":", color="black", linewidth=0.8)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("predicted TTFT at admission, median (s)")
    ax.set_ylabel("actual TTFT at the client (s)")
    ax.set_title(f"Admitted requests at {raw['load']:g}x, {len(raw['runs'])} runs", fontsize="medium")
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


SIMULATED_GATES: tuple[GateKind, ...] = ("direct", "count-cap", "slogate")
"""The fronts the simulator runs beside the measured ones (it has no rate limit), by their one name."""
SIMULATED_SEEDS = 20


def simulated_goodput(
    profile: CalibrationProfile, thresholds: Thresholds, mu: float, loads: list[float], *, slo_s: float, seconds: float
) -> dict[str, list[tuple[float, float]]]:
    """`slogate simulate`'s goodput at the measured loads, per scenario, for the chat workload.

    The same λ = load · μ and window as the measured runs, the same chat mix (the very
    workload the load generator sent) and 10 s client patience, the fair count cap; the
    mean over 20 seeds, so the curve is the model's expectation for one such run. (The
    window matters above 1x: an ungated queue grows for as long as the overload lasts.)
    """
    workload, server = preset("chat"), ServerModel.from_profile(profile)
    cap = fair_count_cap(thresholds.concurrency_cap, slo_s, thresholds.concurrency_cap / mu)
    curves: dict[str, list[tuple[float, float]]] = {}
    fronts = line_up(thresholds, cap)
    for gate in SIMULATED_GATES:
        curves[gate] = [
            (load, statistics.fmean(simulate(SimulationConfig(
                server=server, workload=workload, arrival_rate_rps=load * mu, duration_s=seconds,
                ttft_slo_s=slo_s, front=fronts[gate], seed=seed,
            )).goodput_rps for seed in range(SIMULATED_SEEDS)))
            for load in loads
        ]  # fmt: skip
    return curves


def simulated_time_in_system(
    profile: CalibrationProfile, mu: float, *, slo_s: float, seconds: float = 3600.0
) -> list[tuple[float, float]]:
    """The simulator's mean time in system for llama-server alone (patient clients) at ρ = 0.1 .. 0.95."""
    workload = dataclasses.replace(preset("chat"), client_timeout_s=math.inf)
    server = ServerModel.from_profile(profile)
    points = []
    for rho in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95):
        result = simulate(SimulationConfig(server=server, workload=workload, arrival_rate_rps=rho * mu,
                                           duration_s=seconds, ttft_slo_s=slo_s, seed=7))  # fmt: skip
        if result.mean_time_in_system_s is not None:
            points.append((rho, result.mean_time_in_system_s))
    return points


def plots(
    raw: dict[str, Any],
    all_points: dict[Key, Point],
    mu: float,
    out_dir: Path,
    *,
    simulated: dict[str, list[tuple[float, float]]] | None = None,
    simulated_w: list[tuple[float, float]] | None = None,
) -> list[str]:
    """Three PNGs; returns their file names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _goodput_plot(raw, all_points, mu, out_dir, simulated)
    _ttft_cdf_plot(raw, all_points, out_dir)
    _latency_plot(all_points, mu, out_dir, simulated_w)
    return ["goodput.png", "ttft_cdf_2x.png", "latency_vs_utilization.png"]


def _loads(all_points: dict[Key, Point], mix: str) -> list[float]:
    return sorted({p.key[2] for p in all_points.values() if p.key[0] == mix and p.key[3] == "none"})


def _goodput_plot(
    raw: dict[str, Any],
    all_points: dict[Key, Point],
    mu: float,
    out_dir: Path,
    simulated: dict[str, list[tuple[float, float]]] | None,
) -> None:
    """Per mix: each front's mean goodput with its 95% interval as an error bar, the
    clairvoyant's on the same traces, and (chat) the simulator's curves."""
    mixes = [m for m in ("chat", "heavy_tail") if _loads(all_points, m)]
    fig, axes = plt.subplots(1, len(mixes), figsize=(6.2 * len(mixes), 4.6), squeeze=False)
    for ax, mix in zip(axes[0], mixes, strict=True):
        loads = _loads(all_points, mix)
        for i, scenario in enumerate(SCENARIOS):
            found = [(load, find(all_points, mix, scenario, load)) for load in loads]
            pts = [(load, p.goodput) for load, p in found if p]
            # Fronts side by side at each load (a few percent apart on the log axis): bars readable.
            xs = [load * 2 ** ((i - 1.5) * 0.04) for load, _ in pts]
            errors = [0.0 if math.isnan(g.half_width) else g.half_width for _, g in pts]
            ax.errorbar(xs, [g.mean for _, g in pts], yerr=errors, marker="o", capsize=3, label=scenario,
                        color=COLORS[scenario])  # fmt: skip
            if simulated and mix == "chat" and scenario in simulated:
                ax.plot([x for x, _ in simulated[scenario]], [y for _, y in simulated[scenario]], linestyle=":",
                        color=COLORS[scenario], label=f"{scenario}, simulated")  # fmt: skip
        gates = [(load, find(all_points, mix, "slogate", load)) for load in loads]
        bound = [(load, c.mean) for load, p in gates if p and (c := p.clairvoyant) is not None]
        if bound:
            ax.plot([x for x, _ in bound], [y for _, y in bound], linestyle="--", color="black",
                    label="clairvoyant (simulated, same traces)")  # fmt: skip
        if mix == "chat":
            ax.axhline(mu, linestyle="--", color="grey", label=f"calibrated capacity μ = {mu:.2f}/s")
        ax.set_xlabel("offered load (x μ of the mix)")
        ax.set_ylabel(f"goodput: completed with TTFT ≤ {raw['slo_s']:g} s (req/s)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(loads, [f"{x:g}x" for x in loads])
        ax.set_ylim(bottom=0)  # goodput from zero: a collapse must look like one
        ax.set_title(f"Goodput vs offered load: {mix} (mean, 95% interval)")
        # Below the axes: inside, the entries covered the lines they name.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize="small")
    fig.tight_layout()
    fig.savefig(out_dir / "goodput.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _ttft_cdf_plot(raw: dict[str, Any], all_points: dict[Key, Point], out_dir: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scenario in SCENARIOS:
        p = find(all_points, "chat", scenario, 2.0)
        if p and p.pooled("ttfts"):
            xs, sent = p.pooled("ttfts"), p.total("requests")
            ax.step(xs, [(i + 1) / sent for i in range(len(xs))], where="post", label=scenario,
                    color=COLORS[scenario])  # fmt: skip
    ax.axvline(raw["slo_s"], linestyle="--", color="grey", label="TTFT SLO")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of all requests sent")
    ax.set_title("TTFT CDF at 2x, chat, every schedule (tops out at the share that got a first token)",
                 fontsize="small")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "ttft_cdf_2x.png", dpi=110)
    plt.close(fig)


def _latency_plot(all_points: dict[Key, Point], mu: float, out_dir: Path,
                  simulated_w: list[tuple[float, float]] | None) -> None:  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rho = [i / 100 for i in range(5, 96)]
    # llama-server shares its capacity among the requests inside (continuous batching): a
    # processor-sharing server, whose mean time in system is 1 / (μ − λ) whatever the
    # service-time distribution (M/G/1-PS is insensitive), so the M/M/1 curve applies.
    ax.plot(rho, [1 / (mu - p * mu) for p in rho], color="grey", label="M/M/1 (= M/G/1-PS): W = 1 / (μ − λ)")
    if simulated_w:
        ax.plot([p for p, _ in simulated_w], [w for _, w in simulated_w], linestyle=":", color=COLORS["direct"],
                label="direct, simulated: mean time in system")  # fmt: skip
    for scenario in ("direct", "slogate"):
        pts = []
        for load in _loads(all_points, "chat"):
            p = find(all_points, "chat", scenario, load)
            values = [r["time_in_system_mean_s"] for r in p.runs if r.get("time_in_system_mean_s")] if p else []
            if values:
                pts.append((load, statistics.fmean(values)))
        ax.plot([p for p, _ in pts], [w for _, w in pts], marker="o", linestyle="none", color=COLORS[scenario],
                label=f"{scenario}: mean time in system of completed")  # fmt: skip
    ax.set_xlabel("offered utilization ρ = λ / μ")
    ax.set_ylabel("seconds")
    ax.set_yscale("log")
    # Ticks at 1, 2, 5, 10, 20... written plainly ("2", not "2×10⁰").
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_title("Latency vs utilization (clients give up at 10 s: measured means above ρ = 1 are censored)",
                 fontsize="small")  # fmt: skip
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out_dir / "latency_vs_utilization.png", dpi=110)
    plt.close(fig)
