"""`slogate demo`: overload llama-server with and without the gate, side by side.

Starts the bundled llama-server, calibrates it (or reuses the cached profile for its
fingerprint), derives thresholds for a 2 s TTFT SLO, then sends the same open-loop
burst (3x the capacity μ, clients giving up after 10 s) first straight at llama-server,
then through the sidecar (its own process, as in a pod), and prints what each delivered.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from rich.console import Console

from slogate_bench.runs.demo import DemoSettings, demo, table
from slogate_cli.arguments import STATE_DIR_HELP, CommandError, Subcommands, output_file, positive_float, state_dir
from slogate_cli.progress_bar import progress_hooks
from slogate_cli.up_command import say


def add_parser(subparsers: Subcommands) -> None:
    """Register `demo`."""
    parser = subparsers.add_parser("demo", help="overload llama-server with and without slogate", description=__doc__)
    parser.add_argument("--slo-ttft", type=positive_float, default=2.0, help="TTFT SLO, seconds")
    parser.add_argument("--load", type=positive_float, default=3.0, help="offered load, x the capacity μ")
    parser.add_argument("--seconds", type=positive_float, default=20.0, help="length of each burst")
    parser.add_argument("--state-dir", type=state_dir, default=Path(".slogate"), help=STATE_DIR_HELP)
    parser.add_argument("--plot", type=output_file, help="where to write the picture (default: STATE_DIR/demo.png)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def plot_path(args: argparse.Namespace) -> Path:
    """--plot, else demo.png in --state-dir (beside the profile cache and thresholds)."""
    path: Path = args.plot or args.state_dir / "demo.png"
    return path


def run(args: argparse.Namespace) -> int:
    """Run the demo, print the table, draw the picture; mistakes raise, for main's one line."""
    console = Console(width=max(Console().width, 140))
    settings = DemoSettings(args.state_dir, slo_s=args.slo_ttft, load=args.load, seconds=args.seconds)
    result = asyncio.run(demo(settings, say, lambda: progress_hooks(not args.no_progress)))
    console.print(table(result.runs, result.slo_s, result.rate_rps))
    # Imported here: matplotlib is for the demo and benchmarks, not for every `slogate` command.
    from slogate_bench.reports.figures import demo_plot  # noqa: PLC0415

    plot = plot_path(args)
    try:
        demo_plot(result.runs, result.slo_s, plot)
    except OSError as error:
        raise CommandError(f"cannot write the plot {plot}: {error.strerror}") from error
    console.print(f"plot: {plot}")
    return 0
