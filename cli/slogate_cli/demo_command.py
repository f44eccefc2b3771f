"""`slogate demo`: overload llama-server with and without the gate, side by side.

Starts the bundled llama-server, calibrates it (or reuses the cached profile for its
fingerprint), derives thresholds for a 2 s TTFT SLO, starts the sidecar in front,
then sends the same open-loop burst (3x the derived capacity, clients giving up
after 10 s) first straight at llama-server, then through the gate, and prints what
each delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from slogate_admission.derivation import decode_curve, derive_thresholds, prefill_curve
from slogate_admission.schema import Policy, Thresholds
from slogate_admission.service import server_seconds_per_request
from slogate_bench.load import Run, open_loop
from slogate_bench.workloads import Workload
from slogate_calibration.calibrate import CalibrationError, CalibrationSettings
from slogate_calibration.output import write_atomic
from slogate_calibration.prometheus_text import LlamaCounters
from slogate_calibration.runtime import LlamaServer, LlamaServerError, RuntimeNotFound, locate
from slogate_cli.arguments import STATE_DIR_HELP, Subcommands, output_file, positive_float, state_dir
from slogate_cli.up_command import cached_or_fresh_profile
from slogate_sidecar.app import gate_in_front_of

PROMPT_TOKENS = 200
MAX_TOKENS = 32


def add_parser(subparsers: Subcommands) -> None:
    """Register `demo`."""
    parser = subparsers.add_parser("demo", help="overload llama-server with and without slogate", description=__doc__)
    parser.add_argument("--slo-ttft", type=positive_float, default=2.0, help="TTFT SLO, seconds")
    parser.add_argument("--load", type=positive_float, default=3.0, help="offered load, x the derived capacity")
    parser.add_argument("--seconds", type=positive_float, default=20.0, help="length of each burst")
    parser.add_argument("--state-dir", type=state_dir, default=Path(".slogate"), help=STATE_DIR_HELP)
    parser.add_argument("--plot", type=output_file, help="where to write the picture (default: STATE_DIR/demo.png)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def plot_path(args: argparse.Namespace) -> Path:
    """--plot, else demo.png in --state-dir (beside the profile cache and thresholds)."""
    path: Path = args.plot or args.state_dir / "demo.png"
    return path


def outcome_counts(run: Run, slo_s: float) -> dict[str, int]:
    """What became of every request sent, by column: all but `sent` add up to `sent`."""
    within = len(run.within(slo_s))
    return {
        "sent": len(run.results),
        "within SLO": within,
        "served late": run.count("ok") - within,
        "rejected": run.count("rejected"),
        "refused": run.count("refused"),
        "timed out": run.count("timeout"),
        "errors": run.count("error"),
    }


def table(runs: dict[str, Run], slo: float, rate: float) -> Table:
    """The side-by-side summary: every request sent in one outcome column, then latency and goodput."""
    t = Table(title=f"{rate:.2f} req/s offered for {next(iter(runs.values())).duration_s:g} s, TTFT SLO {slo:g} s")
    counts = {name: outcome_counts(r, slo) for name, r in runs.items()}
    for column in ("", *next(iter(counts.values())), "p50 TTFT", "p99 TTFT", "goodput"):
        t.add_column(column, justify="right" if column else "left")
    for name, r in runs.items():
        quantiles = [f"{v:.2f} s" if v is not None else "-" for v in (r.ttft_quantile(0.5), r.ttft_quantile(0.99))]
        t.add_row(name, *(str(n) for n in counts[name].values()), *quantiles, f"{r.goodput(slo):.2f} req/s")
    return t


async def wait_until_idle(upstream: str, limit_s: float = 300.0) -> None:
    """Poll llama-server's counters until nothing is processing or deferred."""
    async with aiohttp.ClientSession() as session:
        for _ in range(int(limit_s / 0.5)):
            async with session.get(upstream + "/metrics") as response:
                counters = LlamaCounters.from_text(await response.text())
            if counters.requests_processing == 0 and counters.requests_deferred == 0:
                return
            await asyncio.sleep(0.5)


async def bursts(upstream: str, thresholds: Thresholds, rate: float, seconds: float) -> dict[str, Run]:
    """The same burst, direct then gated (sequentially: one llama-server, no interference)."""
    workload = Workload(prompt_tokens=lambda _rng: PROMPT_TOKENS, max_tokens=lambda _rng: MAX_TOKENS)
    direct = await open_loop(upstream, rate, seconds, workload, seed=7)
    # llama-server keeps working through requests whose clients gave up (that is the
    # collapse): wait until it is idle so the gated run starts from the same state.
    await wait_until_idle(upstream)
    async with gate_in_front_of(upstream, thresholds) as (_sidecar, gate_url):
        gated = await open_loop(gate_url, rate, seconds, workload, seed=7)
    return {"llama-server alone": direct, "through slogate": gated}


def run(args: argparse.Namespace) -> int:
    """Run the demo; one-line errors."""
    console = Console(width=max(Console().width, 140))
    args.upstream, args.once, args.budget_seconds = None, True, 180.0
    try:
        log = args.state_dir / "llama-server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with LlamaServer(locate(), log_path=log) as server:
            settings = CalibrationSettings(
                upstream=server.url, server_args=server.args[1:], budget_s=args.budget_seconds
            )
            profile = cached_or_fresh_profile(args, settings, Console(stderr=True))
            policy = Policy.model_validate({"slo": {"ttftSeconds": args.slo_ttft}, "deferral": {"maxWaitSeconds": 0.5}})
            thresholds = derive_thresholds(policy, profile, derived_at=datetime.now(UTC))
            write_atomic(
                args.state_dir / "thresholds.json",
                thresholds.model_dump_json(by_alias=True, indent=2),
            )
            mu = 1 / server_seconds_per_request(
                prefill_curve(profile),
                decode_curve(profile),
                PROMPT_TOKENS,
                MAX_TOKENS,
                thresholds.concurrency_cap,
            )
            rate = args.load * mu
            console.print(f"capacity for {PROMPT_TOKENS}-token prompts, {MAX_TOKENS} tokens out: {mu:.2f} req/s "
                          f"(calibration {profile.id}); offering {args.load:g}x")  # fmt: skip
            runs = asyncio.run(bursts(server.url, thresholds, rate, args.seconds))
    except (CalibrationError, LlamaServerError, RuntimeNotFound, ValueError) as error:
        sys.stderr.write(f"slogate demo: error: {error}\n")
        return 2
    except OSError as error:  # the state dir, checked at parse time, refused a write after all
        sys.stderr.write(f"slogate demo: error: {error.strerror or error}\n")
        return 2
    console.print(table(runs, args.slo_ttft, rate))
    # Imported here: matplotlib is for the demo and benchmarks, not for every `slogate` command.
    from slogate_bench.figures import demo_plot  # noqa: PLC0415

    plot = plot_path(args)
    try:
        demo_plot(runs, args.slo_ttft, plot)
    except OSError as error:
        sys.stderr.write(f"slogate demo: error: cannot write the plot {plot}: {error.strerror}\n")
        return 2
    console.print(f"plot: {plot}")
    return 0
