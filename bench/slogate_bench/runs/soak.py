"""`make soak`: ten minutes at three times the calibrated capacity, through a real sidecar process.

Starts the bundled llama-server, calibrates it (or reuses the profile `slogate up` and
`slogate demo` cache under ``.slogate/profiles/`` for its fingerprint), derives
thresholds for a 2 s TTFT SLO, starts ``slogate sidecar`` as its own process in front,
and sends open-loop Poisson traffic at 3x the derived capacity (200-token prompts, 32
tokens out, clients giving up after 10 s) for ten minutes. It samples the sidecar's
resident memory every few seconds and, at the end, reads its books and metrics.

What must hold (exit status 1 otherwise):

* RSS after the warm-up (two minutes) grows by at most 10% over its value then;
* no 5xx and no mid-stream error event made by the sidecar, and no upstream error counted;
* every live counter is zero once the last client is done (nothing leaked);
* goodput is steady: every full minute after the warm-up within 30% of their median.

The figures (per minute: offered, completed within the SLO, rejected, timed out,
goodput, TTFT quantiles, RSS) go to ``docs/reliability-soak.json`` and to the marked
block of ``docs/reliability.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_bench.live.fronts import SlogateFront
from slogate_bench.live.gate_process import GateProcess
from slogate_bench.live.load import run_arrivals
from slogate_bench.published import replace_block
from slogate_bench.results import Result, Run
from slogate_calibration.calibrate import CalibrationSettings
from slogate_calibration.output import write_atomic
from slogate_calibration.profile_cache import cached_or_calibrated
from slogate_calibration.runtime import LlamaServer, locate
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.workloads import Arrival, preset, schedule

DOC_BEGIN = "<!-- soak:begin (written by `make soak`) -->"
DOC_END = "<!-- soak:end -->"


@dataclass(frozen=True)
class SoakSettings:
    """One soak run."""

    minutes: int = 10
    """Length of the load, warm-up included."""
    warmup_minutes: int = 2
    """RSS and goodput are judged after this: caches, pools and learners fill up first."""
    load: float = 3.0
    """Offered load, x the calibrated capacity for the workload."""
    slo_s: float = 2.0
    """TTFT SLO the thresholds are derived for; goodput counts requests within it."""
    client_timeout_s: float = 10.0
    """Clients give up (disconnect) after this long."""
    rss_every_s: float = 5.0
    """How often the sidecar's resident memory is read."""
    max_rss_growth: float = 0.10
    goodput_band: float = 0.30
    state_dir: Path = Path(".slogate")
    out_json: Path = Path("docs/reliability-soak.json")
    doc: Path = Path("docs/reliability.md")
    seed: int = 11


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def sample_rss(pid: int, every_s: float, samples: list[tuple[float, int]]) -> None:
    """Append (seconds since start, RSS bytes) until cancelled."""
    started = time.monotonic()
    while True:
        samples.append((time.monotonic() - started, rss_bytes(pid)))
        await asyncio.sleep(every_s)


async def books_after(gate: GateProcess, limit_s: float = 60.0) -> tuple[dict[str, int], str]:
    """The live counters once the last handler has ended (bounded wait), and the metrics text."""
    live: dict[str, int] = {}
    for _ in range(int(limit_s / 0.5)):
        live = (await gate.state())["live"]
        if not any(live.values()):
            break
        await asyncio.sleep(0.5)
    return live, await gate.metrics()


def series(metrics: str, prefix: str) -> float:
    """Sum of every exported sample whose name (and labels) start with ``prefix``."""
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(prefix))


def sidecar_failures(results: Sequence[Result]) -> int:
    """Answers the sidecar made that it must never make here: any 5xx (502, 503, 504), or a
    stream it ended with an error event (a 200 whose outcome is an error)."""
    return sum(1 for r in results if r.status >= 500 or (r.outcome == "error" and r.status == 200))


def per_minute(
    arrivals: Sequence[Arrival], results: Sequence[Result], settings: SoakSettings, rss: Sequence[tuple[float, int]]
) -> list[dict[str, Any]]:
    """The run cut into minutes of arrival time."""
    minutes: list[dict[str, Any]] = []
    for m in range(settings.minutes):
        inside = [r for a, r in zip(arrivals, results, strict=True) if m * 60 <= a.at_s < (m + 1) * 60]
        run = Run(60.0, inside)
        memory = [b for t, b in rss if m * 60 <= t < (m + 1) * 60]
        minutes.append(
            {
                "minute": m + 1,
                "warmup": m < settings.warmup_minutes,
                "offered": len(inside),
                "withinSlo": len(run.within(settings.slo_s)),
                "completed": run.count("ok"),
                "rejected": sum(1 for r in inside if r.status == 429),
                "refused": run.count("refused"),
                "errors": run.count("error"),
                "timedOut": run.count("timeout"),
                "sidecarFailures": sidecar_failures(inside),
                "goodputRps": round(run.goodput(settings.slo_s), 3),
                "ttftP50S": run.ttft_quantile(0.5),
                "ttftP99S": run.ttft_quantile(0.99),
                "rssMiB": round(max(memory) / 2**20, 1) if memory else None,
            }
        )
    return minutes


def judge(figures: dict[str, Any], settings: SoakSettings) -> dict[str, bool]:
    """Each criterion of the module docstring, met or not."""
    steady = [m["goodputRps"] for m in figures["perMinute"] if not m["warmup"]]
    median = statistics.median(steady)
    return {
        "rssGrowthWithinLimit": figures["rss"]["growthAfterWarmup"] <= settings.max_rss_growth,
        "noSidecarFailures": figures["sidecarFailures"] == 0 and figures["upstreamErrors"] == 0,
        "noLeakedCounters": not any(figures["countersAfter"].values()),
        "goodputSteady": median > 0 and all(abs(g - median) <= settings.goodput_band * median for g in steady),
    }


async def soak(settings: SoakSettings) -> dict[str, Any]:
    """Run it; return the figures."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with LlamaServer(locate(), log_path=settings.state_dir / "soak-llama-server.log") as server:
        calibration = CalibrationSettings(upstream=server.url, server_args=server.args[1:], budget_s=300.0)
        profile = await cached_or_calibrated(calibration, settings.state_dir, lambda line: print(line, flush=True))
        policy = Policy.model_validate({"slo": {"ttftSeconds": settings.slo_s}, "deferral": {"maxWaitSeconds": 0.5}})
        front = SlogateFront(derive_thresholds(policy, profile, derived_at=datetime.now(UTC)), admin_token=True)
        workload = dataclasses.replace(preset("uniform"), name="soak", client_timeout_s=settings.client_timeout_s)
        mu = capacity_rps(ServerModel.from_profile(profile), workload, front.thresholds.concurrency_cap)
        rate = settings.load * mu
        duration = settings.minutes * 60.0
        arrivals = schedule(rate, duration, workload, seed=settings.seed)
        print(
            f"capacity {mu:.2f} req/s (calibration {profile.id}); offering {rate:.2f} req/s for "
            f"{settings.minutes} min: {len(arrivals)} requests",
            flush=True,
        )
        async with front.in_front_of(server.url, settings.state_dir / "soak") as gate:
            rss: list[tuple[float, int]] = []
            sampler = asyncio.create_task(sample_rss(gate.pid, settings.rss_every_s, rss))
            cpu_before = cpu_seconds(gate.pid)
            run = await run_arrivals(
                gate.url, arrivals, duration, seed=settings.seed, timeout_s=workload.client_timeout_s
            )
            sampler.cancel()
            live, metrics = await books_after(gate)
            cpu = cpu_seconds(gate.pid) - cpu_before
    after_warmup = [b for t, b in rss if t >= settings.warmup_minutes * 60]
    baseline = after_warmup[0] if after_warmup else rss[-1][1]
    return {
        "measuredAt": datetime.now(UTC).isoformat(timespec="seconds"),
        "calibrationId": profile.id,
        "capacityRps": round(mu, 3),
        "offeredRps": round(rate, 3),
        "load": settings.load,
        "sloSeconds": settings.slo_s,
        "minutes": settings.minutes,
        "warmupMinutes": settings.warmup_minutes,
        "requests": len(run.results),
        "summary": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in run.summary(settings.slo_s).items()},
        "sidecarFailures": sidecar_failures(run.results),
        "upstreamErrors": series(metrics, "slogate_upstream_errors_total{"),
        "clientDisconnects": series(metrics, "slogate_client_disconnects_total "),
        "countersAfter": live,
        "sidecarCpuSeconds": round(cpu, 1),
        "rss": {
            "startMiB": round(rss[0][1] / 2**20, 1),
            "afterWarmupMiB": round(baseline / 2**20, 1),
            "maxAfterWarmupMiB": round(max(after_warmup or [baseline]) / 2**20, 1),
            "endMiB": round(rss[-1][1] / 2**20, 1),
            "growthAfterWarmup": round(max(after_warmup or [baseline]) / baseline - 1, 4),
            "samples": len(rss),
        },
        "perMinute": per_minute(arrivals, run.results, settings, rss),
    }


def markdown(figures: dict[str, Any], verdict: dict[str, bool]) -> str:
    """The block written into docs/reliability.md."""
    rss, s, f = figures["rss"], figures["summary"], figures
    lines = [
        DOC_BEGIN,
        f"Last run {f['measuredAt']} (calibration `{f['calibrationId']}`): {f['offeredRps']:.2f} req/s offered, "
        f"{f['load']:g}x the capacity of {f['capacityRps']:.2f} req/s, for {f['minutes']} min ({f['requests']} "
        f"requests; {s['within_slo']} within the {f['sloSeconds']:g} s SLO, {s['ok'] - s['within_slo']} served "
        f"late, {s['rejected']} rejected, {s['refused']} refused, {s['timeout']} timed out, {s['error']} errors). "
        f"Sidecar 5xx and error events: {f['sidecarFailures']}; "
        f"upstream errors counted: {f['upstreamErrors']:g}; client disconnects: {f['clientDisconnects']:g}; "
        f"counters after: {json.dumps(f['countersAfter'])}. Sidecar RSS {rss['startMiB']} MiB at start, "
        f"{rss['afterWarmupMiB']} MiB after the warm-up, at most {rss['maxAfterWarmupMiB']} MiB after it (growth "
        f"{rss['growthAfterWarmup']:.1%}), {rss['endMiB']} MiB at the end; sidecar CPU {f['sidecarCpuSeconds']} s.",
        "",
        "Verdict: " + ", ".join(f"{name} {'yes' if ok else '**NO**'}" for name, ok in verdict.items()) + ".",
        "",
        "Each minute's offered requests = within SLO + served late + rejected + refused + timed out + errors.",
        "",
        "| minute | offered | within SLO | served late | rejected | refused | timed out | errors | sidecar 5xx "
        "| goodput (req/s) | p50 TTFT (s) | p99 TTFT (s) | RSS (MiB) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    # Runs recorded before refusals and errors were counted per minute had none at all.
    none_at_all = s["refused"] == 0 and s["error"] == 0

    def q(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for m in figures["perMinute"]:
        label = f"{m['minute']}{' (warm-up)' if m['warmup'] else ''}"
        refused, errors = (m.get("refused"), m.get("errors")) if "refused" in m or not none_at_all else (0, 0)
        lines.append(
            f"| {label} | {m['offered']} | {m['withinSlo']} | {m['completed'] - m['withinSlo']} | "
            f"{m['rejected']} | {refused} | {m['timedOut']} | {errors} | {m['sidecarFailures']} | "
            f"{m['goodputRps']:.2f} | {q(m['ttftP50S'])} | {q(m['ttftP99S'])} | {m['rssMiB']} |"
        )
    lines.append(DOC_END)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slogate_bench.runs.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=int, default=SoakSettings.minutes)
    parser.add_argument("--warmup-minutes", type=int, default=SoakSettings.warmup_minutes)
    parser.add_argument("--load", type=float, default=SoakSettings.load)
    parser.add_argument("--out", type=Path, default=SoakSettings.out_json)
    parser.add_argument("--doc", type=Path, default=SoakSettings.doc)
    parser.add_argument("--render", action="store_true", help="only re-render the doc's block from --out")
    args = parser.parse_args(argv)
    if args.render:
        figures = json.loads(args.out.read_text())
        replace_block(args.doc, DOC_BEGIN, DOC_END, markdown(figures, figures["verdict"]))
        return 0
    if not 0 < args.warmup_minutes < args.minutes:
        parser.error("the warm-up must be shorter than the run, and at least a minute")
    settings = SoakSettings(
        minutes=args.minutes, warmup_minutes=args.warmup_minutes, load=args.load, out_json=args.out, doc=args.doc
    )
    figures = asyncio.run(soak(settings))
    verdict = judge(figures, settings)
    figures["verdict"] = verdict
    write_atomic(settings.out_json, json.dumps(figures, indent=2) + "\n")
    block = markdown(figures, verdict)
    replace_block(settings.doc, DOC_BEGIN, DOC_END, block)
    print(block)
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
