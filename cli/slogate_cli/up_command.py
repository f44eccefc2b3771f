"""`slogate up`: a local stack without Kubernetes.

Starts the bundled llama-server (or attaches to ``--upstream``), calibrates it unless
a profile with the same fingerprint is cached under ``--state-dir`` (default
``.slogate/``), derives thresholds for the SLO and prints them. Then it starts the
admission sidecar in front and serves until interrupted, or exits with ``--once``.
Its admin API takes threshold pushes only with ``--admin-token-file``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slogate_admission.derivation import derive_thresholds, reference_prompt_warnings
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_calibration.calibrate import DEFAULT_BUDGET_S, CalibrationSettings
from slogate_calibration.output import write_atomic
from slogate_calibration.profile_cache import cached_or_calibrated
from slogate_calibration.runtime import LlamaServer, locate
from slogate_cli.arguments import (
    STATE_DIR_HELP,
    Subcommands,
    check_ports_free,
    existing_file,
    http_url,
    port,
    positive_float,
    positive_int,
    shell_words,
    state_dir,
)
from slogate_cli.derive_command import add_policy_flags, build_policy
from slogate_cli.progress_bar import progress_hooks
from slogate_sidecar.admin import apply
from slogate_sidecar.app import build_sidecar, serve_until_drained
from slogate_sidecar.drain import Drain
from slogate_sidecar.settings import SidecarSettings

THREADS, PARALLEL, CTX = 2, 4, 8192
"""The bundled llama-server's settings: the configuration the project is calibrated for."""
HOST = "127.0.0.1"
"""The gate binds loopback only: `up` is a local stack."""


def add_parser(subparsers: Subcommands) -> None:
    """Register `up`."""
    parser = subparsers.add_parser("up", help="llama-server + calibration + thresholds, locally", description=__doc__)
    parser.add_argument("--upstream", type=http_url, help="attach to this llama-server instead of starting one")
    parser.add_argument("--server-args", type=shell_words, help="with --upstream: its arguments as one string")
    # Defaults applied in run(): given with --upstream they would be silently ignored.
    parser.add_argument("--threads", type=positive_int, help=f"llama-server threads (default: {THREADS})")
    parser.add_argument("--parallel", type=positive_int, help=f"llama-server slots (default: {PARALLEL})")
    parser.add_argument("--ctx", type=positive_int, help=f"llama-server total context (default: {CTX})")
    parser.add_argument("--state-dir", type=state_dir, default=Path(".slogate"), help=STATE_DIR_HELP)
    parser.add_argument("--budget-seconds", type=positive_float, default=DEFAULT_BUDGET_S, help="calibration budget")
    parser.add_argument("--once", action="store_true", help="print the thresholds and stop")
    parser.add_argument("--port", type=port, default=8081, help="the gate's client port")
    parser.add_argument("--admin-port", type=port, default=8082, help="the gate's admin and /metrics port")
    parser.add_argument(
        "--admin-token-file",
        type=existing_file,
        help="the gate's bearer token for PUT /slogate/v1/thresholds; without it every push gets 401",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_policy_flags(parser)
    parser.set_defaults(run=run)


@contextmanager
def llama_server(args: argparse.Namespace) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(base URL, server args) of the upstream: attached, or started and stopped here."""
    if args.upstream:
        yield args.upstream, args.server_args or ()
        return
    log = args.state_dir / "llama-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    server = LlamaServer(
        locate(),
        threads=args.threads or THREADS,
        parallel=args.parallel or PARALLEL,
        ctx=args.ctx or CTX,
        log_path=log,
    )
    server.start()
    try:
        yield server.url, server.args[1:]
    finally:
        server.stop()


def thresholds_table(profile: CalibrationProfile, t: Thresholds) -> Table:
    """The derived thresholds, readable."""
    table = Table(title=f"slogate thresholds for {t.model} {t.quantization} ({t.calibration_id})")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_column("from")
    decode = " / ".join(f"{p.tokens_per_second:.0f}" for p in profile.decode)
    table.add_row(
        "prefill rate",
        f"{t.prefill_tokens_per_second:.0f} tok/s",
        f"measured, at {t.reference_prompt_tokens}-token prompts",
    )
    table.add_row("decode per stream", f"{decode} tok/s", "measured at B = 1..slots")
    table.add_row(
        "concurrency cap",
        str(t.concurrency_cap),
        f"min(policy, slots, decode cap {t.decode_streams_cap})",
    )
    table.add_row("KV capacity", f"{t.kv_capacity_tokens} tokens", f"{t.kv_bytes_per_token:.0f} B/token")
    table.add_row(
        "μ",
        f"{t.throughput_rps:.2f} req/s",
        f"completions at the cap, {t.reference_prompt_tokens} tokens in, {t.reference_output_tokens} out",
    )
    for c in t.classes:
        table.add_row(
            f"class {c.name}",
            f"{c.token_budget:.0f} tokens",
            f"TTFT budget {c.ttft_budget_seconds:g} s (own SLO {c.ttft_slo_seconds:g} s), cap {c.concurrency_cap}",
        )
    cap_on_wait = "no cap" if t.max_wait_seconds is None else f"at most {t.max_wait_seconds:g} s"
    table.add_row(
        "deferral",
        "per request",
        f"waits for the slot it would get when that is expected within its SLO less its own prefill ({cap_on_wait})",
    )
    return table


def run(args: argparse.Namespace) -> int:
    """Bring the stack up; mistakes raise, for main's one line."""
    console = Console(stderr=True)
    # Everything the flags alone can refute, before llama-server starts and calibrates.
    check_flag_combinations(args)
    policy = build_policy(args)
    if not args.once:
        check_ports_free(HOST, {"--port": args.port, "--admin-port": args.admin_port})
    with llama_server(args) as (url, server_args):
        settings = CalibrationSettings(upstream=url, server_args=server_args, budget_s=args.budget_seconds)
        profile = asyncio.run(
            cached_or_calibrated(settings, args.state_dir, say, lambda: progress_hooks(not args.no_progress))
        )
        thresholds = derive_thresholds(policy, profile, derived_at=datetime.now(UTC))
        write_atomic(
            args.state_dir / "thresholds.json",
            thresholds.model_dump_json(by_alias=True, indent=2),
        )
        Console().print(thresholds_table(profile, thresholds))
        for warning in reference_prompt_warnings(thresholds):
            sys.stderr.write(f"slogate up: warning: {warning}\n")
        if not args.once:
            asyncio.run(serve_gate(url, thresholds, args, console))
    return 0


def say(line: str) -> None:
    """A line for people on stderr, as it is: scripts grep for it, and the terminal wraps it."""
    print(line, file=sys.stderr, flush=True)


def check_flag_combinations(args: argparse.Namespace) -> None:
    """Flags that would be silently ignored beside another one are refused instead."""
    if args.once and args.admin_token_file is not None:
        raise ValueError("--admin-token-file is for the gate `up` runs; --once runs none")
    if args.upstream:
        ignored = [flag for flag in ("--threads", "--parallel", "--ctx") if getattr(args, flag[2:]) is not None]
        if ignored:
            raise ValueError(f"{', '.join(ignored)}: for the llama-server `up` starts; not with --upstream")
    elif args.server_args is not None:
        raise ValueError(
            "--server-args describes an --upstream server; the one `up` starts takes --threads, --parallel, --ctx"
        )


async def serve_gate(upstream: str, thresholds: Thresholds, args: argparse.Namespace, console: Console) -> None:
    """The sidecar in front of the upstream until Ctrl-C (or SIGTERM): the first drains it (new
    requests get 429, admitted streams finish, at most the drain deadline), a second stops at once."""
    settings = SidecarSettings(
        upstream=upstream,
        host=HOST,
        port=args.port,
        admin_port=args.admin_port,
        admin_token_file=args.admin_token_file,
    )
    sidecar = build_sidecar(settings)
    apply(sidecar, thresholds)
    pushes = (
        f"threshold pushes with the bearer token in {args.admin_token_file}"
        if args.admin_token_file is not None
        else "threshold pushes refused (401) without --admin-token-file"
    )

    def started(port: int, admin_port: int) -> None:
        console.print(
            f"slogate gate at http://127.0.0.1:{port} (OpenAI API, /completion) in front of llama-server "
            f"at {upstream}; admin and /metrics at http://127.0.0.1:{admin_port} ({pushes}); Ctrl-C stops"
        )

    def draining(drain: Drain) -> None:
        streams = sidecar.gate.ledger.streams
        say(
            f"slogate up: stopping: new requests get 429, {streams} admitted stream(s) may finish "
            f"(at most {drain.deadline_s:g} s); Ctrl-C again stops at once"
        )

    try:
        await serve_until_drained(sidecar, started, draining)
    except asyncio.CancelledError:  # the second Ctrl-C
        say("slogate up: stopped at once")
