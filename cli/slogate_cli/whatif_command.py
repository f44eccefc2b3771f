"""`slogate what-if`: would this request be admitted, and why. Prints one JSON object.

Give what you know; ``missing`` in the output names the inputs that would unlock more.
The spec's worked example: ``--prefill-tps 1200 --slo-ttft 2 --prompt-tokens 800
--queued-tokens 1100``. ``--ttft-margin`` asks as a gate does, at its TTFT margin (its
thresholds' ``ttftMarginPrior`` at least). A request that can never fit (its own prefill,
at the margin, beyond the SLO, or
prompt + output beyond ``--slot-tokens`` or ``--kv-capacity-bytes``) gets what the
sidecar answers it, a 400: admit false, reason never_fits, retry_after_s null. With
tenants, add what its tenant holds and the active tenants' weights: ``--tenant-held-tokens
900 --active-tenant-weight 2`` asks whether it fits in its half of the token budget. The cost
order: ``--decode-tps 180 --cost-boundary 0.9 --reserve-slots 1 --in-flight 3
--concurrency-cap 4`` prices it (``cost_s``) and says whether it is ``costly`` and ``held_back``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from slogate_admission.whatif import WhatIfInputs, what_if
from slogate_cli.arguments import (
    CommandError,
    Subcommands,
    existing_file,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from slogate_cli.policy_file import read_policy

# flag -> (parser, help); each flag is a field of WhatIfInputs.
FLAGS: dict[str, tuple[Callable[[str], float], str]] = {
    "--prefill-tps": (positive_float, "measured prefill rate, tokens/s"),
    "--slo-ttft": (positive_float, "TTFT SLO, seconds (or --policy's)"),
    "--prompt-tokens": (non_negative_int, "n_in of the request"),
    "--queued-tokens": (non_negative_float, "prompt tokens queued ahead of it"),
    "--max-tokens": (non_negative_int, "n_out reserved (worst case: max_tokens)"),
    "--kv-bytes-per-token": (positive_float, "KV bytes per token (or give the four below)"),
    "--layers": (positive_int, "model layers"),
    "--kv-heads": (positive_int, "KV heads"),
    "--head-dim": (positive_int, "head dimension"),
    "--kv-bytes-per-elem": (positive_float, "bytes per cache element (f16: 2)"),
    "--kv-free-bytes": (non_negative_float, "free KV memory, bytes"),
    "--kv-capacity-bytes": (positive_float, "the whole KV cache, bytes: a request beyond it never fits"),
    "--slot-tokens": (positive_int, "one slot's context, tokens (ctx / parallel): prompt + output beyond it never fit"),
    "--in-flight": (non_negative_int, "streams already admitted"),
    "--concurrency-cap": (positive_int, "most streams at once"),
    "--arrival-rate": (non_negative_float, "lambda, requests/s"),
    "--service-rate": (positive_float, "mu, requests/s"),
    "--w-max": (positive_float, "W_max, the time-in-system SLO, seconds"),
    "--reject-fraction": (fraction, "p, the share rejected (retried at once)"),
    "--tenant-held-tokens": (non_negative_float, "prompt tokens its tenant holds in the class (queued or deferred)"),
    "--tenant-weight": (positive_float, "its tenant's weight (default 1)"),
    "--ttft-margin": (
        positive_float,
        "m >= 1: admit when m x the predicted TTFT is within the SLO (default 1, the median; "
        "a gate's least is its thresholds' ttftMarginPrior)",
    ),
    "--active-tenant-weight": (
        positive_float,
        "sum of the weights of the tenants active in the class, its own included",
    ),
    "--decode-tps": (positive_float, "decode tokens/s of all streams at the concurrency cap: prices the output"),
    "--cost-boundary": (
        non_negative_float,
        "c*, server-seconds, as the sidecar's /state shows it (costs.boundarySeconds): dearer is costly",
    ),
    "--reserve-slots": (non_negative_int, "slots the cost order holds back (/state costs.reserveSlots)"),
}


ALIASES = {"--ttft-slo": "--slo-ttft"}
"""Earlier spellings, still taken and not shown: every command spells the SLO --slo-ttft."""


def add_parser(subparsers: Subcommands) -> None:
    """Register `what-if` and its flags."""
    parser = subparsers.add_parser(
        "what-if",
        help="would a request be admitted, and why (JSON)",
        description=__doc__,
    )
    for flag, (parse, text) in FLAGS.items():
        parser.add_argument(flag, type=parse, help=text)
    for old, flag in ALIASES.items():
        parser.add_argument(old, dest=_field(flag), type=FLAGS[flag][0], help=argparse.SUPPRESS)
    parser.add_argument(
        "--policy",
        type=existing_file,
        help="the AdmissionPolicy you apply (as derive takes it): its class's admit-now budget (the least "
        "TTFT SLO of the class and those above it), and concurrency.max if set, instead of --slo-ttft and "
        "--concurrency-cap",
    )
    parser.add_argument("--class", dest="class_name", help="with --policy: the request's class (default: the policy's)")
    parser.set_defaults(run=run)


GEOMETRY = ("--layers", "--kv-heads", "--head-dim", "--kv-bytes-per-elem")
"""Give all four, or --kv-bytes-per-token instead."""


def _field(flag: str) -> str:
    return flag[2:].replace("-", "_")


def check_inputs(args: argparse.Namespace) -> str | None:
    """What is wrong with the combination of flags, or None (each flag alone was checked by argparse)."""
    given = {flag for flag in FLAGS if getattr(args, _field(flag)) is not None}
    if not given:
        return "give at least one input, e.g. --prefill-tps 1200 --slo-ttft 2 --prompt-tokens 800 --queued-tokens 1100"
    if args.ttft_margin is not None and args.ttft_margin < 1:
        return f"--ttft-margin must be at least 1 (a gate never admits beyond its median), got {args.ttft_margin:g}"
    geometry = [flag for flag in GEOMETRY if flag in given]
    if geometry and "--kv-bytes-per-token" in given:
        return f"give --kv-bytes-per-token or {', '.join(GEOMETRY)}, not both"
    if geometry and len(geometry) < len(GEOMETRY):
        absent = [flag for flag in GEOMETRY if flag not in given]
        verb = "needs" if len(geometry) == 1 else "need"
        return f"{', '.join(geometry)} also {verb} {', '.join(absent)} (or give --kv-bytes-per-token alone)"
    return None


def from_policy(args: argparse.Namespace) -> dict[str, float | int]:
    """The inputs --policy gives: the class's TTFT SLO, and the concurrency cap if the policy sets one."""
    if args.policy is None:
        if args.class_name is not None:
            raise CommandError("--class needs --policy: the class's SLO comes from the policy")
        return {}
    clash = [flag for flag in ("--slo-ttft", "--concurrency-cap") if getattr(args, _field(flag)) is not None]
    if clash:
        raise CommandError(f"give --policy or {', '.join(clash)}, not both: the policy file says it")
    try:
        read = read_policy(args.policy)
    except ValueError as error:
        raise CommandError(str(error)) from None
    if (note := read.note()) is not None:
        print(note, file=sys.stderr)
    policy = read.policy
    names = [c.name for c in policy.class_policies]
    name = args.class_name or policy.default_class or names[-1]
    if name not in names:
        raise CommandError(f"--class {name!r} is not a class of the policy ({', '.join(names)})")
    # Admitted at once within its class's budget, as the gate would (Policy.ttft_budget_of).
    given: dict[str, float | int] = {"slo_ttft": policy.ttft_budget_of(name)}
    if policy.concurrency.max is not None:
        given["concurrency_cap"] = policy.concurrency.max
    return given


def run(args: argparse.Namespace) -> int:
    """Evaluate and print; contradictions in the flags or in the core's inputs raise, for main's one line."""
    from_file = from_policy(args)
    for name, value in from_file.items():
        setattr(args, name, value)
    problem = check_inputs(args)
    if problem is not None:
        raise CommandError(problem)
    # argparse stores --prefill-tps as prefill_tps: the dataclass's field names.
    # Flags not given keep the dataclass's defaults (None, or a tenant's weight of 1).
    given = {name: value for name in WhatIfInputs.__slots__ if (value := getattr(args, name)) is not None}
    inputs = WhatIfInputs(**given)
    sys.stdout.write(json.dumps(what_if(inputs), sort_keys=True) + "\n")
    return 0
