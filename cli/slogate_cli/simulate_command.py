"""`slogate simulate`: preview a policy on a calibrated server before deploying it.

A discrete-event simulation of llama-server (its slots, its own queue, prefill and
decode sharing the cores, clients that give up) in which every arrival is judged by
the same predicate the sidecar runs. ``--load`` is a multiple of the capacity μ for the
simulated requests (``2x`` or ``2``; several with commas, e.g. ``0.5x,1x,2x,4x``; μ as
docs/benchmarks.md defines it); ``--gate`` picks what stands in front: ``direct``
(llama-server alone), ``slogate``, or ``count-cap`` (a fixed concurrency and queue),
several with commas. Token lengths are ``chat`` (the default: the benchmark's chat mix,
prompts lognormal around 100 tokens up to 1,000, max_tokens from 32, 64, 128), ``N`` or
``LOW-HIGH`` (uniform). ``--service exponential`` replaces each request with Exp(slots/μ)
seconds of work on one of ``--slots`` parallel slots (default 1: the M/M/1 check; with a
count cap of C ≤ slots and ``--count-cap-queue 0``, a loss system, reported beside Erlang
B's blocking). ``--replicas N`` simulates N pods, each its own server and gate, behind a
balancer: ``--routing`` ``random`` (a Kubernetes Service), ``round-robin``,
``least-requests``, ``retry-429[:TRIES]`` (random, and a pod's refusal sent on to another
pod, up to TRIES in all, 3 by default) or ``least-pressure`` (each request to the least
pressed pod's gate: a balancer that reads every gate; a reference, not a bound), several with
commas; ``--load`` is then a multiple of the fleet's capacity, N·μ. Every gate and routing sees
the very same arrivals for a given ``--seed``.
The SLO flags and ``--policy FILE`` (the AdmissionPolicy you apply) are those of `slogate derive`: a
class's ttft in ``--classes`` is its TTFT SLO, ``--slo-ttft`` that of every class without
one. Every simulated arrival is of the default class (the lowest,
unless the policy names one); goodput counts those within its TTFT SLO. If any request
of the workload needs longer than that SLO for its own prefill on an idle server, a
warning on stderr says which share: no gate serves those in time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from slogate_admission.derivation import derive_thresholds
from slogate_cli.arguments import CommandError, Subcommands, non_negative_int, positive_float, positive_int
from slogate_cli.derive_command import add_policy_flags, build_policy, read_profile
from slogate_cli.simulate_table import table
from slogate_sim.lengths import Lengths, TokenLengths
from slogate_sim.preview import CHAT, PreviewRequest, preview
from slogate_sim.routing import ROUTINGS, Routing
from slogate_sim.scenario import GATES, GateKind
from slogate_sim.workloads import CHAT_OUTPUTS, CHAT_PROMPTS, DEFAULT_CLIENT_TIMEOUT_S


def add_parser(subparsers: Subcommands) -> None:
    """Register `simulate`."""
    parser = subparsers.add_parser(
        "simulate", help="preview a policy in a simulation of the calibrated server", description=__doc__
    )
    # Read (and a missing file reported, one line, exit 2) by run(): simulate starts nothing.
    parser.add_argument("--profile", type=Path, required=True, help="a profile from `slogate calibrate`")
    add_policy_flags(parser)
    parser.add_argument(
        "--load",
        type=loads,
        default="0.5x,1x,2x,4x",  # a string default goes through `type`, and --help shows it as typed
        help="x capacity: 2x, 2, or several",
    )
    parser.add_argument(
        "--gate",
        type=gates,
        default="direct,slogate",
        help="direct (llama-server alone), slogate, count-cap; several with commas",
    )
    parser.add_argument("--duration", type=positive_float, default=1800.0, help="simulated seconds of arrivals")
    parser.add_argument("--seed", type=non_negative_int, default=1, help="RNG seed: same seed, same result")
    parser.add_argument(
        "--prompt-tokens",
        type=prompt_lengths,
        default=CHAT,
        help="chat (the benchmark's chat mix: lognormal, median 100, at most 1000), N or LOW-HIGH",
    )
    parser.add_argument(
        "--output-tokens",
        type=output_lengths,
        default=CHAT,
        help="max_tokens, generated in full: chat (the chat mix's 32, 64 or 128), N or LOW-HIGH",
    )
    parser.add_argument(
        "--client-timeout",
        type=positive_float,
        help=f"clients leave without a first token by then, seconds (default {DEFAULT_CLIENT_TIMEOUT_S:g}; never "
        "with --service exponential)",
    )
    parser.add_argument("--count-cap-concurrency", type=positive_int, help="count-cap: streams (default: derived cap)")
    parser.add_argument(
        "--count-cap-queue",
        type=non_negative_int,
        help="count-cap: queue length (default: the benchmarks' fair one, floor(SLO x capacity), the deepest "
        "whose last request still starts within the SLO)",
    )
    parser.add_argument(
        "--service", choices=("profile", "exponential"), default="profile", help="service times: measured, or Exp(1/μ)"
    )
    parser.add_argument(
        "--slots", type=positive_int, default=1, help="--service exponential: parallel slots per pod (1: M/M/1)"
    )
    parser.add_argument("--replicas", type=positive_int, default=1, help="pods behind the balancer")
    parser.add_argument(
        "--routing",
        type=routings,
        default="random",
        help="random, round-robin, least-requests, retry-429[:TRIES], least-pressure; several with commas",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def loads(text: str) -> list[float]:
    """``2x``, ``2`` or ``0.5x,1x,2`` -> multiples of capacity (each finite and > 0)."""
    values: list[float] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        number = item[:-1] if item.lower().endswith("x") else item
        try:
            value = float(number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"load {item!r}: expected a multiple of capacity like 2x or 0.5") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"load {item!r}: must be a finite number > 0")
        values.append(value)
    if not values:
        raise argparse.ArgumentTypeError("give at least one load, e.g. 2x")
    return values


def gates(text: str) -> list[GateKind]:
    """``none,slogate`` -> gate kinds."""
    chosen: list[GateKind] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item not in GATES:
            raise argparse.ArgumentTypeError(f"gate {item!r}: choose from {', '.join(GATES)}")
        chosen.append(item)
    if not chosen:
        raise argparse.ArgumentTypeError(f"give at least one gate ({', '.join(GATES)})")
    return chosen


def routings(text: str) -> list[Routing]:
    """``random,retry-429:2`` -> routings."""
    chosen: list[Routing] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            chosen.append(Routing.parse(item))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"routing {item!r}: {exc}") from None
    if not chosen:
        raise argparse.ArgumentTypeError(f"give at least one routing ({', '.join(ROUTINGS)})")
    return chosen


def token_lengths(text: str) -> TokenLengths:
    """``512`` (fixed) or ``100-900`` (uniform integers)."""
    low, sep, high = text.partition("-")
    try:
        lengths = TokenLengths(int(low), int(high) if sep else int(low))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"token lengths {text!r}: expected N or LOW-HIGH with 1 <= LOW <= HIGH"
        ) from None
    return lengths


def prompt_lengths(text: str) -> Lengths:
    """``chat`` (the chat mix's prompts), ``512`` or ``100-900``."""
    return CHAT_PROMPTS if text.strip() == CHAT else token_lengths(text)


def output_lengths(text: str) -> Lengths:
    """``chat`` (the chat mix's max_tokens), ``256`` or ``32-128``."""
    return CHAT_OUTPUTS if text.strip() == CHAT else token_lengths(text)


def run(args: argparse.Namespace) -> int:
    """Simulate and print a table (or JSON); mistakes raise, for main's one line."""
    if args.tenants or args.tenant_weights:
        # A flag that changes nothing is a trap: the simulated arrivals name no tenant.
        raise CommandError(
            "--tenants and --tenant-weights change nothing here: every simulated arrival comes from one "
            "client (make bench-tenants-sim simulates tenants)"
        )
    policy = build_policy(args)
    profile = read_profile(args.profile)
    report = preview(
        PreviewRequest(
            profile=profile,
            thresholds=derive_thresholds(policy, profile, derived_at=datetime.now(UTC)),
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            gates=tuple(args.gate),
            loads=tuple(args.load),
            duration_s=args.duration,
            seed=args.seed,
            service=args.service,
            client_timeout_s=args.client_timeout,
            count_cap_concurrency=args.count_cap_concurrency,
            count_cap_queue=args.count_cap_queue,
            replicas=args.replicas,
            routings=tuple(args.routing),
            slots=args.slots,
        )
    )
    for warning in report["warnings"]:
        sys.stderr.write(f"slogate simulate: warning: {warning}\n")
    if args.json:
        sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    else:
        Console(width=160).print(table(report))
    return 0
