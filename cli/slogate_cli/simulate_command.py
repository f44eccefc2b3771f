"""`slogate simulate`: preview a policy on a calibrated server before deploying it.

A discrete-event simulation of llama-server (its slots, its own queue, prefill and
decode sharing the cores, clients that give up) in which every arrival is judged by
the same predicate the sidecar runs. ``--load`` is a multiple of the derived capacity
μ for the simulated requests (``2x`` or ``2``; several with commas, e.g.
``0.5x,1x,2x,4x``); ``--gate`` picks what stands in front: ``none`` (llama-server
alone), ``slogate``, or ``count-cap`` (a fixed concurrency and queue), several with
commas. Token lengths are ``chat`` (the default: the benchmark's chat mix, prompts
lognormal around 100 tokens up to 1,000, max_tokens from 32, 64, 128), ``N`` or
``LOW-HIGH`` (uniform). ``--service exponential`` replaces each request with Exp(1/μ)
seconds of work on one slot: the M/M/1 check. Every gate sees the very same arrivals for
a given ``--seed``. The SLO flags and ``--policy FILE`` (a policy JSON) are those of
`slogate derive`: a class's ttft in ``--classes`` is its TTFT SLO, ``--slo-ttft`` that of
every class without one. Every simulated arrival is of the default class (the lowest,
unless the policy names one); goodput counts those within its TTFT SLO. If any request
of the workload needs longer than that SLO for its own prefill on an idle server, a
warning on stderr says which share: no gate can serve those in time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from slogate_admission.derivation import DerivationError, derive_thresholds, longest_prompt_within
from slogate_admission.queueing import mm1_time_in_system
from slogate_admission.schema import CalibrationProfile, ClassThresholds, Thresholds
from slogate_bench.scenario import (
    DEFAULT_CLIENT_TIMEOUT_S,
    GATES,
    CountCap,
    GateKind,
    Lengths,
    SampledLengths,
    ServerModel,
    TokenLengths,
    Workload,
    capacity_rps,
    config_for_load,
)
from slogate_bench.simulator import simulate
from slogate_bench.workloads import preset
from slogate_cli.arguments import (
    OneLineParser,
    Subcommands,
    non_negative_int,
    positive_float,
    positive_int,
)
from slogate_cli.derive_command import add_policy_flags, build_policy, read_profile


def add_parser(subparsers: Subcommands) -> None:
    """Register `simulate`."""
    parser = subparsers.add_parser(
        "simulate", help="preview a policy in a simulation of the calibrated server", description=__doc__
    )
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `simulate` (also used to build a stand-alone parser in tests)."""
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
        default="none,slogate",
        help="none, slogate, count-cap; several with commas",
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
    parser.add_argument("--count-cap-queue", type=non_negative_int, default=8, help="count-cap: queue length")
    parser.add_argument(
        "--service", choices=("profile", "exponential"), default="profile", help="service times: measured, or Exp(1/μ)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


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


CHAT = "chat"
CHAT_DRAWS = 5000
"""The chat mix as lengths: the load generator's preset, drawn as the benchmark's simulated
curves draw it (``figures.simulated_goodput``), then sampled with replacement per arrival."""


def _chat(index: int) -> SampledLengths:
    return SampledLengths(tuple(draw[index] for draw in preset(CHAT).draws(CHAT_DRAWS)))


def prompt_lengths(text: str) -> Lengths:
    """``chat`` (the chat mix's prompts), ``512`` or ``100-900``."""
    return _chat(0) if text.strip() == CHAT else token_lengths(text)


def output_lengths(text: str) -> Lengths:
    """``chat`` (the chat mix's max_tokens), ``256`` or ``32-128``."""
    return _chat(1) if text.strip() == CHAT else token_lengths(text)


def describe_lengths(lengths: Lengths) -> str:
    """As given on the command line."""
    if isinstance(lengths, SampledLengths):
        return CHAT
    return str(lengths.low) if lengths.low == lengths.high else f"{lengths.low}-{lengths.high}"


def share_over(lengths: Lengths, tokens: int) -> float:
    """The share of draws longer than ``tokens``."""
    if isinstance(lengths, SampledLengths):
        return sum(1 for n in lengths.samples if n > tokens) / len(lengths.samples)
    return max(0, lengths.high - max(tokens, lengths.low - 1)) / (lengths.high - lengths.low + 1)


def _percent(share: float) -> str:
    return "<0.1%" if 0 < share < 0.001 else f"{share:.1%}"


def workload_warnings(
    server: ServerModel, workload: Workload, default: ClassThresholds, gates: list[GateKind]
) -> list[str]:
    """What the workload cannot get whatever the load: requests whose own prefill on an idle
    server misses the default class's TTFT SLO (warned if there is any), and, for the slogate
    gate, those beyond the class's admit-now budget when the classes above cap it lower."""
    if workload.service == "exponential":  # no token counts: prefill is not simulated
        return []
    warnings = []
    within_slo = longest_prompt_within(server.prefill, default.ttft_slo_seconds)
    missed = share_over(workload.prompt_tokens, within_slo)
    slo_text = f"the {default.ttft_slo_seconds:g} s TTFT SLO of class {default.name!r}"
    if missed >= 1:
        warnings.append(
            f"every request of the workload needs more than {slo_text} for its own prefill on an idle server "
            f"(only prompts up to {within_slo} tokens fit): no gate serves any within it, goodput is 0"
        )
    elif missed > 0:
        warnings.append(
            f"{_percent(missed)} of the workload's requests (prompts over {within_slo} tokens) need more than "
            f"{slo_text} for their own prefill on an idle server: no gate serves them within it, so goodput "
            f"is at most {_percent(1 - missed)} of the offered rate"
        )
    if "slogate" in gates and default.ttft_budget_seconds < default.ttft_slo_seconds:
        within_budget = longest_prompt_within(server.prefill, default.ttft_budget_seconds)
        refused = share_over(workload.prompt_tokens, within_budget)
        if refused > missed:
            warnings.append(
                f"slogate never admits {_percent(refused)} of the workload's requests (prompts over "
                f"{within_budget} tokens): the admit-now TTFT budget of class {default.name!r} is "
                f"{default.ttft_budget_seconds:g} s, capped by the classes above it"
            )
    return warnings


def slo_title(report: dict[str, Any]) -> str:
    """Each class's TTFT SLO, and which one the arrivals (and goodput) are judged by."""
    classes = report["classes"]
    if len(classes) == 1:
        return f"TTFT SLO {report['ttft_slo_s']:g} s"
    each = ", ".join(f"{c['name']} {c['ttft_slo_s']:g} s" for c in classes)
    return f"TTFT SLO {each} (arrivals: {report['default_class']}, the default class)"


def load_inputs(args: argparse.Namespace) -> tuple[CalibrationProfile, Thresholds]:
    """The profile and the thresholds derived from it; every failure is a ValueError."""
    policy = build_policy(args)
    profile = read_profile(args.profile)
    return profile, derive_thresholds(policy, profile, derived_at=datetime.now(UTC))


def simulate_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every gate at every load; a JSON-ready report. Raises ValueError on bad input."""
    profile, thresholds = load_inputs(args)
    server = ServerModel.from_profile(profile)
    exponential = args.service == "exponential"
    timeout = args.client_timeout or (math.inf if exponential else DEFAULT_CLIENT_TIMEOUT_S)
    workload = Workload(args.prompt_tokens, args.output_tokens, client_timeout_s=timeout)
    if exponential:
        if "slogate" in args.gate:
            raise ValueError("--service exponential has no token counts for the slogate gate: use none or count-cap")
        # The M/M/1 check: the same μ, as Exp(1/μ) seconds of work on a single slot.
        mu = capacity_rps(server, workload, thresholds.concurrency_cap)
        server = ServerModel(1, server.prefill, server.decode)
        workload = Workload(
            args.prompt_tokens,
            args.output_tokens,
            client_timeout_s=timeout,
            service="exponential",
            exponential_mean_s=1.0 / mu,
        )
    count_cap = CountCap(args.count_cap_concurrency or thresholds.concurrency_cap, args.count_cap_queue)
    default = next(c for c in thresholds.classes if c.name == thresholds.default_class)
    slo = default.ttft_slo_seconds
    warnings = workload_warnings(server, workload, default, args.gate)
    runs: list[dict[str, Any]] = []
    for gate in args.gate:
        for load in args.load:
            config = config_for_load(
                server,
                workload,
                load=load,
                duration_s=args.duration,
                ttft_slo_s=slo,
                gate=gate,
                thresholds=thresholds,
                count_cap=count_cap,
                seed=args.seed,
            )
            run_report: dict[str, Any] = {"load": load, **simulate(config).as_dict()}
            if exponential:
                w = mm1_time_in_system(config.arrival_rate_rps, config.capacity_rps)
                run_report["mm1_time_in_system_s"] = w if math.isfinite(w) else None
            runs.append(run_report)
    return {
        "calibration_id": thresholds.calibration_id,
        "model": thresholds.model,
        "service": args.service,
        "ttft_slo_s": slo,
        "default_class": default.name,
        "classes": [{"name": c.name, "ttft_slo_s": c.ttft_slo_seconds} for c in thresholds.classes],
        "prompt_tokens": describe_lengths(args.prompt_tokens),
        "output_tokens": describe_lengths(args.output_tokens),
        "warnings": warnings,
        "concurrency_cap": thresholds.concurrency_cap,
        "client_timeout_s": timeout if math.isfinite(timeout) else None,
        "capacity_rps": runs[0]["capacity_rps"],
        "runs": runs,
    }


def _seconds(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "-"


def table(report: dict[str, Any]) -> Table:
    """One row per gate and load."""
    timeout = report["client_timeout_s"]
    patience = f"clients give up after {timeout:g} s" if timeout is not None else "patient clients"
    lengths = (
        "chat mix"
        if report["prompt_tokens"] == report["output_tokens"] == CHAT
        else f"prompts {report['prompt_tokens']}, outputs {report['output_tokens']} tokens"
    )
    t = Table(
        title=(
            f"{report['model']}: capacity μ {report['capacity_rps']:.3f} req/s, {slo_title(report)}, "
            f"{lengths}, {patience} ({report['service']} service)"
        )
    )
    columns = ("gate", "load", "offered", "admitted", "rejected", "timed out", "within SLO", "goodput")
    for column in (*columns, "p50 TTFT", "p99 TTFT", "mean W", "util"):
        t.add_column(column, justify="left" if column == "gate" else "right")
    for r in report["runs"]:
        t.add_row(
            r["gate"],
            f"{r['load']:g}x",
            *(str(r[k]) for k in ("offered", "admitted", "rejected", "timed_out", "completed_within_slo")),
            f"{r['goodput_rps']:.3f} req/s",
            _seconds(r["ttft_p50_s"]),
            _seconds(r["ttft_p99_s"]),
            _seconds(r["mean_time_in_system_s"]),
            f"{r['utilization']:.0%}",
        )
    return t


def run(args: argparse.Namespace) -> int:
    """Simulate and print a table (or JSON)."""
    try:
        report = simulate_all(args)
    except (ValueError, DerivationError) as error:
        sys.stderr.write(f"slogate simulate: error: {error}\n")
        return 2
    for warning in report["warnings"]:
        sys.stderr.write(f"slogate simulate: warning: {warning}\n")
    if args.json:
        sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    else:
        Console(width=160).print(table(report))
    return 0


def build_parser() -> OneLineParser:
    """A stand-alone `slogate simulate` parser (the dispatcher registers ``add_parser`` instead)."""
    parser = OneLineParser(prog="slogate simulate", description=__doc__)
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser
