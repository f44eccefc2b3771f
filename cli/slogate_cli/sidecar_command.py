"""`slogate sidecar`: the per-pod admission gate in front of llama-server."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from slogate_cli.arguments import Subcommands, positive_float, positive_int
from slogate_sidecar.app import serve_forever
from slogate_sidecar.settings import PromptCounting, SidecarSettings


def add_parser(subparsers: Subcommands) -> None:
    """Register `sidecar`."""
    parser = subparsers.add_parser(
        "sidecar", help="run the admission gate in front of llama-server", description=__doc__
    )
    parser.add_argument("--upstream", required=True, help="llama-server base URL (same pod: http://127.0.0.1:8080)")
    parser.add_argument("--thresholds", type=Path, help="thresholds JSON at boot (the ConfigMap mount)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, default=8081, help="client port")
    parser.add_argument("--admin-port", type=int, default=8082, help="admin API and /metrics port")
    parser.add_argument("--admin-token-file", type=Path, help="bearer token for pushing thresholds")
    parser.add_argument("--api-key-classes", type=Path, help="JSON file: {api key: class}")
    parser.add_argument(
        "--prompt-counting",
        choices=[m.value for m in PromptCounting],
        default=PromptCounting.TOKENIZE.value,
    )
    parser.add_argument("--max-body-bytes", type=positive_int, default=1 << 20)
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
        upstream=args.upstream.rstrip("/"),
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
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = settings_from(args)
    except ValueError as error:
        sys.stderr.write(f"slogate sidecar: error: {error}\n")
        return 2

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
