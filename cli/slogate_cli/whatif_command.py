"""`slogate what-if`: would this request be admitted, and why. Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from slogate_admission.whatif import WhatIfInputs, what_if
from slogate_cli.arguments import (
    Subcommands,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)

# flag -> (parser, help); each flag is a field of WhatIfInputs.
FLAGS: dict[str, tuple[Callable[[str], float], str]] = {
    "--prefill-tps": (positive_float, "measured prefill rate, tokens/s"),
    "--ttft-slo": (positive_float, "TTFT SLO, seconds"),
    "--prompt-tokens": (non_negative_int, "n_in of the request"),
    "--queued-tokens": (non_negative_float, "prompt tokens queued ahead of it"),
    "--max-tokens": (non_negative_int, "n_out reserved (worst case: max_tokens)"),
    "--kv-bytes-per-token": (positive_float, "KV bytes per token (or give the four below)"),
    "--layers": (positive_int, "model layers"),
    "--kv-heads": (positive_int, "KV heads"),
    "--head-dim": (positive_int, "head dimension"),
    "--kv-bytes-per-elem": (positive_float, "bytes per cache element (f16: 2)"),
    "--kv-free-bytes": (non_negative_float, "free KV memory, bytes"),
    "--in-flight": (non_negative_int, "streams already admitted"),
    "--concurrency-cap": (positive_int, "most streams at once"),
    "--arrival-rate": (non_negative_float, "lambda, requests/s"),
    "--service-rate": (positive_float, "mu, requests/s"),
    "--w-max": (positive_float, "W_max, the time-in-system SLO, seconds"),
    "--reject-fraction": (fraction, "p, the share rejected (retried at once)"),
}


def add_parser(subparsers: Subcommands) -> None:
    """Register `what-if` and its flags."""
    parser = subparsers.add_parser(
        "what-if",
        help="would a request be admitted, and why (JSON)",
        description=__doc__,
    )
    for flag, (parse, text) in FLAGS.items():
        parser.add_argument(flag, type=parse, help=text)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Evaluate and print; core-level contradictions become one-line errors."""
    # argparse stores --prefill-tps as prefill_tps: the dataclass's field names.
    inputs = WhatIfInputs(**{name: getattr(args, name) for name in WhatIfInputs.__slots__})
    try:
        result = what_if(inputs)
    except ValueError as error:
        sys.stderr.write(f"slogate what-if: error: {error}\n")
        return 2
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0
