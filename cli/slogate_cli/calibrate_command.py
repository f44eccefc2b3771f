"""`slogate calibrate`: measure a live llama-server, write its CalibrationProfile.

Outputs: ``--out FILE`` (full JSON, written atomically), one compact JSON line on
stdout, ``--termination-message-path`` (the compact form, under 4 KiB) for a
Kubernetes Job, and one line on stderr for people: what was measured and how well
(the profile's stated confidence). Exit codes: 0 done; 2 bad input or upstream
unusable (unreachable, not llama-server, busy); 3 the budget ran out (the message
names the stage). No file is written unless the run completes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from slogate_calibration.calibrate import DEFAULT_BUDGET_S, BudgetExceededError, CalibrationSettings, calibrate
from slogate_calibration.output import compact_json, full_json, summary_line, write_atomic
from slogate_cli.arguments import (
    CommandError,
    Subcommands,
    existing_file,
    http_url,
    non_negative_float,
    output_file,
    positive_float,
    shell_words,
)
from slogate_cli.progress_bar import progress_hooks

EXIT_BUDGET = 3
"""The budget ran out (the Job's message names the stage); every other failure exits 2."""


def add_parser(subparsers: Subcommands) -> None:
    """Register `calibrate`."""
    parser = subparsers.add_parser("calibrate", help="measure a live llama-server", description=__doc__)
    parser.add_argument(
        "--upstream", type=http_url, required=True, help="llama-server base URL, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument("--model", type=existing_file, help="the GGUF it serves (default: the path /props reports)")
    parser.add_argument("--out", type=output_file, help="write the full profile JSON here (atomically)")
    parser.add_argument("--termination-message-path", type=output_file, help="write the compact profile here")
    parser.add_argument("--budget-seconds", type=positive_float, default=DEFAULT_BUDGET_S, help="stop after this long")
    parser.add_argument(
        "--server-args",
        type=shell_words,
        default="",
        help="the server's arguments as one string (threads, batch, cache types: not in /props)",
    )
    parser.add_argument(
        "--wait-seconds",
        type=non_negative_float,
        default=0.0,
        help="first wait up to this long for the server's /health (a model still loading; not in the budget)",
    )
    parser.add_argument("--force", action="store_true", help="measure even if the server is busy")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Calibrate, then write the outputs; failures raise, for main's one line (exit 3: the budget)."""
    settings = CalibrationSettings(
        upstream=args.upstream,
        model_path=args.model,
        server_args=args.server_args,
        budget_s=args.budget_seconds,
        force=args.force,
        wait_s=args.wait_seconds,
    )
    try:
        with progress_hooks(not args.no_progress) as hooks:
            profile = asyncio.run(calibrate(settings, hooks))
    except BudgetExceededError as error:
        raise CommandError(str(error), EXIT_BUDGET) from error
    compact = compact_json(profile)
    try:
        if args.out is not None:
            write_atomic(args.out, full_json(profile))
        if args.termination_message_path is not None:
            # Written in place, not renamed over: the kubelet bind-mounts /dev/termination-log,
            # and rename(2) onto a mount point fails with EBUSY.
            args.termination_message_path.write_text(compact)
    except OSError as error:  # checked at parse time; the file system can still refuse
        raise CommandError(f"cannot write {error.filename}: {error.strerror}") from error
    sys.stdout.write(compact + "\n")
    sys.stderr.write(f"slogate calibrate: {summary_line(profile)}\n")
    return 0
