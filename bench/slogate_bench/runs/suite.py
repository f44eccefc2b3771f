"""The benchmark suite: four ways to front llama-server, four loads, two mixes, one report.

Scenarios, side by side on the same llama-server build, model and workload:
direct (llama-server alone), count-cap (fixed concurrency + queue, 503 when full),
rate-limit (static token bucket at the calibrated capacity), slogate. Offered loads are
multiples of μ, the calibrated capacity for the workload. Every run starts from a fresh
llama-server: an ungated overload leaves minutes of abandoned work queued inside it,
and each scenario must start from the same state.

Every point runs on several independent arrival schedules (``seeds``), the same schedules
for every front, so the report gives means with 95% intervals (``intervals``) and scores
each front against the clairvoyant bound of the very traces it was sent (``clairvoyant``).

Profiles: ``full`` (make bench-full, about an hour here) writes docs/benchmarks.md and
docs/bench/*.png; ``quick`` (make bench, about 15 minutes) runs every point once, shorter,
into .slogate/bench-quick/, to see a machine's numbers without publishing them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import Progress

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_bench.live.fronts import DirectFront, Front, SlogateFront, line_up
from slogate_bench.live.load import one_request, open_loop
from slogate_bench.live.retries import NO_RETRY, RetryKind, RetryPolicy
from slogate_bench.published import environment
from slogate_bench.reports.benchmarks import write_report
from slogate_bench.results import Run
from slogate_calibration.calibrate import CalibrationSettings
from slogate_calibration.output import full_json, write_atomic
from slogate_calibration.profile_cache import cached_or_calibrated
from slogate_calibration.runtime import LlamaServer, locate
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.workloads import Workload, preset

LOADS = (0.5, 1.0, 2.0, 4.0)
WORKLOADS = ("chat", "heavy_tail")
RETRY_KINDS: tuple[RetryKind, ...] = ("immediate", "backoff", "budget")
SLO_S = 2.0
LLAMA_NICENESS = 10
"""llama-server runs at nice 10 in every scenario: on 2 cores its two inference threads
would otherwise starve the front and the load generator, whose latencies we measure (in a
pod, the sidecar's CPU request does this). Alone, it still gets all the CPU."""


@dataclass(frozen=True)
class BenchProfile:
    """How much of the suite to run, and where it goes."""

    name: str
    seeds: tuple[int, ...]
    """Independent arrival schedules per point (the same ones for every front)."""
    seconds: float
    """Each run's arrival window."""
    out: Path
    """The report; its plots and raw results go to ``out.parent / "bench"``."""


PROFILES = {
    "full": BenchProfile("full", (1, 2, 3, 4), 20.0, Path("docs/benchmarks.md")),
    "quick": BenchProfile("quick", (1,), 15.0, Path(".slogate/bench-quick/benchmarks.md")),
}


def schedule_seed(seed: int, load: float) -> int:
    """The load generator's seed of one point's ``seed``-th schedule: independent per load and
    seed, the same for every front and both mixes."""
    return 1000 * seed + int(load * 100)


@dataclass
class Measured:
    """One run's result, with what the front itself saw (its books: slogate's state and deferrals)."""

    scenario: str
    """The front's name."""
    load: float
    """Offered load, x μ of the workload."""
    workload: str
    """The workload's name."""
    retry: str
    """The clients' retry policy."""
    seed: int
    """Which of the point's schedules (``schedule_seed`` gives the generator's seed)."""
    rate_rps: float
    """The offered λ: ``load`` x μ of the workload."""
    run: Run
    """What the clients saw."""
    gate_state: dict[str, Any] | None = None
    """The front's books at the end (None: it keeps none)."""

    def row(self) -> dict[str, Any]:
        results = self.run.results
        return {
            "scenario": self.scenario,
            "load": self.load,
            "workload": self.workload,
            "retry": self.retry,
            "seed": self.seed,
            "schedule_seed": schedule_seed(self.seed, self.load),
            "rate_rps": self.rate_rps,
            **self.run.summary(SLO_S),
            "gate": self.gate_state,
            "ttfts": sorted(r.ttft_s for r in results if r.outcome == "ok" and r.ttft_s is not None),
            "rejection_latencies": sorted(s for r in results for s in r.rejection_latencies_s),
            "predicted_actual": [
                (r.predicted_ttft_s, r.ttft_s)
                for r in results
                if r.predicted_ttft_s is not None and r.ttft_s is not None
            ],
        }


@dataclass(frozen=True)
class Bench:
    """What every run of one suite shares."""

    server: ServerModel
    """The calibrated server: μ of each workload is computed on it."""
    streams: int
    """The concurrency cap μ is taken at (the thresholds')."""
    seconds: float
    """Each run's arrival window."""
    log_dir: Path
    """llama-server's and the fronts' logs and files."""
    progress: Progress
    """One line per run."""

    def mu(self, workload: Workload) -> float:
        """Capacity μ of ``workload`` (``capacity``): offered loads are multiples of it."""
        return capacity_rps(self.server, workload, self.streams)


async def one_run(
    bench: Bench, front: Front, load: float, workload: Workload, retry: RetryPolicy, *, seed: int = 1
) -> Measured:
    """A fresh llama-server, ``front`` in front, one open-loop run at ``load`` x μ of ``workload``
    on the point's ``seed``-th arrival schedule."""
    progress = bench.progress
    task = progress.add_task(f"{front.name:<10} {load:>3g}x {workload.name} {retry.kind} #{seed}", total=None)
    log = bench.log_dir / f"{front.name}-{load}-{workload.name}-{retry.kind}-{seed}.log"
    rate = load * bench.mu(workload)
    with LlamaServer(locate(), log_path=log, niceness=LLAMA_NICENESS) as server:
        async with front.in_front_of(server.url, bench.log_dir) as started:
            run = await open_loop(
                started.url,
                rate,
                bench.seconds,
                workload,
                seed=schedule_seed(seed, load),
                retry=retry,
                progress=lambda _r: progress.advance(task),
            )
            books = await started.books()
    progress.update(task, completed=len(run.results), total=len(run.results))
    return Measured(front.name, load, workload.name, retry.kind, seed, rate, run, books)


async def paired_overhead(thresholds: Thresholds, log_dir: Path, pairs: int = 30) -> dict[str, float]:
    """The gate's cost on an idle server: the same request direct and through the gate, in turn.

    One request at a time (no queue), the order alternating within each pair, so drift in
    the machine's speed hits both sides alike; distinct prompts, so no cache helps.
    """
    fronts: tuple[Front, Front] = (DirectFront(), SlogateFront(thresholds))
    ttfts: dict[str, list[float]] = {front.name: [] for front in fronts}
    with LlamaServer(locate(), log_path=log_dir / "paired-overhead.log", niceness=LLAMA_NICENESS) as server:
        async with (
            fronts[0].in_front_of(server.url, log_dir) as first,
            fronts[1].in_front_of(server.url, log_dir) as second,
        ):
            order = [(fronts[0].name, first.url), (fronts[1].name, second.url)]
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                for i in range(pairs):
                    for side, (name, url) in enumerate(order if i % 2 == 0 else order[::-1]):
                        start = 1000 + 400 * (2 * i + side)
                        prompt = list(range(start, start + 100))
                        result = await one_request(session, url, prompt, max_tokens=8, class_name=None, timeout_s=10.0)
                        if result.ttft_s is not None:
                            ttfts[name].append(result.ttft_s)
    direct, gated = (statistics.median(ttfts[front.name]) for front in fronts)
    return {"pairs": pairs, "direct_ttft_p50_s": direct, "slogate_ttft_p50_s": gated, "ratio": gated / direct}


async def bench_profile(state_dir: Path, console: Console) -> CalibrationProfile:
    """The cached profile of the bundled server (as the benchmarks start it), else a fresh calibration."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with LlamaServer(locate(), log_path=state_dir / "bench-calibration.log") as server:
        settings = CalibrationSettings(upstream=server.url, server_args=server.args[1:], budget_s=300)
        return await cached_or_calibrated(settings, state_dir, console.print)


async def suite(
    profile_of_runs: BenchProfile, state_dir: Path, console: Console
) -> tuple[CalibrationProfile, Thresholds, list[Measured], dict[str, float]]:
    """Every run of the report."""
    profile = await bench_profile(state_dir, console)
    policy = Policy.model_validate({"slo": {"ttftSeconds": SLO_S}, "deferral": {"maxWaitSeconds": 0.5}})
    thresholds = derive_thresholds(policy, profile, derived_at=datetime.now(UTC))
    results = []
    log_dir = state_dir / "bench-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    console.print("overhead: the same requests direct and through the gate, in turn, on an idle server")
    paired = await paired_overhead(thresholds, log_dir)
    with Progress(console=console, transient=False) as progress:
        seconds = profile_of_runs.seconds
        bench = Bench(ServerModel.from_profile(profile), thresholds.concurrency_cap, seconds, log_dir, progress)
        plan: list[tuple[Front, float, Workload, RetryPolicy, int]] = []
        # Seeds outermost: a stopped run still leaves whole schedules, every front on each.
        for seed in profile_of_runs.seeds:
            for workload in map(preset, WORKLOADS):
                # The count cap and the rate limit are tuned on μ of the workload they carry.
                fronts = line_up(thresholds, bench.mu(workload), SLO_S)
                plan += [(front, load, workload, NO_RETRY, seed) for load in LOADS for front in fronts.each()]
            chat = line_up(thresholds, bench.mu(preset("chat")), SLO_S)
            plan += [(chat.slogate, 2.0, preset("chat"), RetryPolicy(kind), seed) for kind in RETRY_KINDS]
        for front, load, workload, retry, seed in plan:
            results.append(await one_run(bench, front, load, workload, retry, seed=seed))
    return profile, thresholds, results, paired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full", help="how much to run (see above)")
    parser.add_argument("--state-dir", type=Path, default=Path(".slogate"))
    args = parser.parse_args()
    console = Console(width=140)
    chosen = PROFILES[args.profile]
    started = time.monotonic()
    profile, thresholds, results, paired = asyncio.run(suite(chosen, args.state_dir, console))
    out_dir = chosen.out.parent / "bench"
    raw_file = out_dir / "results.json"
    overhead_file = out_dir / "overhead.json"  # `make bench` measures it first
    raw = {
        "environment": environment(),
        "profile": profile.id,
        "bench_profile": chosen.name,
        "seeds": list(chosen.seeds),
        "duration_min": round((time.monotonic() - started) / 60, 1),
        "slo_s": SLO_S,
        "seconds": chosen.seconds,
        "llama_niceness": LLAMA_NICENESS,
        "overhead": json.loads(overhead_file.read_text()) if overhead_file.exists() else {},
        "paired_overhead": paired,
        "runs": [m.row() for m in results],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_file.write_text(json.dumps(raw, indent=2, default=str))
    # The profile beside the results: `python -m slogate_bench.reports.benchmarks --profile` re-renders from both.
    write_atomic(out_dir / "profile.json", full_json(profile))
    readme = Path("README.md") if chosen.name == "full" else None  # only published runs are quoted
    write_report(raw, profile, thresholds, chosen.out, out_dir, readme=readme)
    console.print(f"wrote {chosen.out} and plots under {out_dir}")


if __name__ == "__main__":
    main()
