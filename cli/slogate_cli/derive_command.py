"""`slogate derive`: an SLO plus a calibration profile -> the thresholds a gate enforces.

The same derivation the operator runs. ``--classes`` takes ``name:ttft[:reserved]``
items, highest priority first, e.g. ``interactive:1.0:1,batch:10``; ``--policy FILE``
takes a whole policy (JSON, the AdmissionPolicy spec's fields) instead.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from slogate_admission.derivation import DerivationError, derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_calibration.output import write_atomic
from slogate_cli.arguments import Subcommands, positive_float, positive_int


def add_parser(subparsers: Subcommands) -> None:
    """Register `derive`."""
    parser = subparsers.add_parser("derive", help="derive thresholds from an SLO and a profile", description=__doc__)
    parser.add_argument("--profile", type=Path, required=True, help="a profile from `slogate calibrate`")
    add_policy_flags(parser)
    parser.add_argument("--out", type=Path, help="write the thresholds JSON here (atomically)")
    parser.set_defaults(run=run)


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """The SLO and policy flags, shared with `slogate up`."""
    parser.add_argument("--slo-ttft", type=positive_float, help="TTFT SLO, seconds")
    parser.add_argument("--slo-tpot", type=positive_float, help="per-output-token SLO, seconds")
    parser.add_argument("--classes", help="name:ttft[:reserved],... highest priority first")
    parser.add_argument("--concurrency-max", type=positive_int, help="at most this many streams")
    parser.add_argument("--policy", type=Path, help="a policy JSON file (overrides the flags above)")


def parse_classes(text: str) -> list[dict[str, Any]]:
    """``interactive:1.0:1,batch:10`` -> class policies (wire form)."""
    classes: list[dict[str, Any]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        fields = item.split(":")
        if not 1 <= len(fields) <= 3:
            raise ValueError(f"class {item!r}: expected name[:ttft[:reserved]]")
        cls: dict[str, Any] = {"name": fields[0]}
        try:
            if len(fields) > 1 and fields[1]:
                cls["ttftSeconds"] = float(fields[1])
            if len(fields) > 2:
                cls["reservedSlots"] = int(fields[2])
        except ValueError:
            raise ValueError(f"class {item!r}: ttft must be a number and reserved a whole number") from None
        classes.append(cls)
    return classes


def build_policy(args: argparse.Namespace) -> Policy:
    """The policy from --policy, or from the flags."""
    if args.policy is not None:
        return Policy.model_validate_json(args.policy.read_text())
    if args.slo_ttft is None:
        raise ValueError("give --slo-ttft (or --policy)")
    raw: dict[str, Any] = {"slo": {"ttftSeconds": args.slo_ttft}}
    if args.slo_tpot is not None:
        raw["slo"]["timePerOutputTokenSeconds"] = args.slo_tpot
    if args.classes:
        raw["classes"] = parse_classes(args.classes)
    if args.concurrency_max is not None:
        raw["concurrency"] = {"max": args.concurrency_max}
    return Policy.model_validate(raw)


def derive(args: argparse.Namespace) -> Thresholds:
    """Load, validate and derive; every failure is a ValueError with a clear message."""
    try:
        profile = CalibrationProfile.model_validate_json(args.profile.read_text())
        return derive_thresholds(build_policy(args), profile, derived_at=datetime.now(UTC))
    except OSError as error:
        raise ValueError(f"cannot read {error.filename}: {error.strerror}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"invalid input at {where or 'top level'}: {first['msg']}") from None


def run(args: argparse.Namespace) -> int:
    """Derive and print (or write) the thresholds."""
    try:
        thresholds = derive(args)
    except (ValueError, DerivationError) as error:
        sys.stderr.write(f"slogate derive: error: {error}\n")
        return 2
    text = thresholds.model_dump_json(by_alias=True, indent=2) + "\n"
    if args.out is not None:
        write_atomic(args.out, text)
    sys.stdout.write(text)
    return 0
