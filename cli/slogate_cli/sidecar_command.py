"""`slogate sidecar`: the per-pod admission gate in front of llama-server.

Thresholds come from ``--thresholds`` at start and from pushes to the admin port's
``PUT /slogate/v1/thresholds``, which must bear the token in ``--admin-token-file``:
without that flag the admin API refuses every threshold push (401), and the sidecar
says so once at start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from slogate_cli.arguments import (
    Subcommands,
    check_ports_free,
    existing_file,
    http_url,
    port,
    positive_float,
    positive_int,
)
from slogate_sidecar.app import serve_forever
from slogate_sidecar.settings import PromptCounting, SidecarSettings

NO_TOKEN_WARNING = "the admin API refuses every threshold push (401) without --admin-token-file"
"""Said once at start: a sidecar without a token file only ever serves its boot thresholds."""


def add_parser(subparsers: Subcommands) -> None:
    """Register `sidecar`."""
    parser = subparsers.add_parser(
        "sidecar", help="run the admission gate in front of llama-server", description=__doc__
    )
    parser.add_argument(
        "--upstream", type=http_url, required=True, help="llama-server base URL (same pod: http://127.0.0.1:8080)"
    )
    # Not required to exist: the operator mounts it from an optional ConfigMap, and a
    # sidecar without it starts not ready until thresholds are pushed (it logs why).
    parser.add_argument("--thresholds", type=Path, help="thresholds JSON at boot (the ConfigMap mount)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 in a pod)")
    parser.add_argument("--port", type=port, default=8081, help="client port")
    parser.add_argument("--admin-port", type=port, default=8082, help="admin API and /metrics port")
    parser.add_argument(
        "--admin-token-file",
        type=existing_file,
        help="file holding the bearer token that PUT /slogate/v1/thresholds must bear (re-read on every push); "
        "without it the admin API refuses every threshold push (401)",
    )
    parser.add_argument("--api-key-classes", type=existing_file, help="JSON file: {api key: class}")
    parser.add_argument(
        "--prompt-counting",
        choices=[m.value for m in PromptCounting],
        default=PromptCounting.TOKENIZE.value,
        help="n_in from llama-server's /tokenize (exact, a loopback call) or estimated from characters",
    )
    parser.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="larger request bodies get 413")
    parser.add_argument(
        "--upstream-read-timeout",
        type=positive_float,
        default=60.0,
        help="seconds without upstream bytes: 504",
    )
    parser.add_argument(
        "--expose-upstream-admin",
        action="store_true",
        help="pass llama-server's other endpoints through",
    )
    parser.add_argument(
        "--no-access-log", action="store_true", help="no per-request log line (method, path, status, class, outcome)"
    )
    parser.set_defaults(run=run)


def settings_from(args: argparse.Namespace) -> SidecarSettings:
    """Settings from flags; a bad key-class file is a one-line error."""
    classes: dict[str, str] = {}
    if args.api_key_classes is not None:
        try:
            loaded = json.loads(args.api_key_classes.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"--api-key-classes {args.api_key_classes}: {error}") from None
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()
        ):
            raise ValueError(f"--api-key-classes {args.api_key_classes}: expected a JSON object of strings")
        classes = loaded
    return SidecarSettings(
        upstream=args.upstream,
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        thresholds_file=args.thresholds,
        admin_token_file=args.admin_token_file,
        api_key_classes=classes,
        prompt_counting=PromptCounting(args.prompt_counting),
        max_body_bytes=args.max_body_bytes,
        upstream_read_timeout_s=args.upstream_read_timeout,
        expose_upstream_admin=args.expose_upstream_admin,
        access_log=not args.no_access_log,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = settings_from(args)
        check_ports_free(settings.host, {"--port": settings.port, "--admin-port": settings.admin_port})
    except ValueError as error:
        sys.stderr.write(f"slogate sidecar: error: {error}\n")
        return 2
    if settings.admin_token_file is None:
        logging.getLogger("slogate.sidecar").warning(NO_TOKEN_WARNING)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await serve_forever(settings)
        except asyncio.CancelledError:
            logging.getLogger("slogate.sidecar").info("stopping")

    try:
        asyncio.run(main())
    except OSError as error:
        sys.stderr.write(f"slogate sidecar: error: {error}\n")
        return 2
    return 0
