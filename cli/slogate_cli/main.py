"""`slogate`: the dispatcher. Each subcommand is a module of its own (``*_command``: its flags
and its run, calling the packages that do the work); this one registers them all and runs the
one asked.

One error path: a mistake in the flags is reported by the subcommand's parser, and one
found while running (a command's ``CommandError``, or an error of the packages it calls)
by ``main``; both as one line, ``slogate X: error: ...``, exit 2 (3 only when
`calibrate` runs out of budget).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError

from slogate_admission.derivation import DerivationError
from slogate_calibration.calibrate import CalibrationError
from slogate_calibration.runtime import LlamaServerError, RuntimeNotFound
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
from slogate_cli.arguments import EXIT_USAGE, CommandError, OneLineParser, one_line

DISTRIBUTION = "slogate"
MISTAKES = (CommandError, ValueError, DerivationError, CalibrationError, LlamaServerError, RuntimeNotFound, OSError)
"""What a command may raise for main to report as one line: the user's input, the server's
state or the machine's refusal, never a bug (a traceback still shows those)."""


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


def error_line(error: BaseException) -> str:
    """An error as the one line after ``error:``: an OSError by the file it concerns (if any), a
    pydantic error by its first problem, anything else by its message on one line."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    if isinstance(error, ValidationError):
        return one_line(error)
    return " ".join(str(error).splitlines())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    command: OneLineParser = getattr(args, "command_parser", parser)
    if extras:
        # argparse would report them as the top level's ("slogate: error: ..."); they were
        # given to the subcommand, whose flags are what the user should be shown.
        command.unrecognized(extras)
    try:
        code: int = args.run(args)
    except MISTAKES as error:
        sys.stderr.write(f"{command.prog}: error: {error_line(error)}\n")
        return error.exit_code if isinstance(error, CommandError) else EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
