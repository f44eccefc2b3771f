"""`slogate llama-server`: the bundled llama-server on its own, in the foreground.

The very server `slogate up` starts (the binary and model `make llama` installed, or
``$SLOGATE_LLAMA_SERVER`` / ``$SLOGATE_MODEL``; the same threads, slots, context and
flags), for the commands that take an ``--upstream``: `calibrate`, `sidecar`. It prints
the exact command line, then becomes that llama-server (exec): its log is on this
terminal, Ctrl-C or SIGTERM stops it, and its exit code is this command's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys

from slogate_calibration.runtime import LlamaServer, RuntimeNotFound, locate
from slogate_cli.arguments import Subcommands, check_ports_free, port, positive_int
from slogate_cli.up_command import CTX, HOST, PARALLEL, THREADS


def add_parser(subparsers: Subcommands) -> None:
    """Register `llama-server`."""
    parser = subparsers.add_parser(
        "llama-server", help="run the bundled llama-server in the foreground, as `up` does", description=__doc__
    )
    parser.add_argument("--port", type=port, default=8080, help=f"its port, on {HOST}")
    parser.add_argument("--threads", type=positive_int, default=THREADS, help="llama-server threads")
    parser.add_argument("--parallel", type=positive_int, default=PARALLEL, help="llama-server slots")
    parser.add_argument("--ctx", type=positive_int, default=CTX, help="llama-server total context")
    parser.set_defaults(run=run)


def command_line(args: argparse.Namespace) -> tuple[str, ...]:
    """The llama-server command `up` would run with these settings; RuntimeNotFound without one."""
    server = LlamaServer(
        locate(), host=HOST, port=args.port, threads=args.threads, parallel=args.parallel, ctx=args.ctx
    )
    return server.args


def run(args: argparse.Namespace) -> int:
    """Print the command line, then exec it; returns only on an error found before."""
    try:
        if args.port == 0:
            raise ValueError("--port 0: give the port the next commands will use as --upstream")
        check_ports_free(HOST, {"--port": args.port})
        argv = command_line(args)
    except (RuntimeNotFound, ValueError) as error:
        sys.stderr.write(f"slogate llama-server: error: {error}\n")
        return 2
    print(shlex.join(argv), flush=True)
    sys.stderr.flush()
    # What Python ignores for itself, llama-server gets back as any shell would start it
    # (subprocess does the same for its children); a caught signal is reset by exec anyway.
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execv(argv[0], argv)
    except OSError as error:
        sys.stderr.write(f"slogate llama-server: error: cannot execute {argv[0]}: {error.strerror or error}\n")
        return 2
