"""`slogate operator`: the Kubernetes operator (kopf) that runs AdmissionPolicies.

Settings come from SLOGATE_OPERATOR_* environment variables (docs/operator.md); the
flags below override the scope, peering and ports. Run two replicas with the same
peering name: kopf elects one to act and the other waits (the peering object, a
ClusterKopfPeering for cluster-wide operators, must exist). `--standalone` skips
peering, for one replica or a laptop.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys

from slogate_cli.arguments import Subcommands, non_negative_int, port


def add_parser(subparsers: Subcommands) -> None:
    """Register `operator`."""
    parser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator for AdmissionPolicies", description=__doc__
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="serve this namespace (repeatable); default: SLOGATE_OPERATOR_NAMESPACES, else all",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="serve every namespace")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", help="kopf peering name shared by the replicas (default: slogate)")
    peering.add_argument("--standalone", action="store_true", help="no peering: a single replica")
    parser.add_argument("--priority", type=non_negative_int, help="peering priority; default: random per process")
    parser.add_argument("--image", help="the slogate image for sidecars and calibration Jobs")
    parser.add_argument("--metrics-port", type=port, help="Prometheus /metrics port; 0: none")
    parser.add_argument("--liveness-port", type=port, help="liveness /healthz port; 0: none")
    parser.add_argument("--log-format", choices=["plain", "full", "json"], default="full", help="kopf's log format")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM or SIGINT."""
    # Imported here: every other subcommand starts faster without kopf.
    import kopf  # noqa: PLC0415

    from slogate_operator.settings import OperatorSettings, SettingsError  # noqa: PLC0415

    overrides: dict[str, object] = {
        "peering": args.peering,
        "standalone": True if args.standalone else None,
        "image": args.image,
        "priority": args.priority,
        "metrics_port": args.metrics_port,
        "liveness_port": args.liveness_port,
    }
    if args.all_namespaces:
        overrides["namespaces"] = ()
    elif args.namespaces:
        overrides["namespaces"] = tuple(args.namespaces)
    if args.peering:
        overrides["standalone"] = False
    try:
        settings = OperatorSettings.from_env(os.environ, **overrides)
    except (SettingsError, TypeError, ValueError) as error:
        sys.stderr.write(f"slogate operator: error: {error}\n")
        return 2
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    # kopf pauses every replica of a peering when two share a priority: draw one unless set.
    priority = settings.priority or random.SystemRandom().randint(1, 2**31 - 1)
    importlib.import_module("slogate_operator.handlers")  # registers the handlers with kopf
    kopf.run(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=settings.standalone,
        peering_name=None if settings.standalone else settings.peering,
        priority=priority,
        liveness_endpoint=f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None,
        memo=kopf.Memo(config=settings),
    )
    return 0
