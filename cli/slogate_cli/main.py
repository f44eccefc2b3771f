"""`slogate`: subcommands, each in its own module, imported only when registered."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from slogate_cli import (
    calibrate_command,
    demo_command,
    derive_command,
    llama_server_command,
    operator_command,
    sidecar_command,
    simulate_command,
    up_command,
    whatif_command,
)
from slogate_cli.arguments import OneLineParser

DISTRIBUTION = "slogate"


def distribution_version() -> str:
    """The installed distribution's version (what `pip show slogate` says)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> OneLineParser:
    """The top-level parser with every subcommand."""
    parser = OneLineParser(prog="slogate", description="SLO-derived admission control for llama.cpp")
    parser.add_argument("--version", action="version", version=f"%(prog)s {distribution_version()}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", title="commands", required=True, parser_class=OneLineParser
    )
    whatif_command.add_parser(subparsers)
    calibrate_command.add_parser(subparsers)
    derive_command.add_parser(subparsers)
    up_command.add_parser(subparsers)
    llama_server_command.add_parser(subparsers)
    sidecar_command.add_parser(subparsers)
    demo_command.add_parser(subparsers)
    simulate_command.add_parser(subparsers)
    operator_command.add_parser(subparsers)
    for command in subparsers.choices.values():
        # Each subcommand knows its own parser: main() reports its unknown flags with it.
        command.set_defaults(command_parser=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        # argparse would report them as the top level's ("slogate: error: ..."); they were
        # given to the subcommand, whose flags are what the user should be shown.
        command: OneLineParser = getattr(args, "command_parser", parser)
        command.unrecognized(extras)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
