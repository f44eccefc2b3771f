"""`slogate`: subcommands, each in its own module, imported only when registered."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from slogate_cli import (
    calibrate_command,
    demo_command,
    derive_command,
    operator_command,
    sidecar_command,
    simulate_command,
    up_command,
    whatif_command,
)
from slogate_cli.arguments import OneLineParser


def build_parser() -> OneLineParser:
    """The top-level parser with every subcommand."""
    parser = OneLineParser(prog="slogate", description="SLO-derived admission control for llama.cpp")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    whatif_command.add_parser(subparsers)
    calibrate_command.add_parser(subparsers)
    derive_command.add_parser(subparsers)
    up_command.add_parser(subparsers)
    sidecar_command.add_parser(subparsers)
    demo_command.add_parser(subparsers)
    simulate_command.add_parser(subparsers)
    operator_command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
