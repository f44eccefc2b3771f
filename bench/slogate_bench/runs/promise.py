"""The SLO promise, measured: do admitted requests meet the SLO at its quantile, on any workload?

Issue 14.1. `slogate demo`'s own overload (3x μ of its 200-token prompts, 20 s, the demo's
policy and llama-server as the demo starts it) through the sidecar, over five arrival
schedules; then the same on ``long_tail``, a heavier workload no constant was tuned on.
Every admitted request's predicted TTFT (the sidecar's ``X-Slogate-Predicted-Ttft``) is
kept beside the TTFT its client saw, for the plot of one against the other. The goal: at
least the SLO's quantile (0.99 by default) of admitted requests within the SLO, over each
workload's five runs, each run reported.

Run: ``make bench-promise`` (about 6 minutes). Writes docs/bench/promise.json and
docs/bench/predicted-vs-actual.png; `python -m slogate_bench.reports.benchmarks` renders its section
of docs/benchmarks.md (``promise_section``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from slogate_admission.derivation import derive_thresholds
from slogate_bench.live.fronts import SlogateFront
from slogate_bench.live.load import open_loop
from slogate_bench.published import environment
from slogate_bench.reports.figures import predicted_against_actual
from slogate_bench.results import Run
from slogate_bench.runs.demo import WORKLOAD as DEMO_WORKLOAD
from slogate_bench.runs.demo import DemoSettings, demo_policy, wait_until_idle
from slogate_calibration.calibrate import CalibrationSettings
from slogate_calibration.profile_cache import cached_or_calibrated
from slogate_calibration.runtime import LlamaServer, locate
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.workloads import Workload, preset

SEEDS = (1, 2, 3, 4, 5)
WORKLOADS: tuple[tuple[str, Workload], ...] = (("demo", DEMO_WORKLOAD), ("long_tail", preset("long_tail")))
"""The demo's workload, then one nothing was tuned on."""


def admitted_points(run: Run) -> list[tuple[float, float]]:
    """(predicted, actual) TTFT of every admitted request whose first token came."""
    return [
        (r.predicted_ttft_s, r.ttft_s) for r in run.results if r.predicted_ttft_s is not None and r.ttft_s is not None
    ]


def run_row(workload: str, seed: int, run: Run, slo_s: float, books: dict[str, Any] | None) -> dict[str, Any]:
    """One run's counts: admitted (the gate let it through and its first token came) and how
    many of those were within the SLO; the gate's margin at the end."""
    points = admitted_points(run)
    return {
        "workload": workload,
        "seed": seed,
        **run.summary(slo_s),
        "admitted": len(points),
        "admitted_within_slo": sum(1 for _, actual in points if actual <= slo_s),
        "points": points,
        "ttft_error": (books or {}).get("ttftError"),
    }


async def measure(settings: DemoSettings, console: Console) -> dict[str, Any]:
    """Every run, on one llama-server started as the demo starts it."""
    state = settings.state_dir
    state.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with LlamaServer(locate(), log_path=state / "promise-llama-server.log") as server:
        calibration = CalibrationSettings(upstream=server.url, server_args=server.args[1:], budget_s=300)
        profile = await cached_or_calibrated(calibration, state, console.print)
        thresholds = derive_thresholds(demo_policy(settings.slo_s), profile, derived_at=datetime.now(UTC))
        for name, workload in WORKLOADS:
            mu = capacity_rps(ServerModel.from_profile(profile), workload, thresholds.concurrency_cap)
            for seed in SEEDS:
                # Each run starts from an idle server with a fresh gate: nothing learned carries over.
                await wait_until_idle(server.url)
                async with SlogateFront(thresholds).in_front_of(server.url, state / "promise") as started:
                    run = await open_loop(started.url, settings.load * mu, settings.seconds, workload, seed=seed)
                    books = await started.books()
                row = run_row(name, seed, run, settings.slo_s, books)
                rows.append(row)
                console.print(
                    f"{name:<10} seed {seed}: {row['admitted_within_slo']}/{row['admitted']} admitted within "
                    f"{settings.slo_s:g} s ({row['requests']} sent)"
                )
    return {
        "environment": environment(),
        "profile": profile.id,
        "slo_s": settings.slo_s,
        "quantile": thresholds.ttft_quantile,
        "load": settings.load,
        "seconds": settings.seconds,
        "runs": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", type=Path, default=Path(".slogate"))
    parser.add_argument("--raw", type=Path, default=Path("docs/bench/promise.json"))
    args = parser.parse_args()
    console = Console(width=140)
    raw = asyncio.run(measure(DemoSettings(state_dir=args.state_dir), console))
    args.raw.parent.mkdir(parents=True, exist_ok=True)
    args.raw.write_text(json.dumps(raw, indent=2, default=str))
    predicted_against_actual(raw, args.raw.parent / "predicted-vs-actual.png")
    console.print(f"wrote {args.raw}; `python -m slogate_bench.reports.benchmarks` renders it into docs/benchmarks.md")


if __name__ == "__main__":
    main()
