"""`slogate derive`: an SLO plus a calibration profile -> the thresholds a gate enforces.

The same derivation the operator runs. ``--classes`` takes ``name[:ttft[:reserved]]``
items, highest priority first, e.g. ``interactive:1.0:1,batch:10``; ``--policy FILE``
takes the AdmissionPolicy you apply instead (``policy_file``: YAML or JSON, the whole object,
its spec or the policy alone; operator-only fields ignored with a note). A class's ttft
is its TTFT SLO; ``--slo-ttft`` is the TTFT SLO of every class without one (of the one
class, default, without ``--classes``): required unless every class sets its own, and
refused when every class does (it would apply to none). An SLO the
calibrated server cannot meet even for the smallest useful prompt (32 tokens) is
refused, naming the smallest it can meet; one it cannot meet for the reference prompt
(512 tokens) derives with a warning naming the longest prompt it admits.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from slogate_admission.derivation import derive_thresholds, reference_prompt_warnings
from slogate_admission.schema import CalibrationProfile, ClassPolicy, Policy, Thresholds
from slogate_admission.tenant_schema import TenantsPolicy
from slogate_calibration.output import write_atomic
from slogate_cli.arguments import (
    CommandError,
    Subcommands,
    existing_file,
    one_line,
    output_file,
    positive_float,
    positive_int,
)
from slogate_cli.policy_file import read_policy


def add_parser(subparsers: Subcommands) -> None:
    """Register `derive`."""
    parser = subparsers.add_parser("derive", help="derive thresholds from an SLO and a profile", description=__doc__)
    parser.add_argument("--profile", type=existing_file, required=True, help="a profile from `slogate calibrate`")
    add_policy_flags(parser)
    parser.add_argument("--out", type=output_file, help="write the thresholds JSON here (atomically)")
    parser.set_defaults(run=run)


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """The SLO and policy flags, shared with `slogate up`."""
    parser.add_argument(
        "--slo-ttft",
        type=positive_float,
        help="TTFT SLO, seconds, of every class in --classes without a ttft of its own, or of the one class "
        "when there is no --classes: required unless every class sets its own, refused if every class does; "
        "refused below what the calibrated server needs for a 32-token prompt",
    )
    parser.add_argument("--slo-tpot", type=positive_float, help="per-output-token SLO, seconds")
    parser.add_argument(
        "--classes",
        type=classes,
        help="name[:ttft[:reserved]],... highest priority first; ttft is the class's TTFT SLO, unset: "
        "--slo-ttft's. E.g. interactive:1:1,batch:10, or interactive:1:1,batch with --slo-ttft 10",
    )
    parser.add_argument("--concurrency-max", type=positive_int, help="at most this many streams")
    parser.add_argument(
        "--tenants",
        action="store_true",
        help="fair shares between tenants (spec.tenants with its defaults: the X-Slogate-Tenant header, equal weights)",
    )
    parser.add_argument(
        "--tenant-weights",
        type=tenant_weights,
        help="tenant:weight,... (implies --tenants); unlisted tenants weigh 1. E.g. acme:3,globex:1",
    )
    parser.add_argument(
        "--policy",
        type=existing_file,
        help="the AdmissionPolicy you apply (YAML or JSON: the whole object, its spec, or the policy alone; "
        "operator-only fields are ignored with a note), instead of the flags above",
    )


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


def tenant_weights(text: str) -> dict[str, float]:
    """The ``--tenant-weights`` type: ``acme:3,globex:1``, each checked as spec.tenants will."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, colon, weight = item.rpartition(":")
        try:
            weights[name] = float(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"tenant {item!r}: expected name:weight, e.g. acme:3") from None
        if not colon:
            raise argparse.ArgumentTypeError(f"tenant {item!r}: expected name:weight, e.g. acme:3")
    try:
        TenantsPolicy.model_validate({"weights": weights})
    except ValidationError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {one_line(error)}") from None
    if not weights:
        raise argparse.ArgumentTypeError("give at least one tenant, e.g. acme:3,globex:1")
    return weights


def classes(text: str) -> list[dict[str, Any]]:
    """The ``--classes`` type: parsed, and each class checked as the policy will check it."""
    try:
        parsed = parse_classes(text)
        for cls in parsed:
            ClassPolicy.model_validate(cls)
    except ValidationError as error:
        first = error.errors()[0]
        if first["loc"] == ("name",):
            raise argparse.ArgumentTypeError(
                f"class name {first['input']!r}: lowercase letters, digits and '-' only; "
                "items are name:ttft[:reserved], e.g. interactive:1:1,batch:10"
            ) from None
        raise argparse.ArgumentTypeError(f"{text!r}: {one_line(error)}") from None
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not parsed:
        raise argparse.ArgumentTypeError("give at least one class, e.g. interactive:1:1,batch:10")
    return parsed


POLICY_FLAGS = {
    "--slo-ttft": "slo_ttft",
    "--slo-tpot": "slo_tpot",
    "--classes": "classes",
    "--concurrency-max": "concurrency_max",
    "--tenants": "tenants",
    "--tenant-weights": "tenant_weights",
}
"""The flags a policy file replaces, by their argparse destinations."""


def build_policy(args: argparse.Namespace) -> Policy:
    """The policy from --policy, or from the flags; every failure is a one-line ValueError."""
    if args.policy is not None:
        flags = [flag for flag, dest in POLICY_FLAGS.items() if getattr(args, dest) not in (None, False)]
        if flags:
            raise ValueError(f"give --policy or {', '.join(flags)}, not both: the policy file says all of it")
        read = read_policy(args.policy)
        note = read.note()
        if note is not None:
            print(note, file=sys.stderr)
        return read.policy
    try:
        check_slo_ttft(args.slo_ttft, args.classes or [])
        raw: dict[str, Any] = {"slo": {}}
        if args.slo_ttft is not None:
            raw["slo"]["ttftSeconds"] = args.slo_ttft
        if args.slo_tpot is not None:
            raw["slo"]["timePerOutputTokenSeconds"] = args.slo_tpot
        if args.classes:
            raw["classes"] = args.classes
        if args.concurrency_max is not None:
            raw["concurrency"] = {"max": args.concurrency_max}
        if args.tenants or args.tenant_weights:
            raw["tenants"] = {"weights": args.tenant_weights or {}}
        return Policy.model_validate(raw)
    except ValidationError as error:
        raise ValueError(one_line(error)) from None


def check_slo_ttft(slo_ttft: float | None, classes: list[dict[str, Any]]) -> None:
    """--slo-ttft is given exactly when some class takes it: the flags' words for the Policy's rule."""
    names = [c["name"] for c in classes]
    if len(set(names)) != len(names):
        return  # the Policy names the repeated class: the more basic mistake
    inheriting = [c["name"] for c in classes if "ttftSeconds" not in c]
    if slo_ttft is None and not classes:
        raise ValueError("give --slo-ttft (or --policy): it is the TTFT SLO of the one class, default")
    if slo_ttft is None and inheriting:
        raise ValueError(
            f"give --slo-ttft: it is the TTFT SLO of the classes without a ttft of their own in --classes "
            f"({', '.join(inheriting)})"
        )
    if slo_ttft is not None and classes and not inheriting:
        own = ", ".join(f"{c['name']}:{c['ttftSeconds']:g}" for c in classes)
        raise ValueError(
            f"--slo-ttft {slo_ttft:g} applies to no class: every class in --classes sets its own ttft ({own}); "
            "drop --slo-ttft, or a class's ttft to give it --slo-ttft's"
        )


def derive(args: argparse.Namespace) -> Thresholds:
    """Load, validate and derive; every failure is a ValueError with a clear message."""
    policy = build_policy(args)
    return derive_thresholds(policy, read_profile(args.profile), derived_at=datetime.now(UTC))


def read_profile(path: Path) -> CalibrationProfile:
    """A profile file; a one-line ValueError if it cannot be read or is not a profile."""
    try:
        return CalibrationProfile.model_validate_json(path.read_text())
    except OSError as error:
        raise ValueError(f"cannot read {error.filename}: {error.strerror}") from None
    except ValidationError as error:
        raise ValueError(f"{path}: {one_line(error)}") from None


def run(args: argparse.Namespace) -> int:
    """Derive and print (or write) the thresholds; mistakes raise, for main's one line."""
    thresholds = derive(args)
    for warning in reference_prompt_warnings(thresholds):
        sys.stderr.write(f"slogate derive: warning: {warning}\n")
    text = thresholds.model_dump_json(by_alias=True, indent=2) + "\n"
    if args.out is not None:
        try:
            write_atomic(args.out, text)
        except OSError as error:  # checked at parse time; the file system can still refuse
            raise CommandError(f"--out {args.out}: {error.strerror}") from error
    sys.stdout.write(text)
    return 0
