"""`slogate sidecar`: the per-pod admission gate in front of llama-server.

Thresholds come from ``--thresholds`` at start and from pushes to the admin port's
``PUT /slogate/v1/thresholds``, which must bear the token in ``--admin-token-file``:
without that flag the admin API refuses every threshold push (401), and the sidecar
says so once at start. SIGTERM or SIGINT drains it: not ready, new requests refused with
429, admitted streams given --drain-deadline seconds to finish; then it exits (a second
signal stops it at once).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

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
from slogate_sidecar.settings import OVERLOAD_STATUSES, PromptCounting, SidecarSettings

NO_TOKEN_WARNING = "the admin API refuses every threshold push (401) without --admin-token-file"
"""Said once at start: a sidecar without a token file only ever serves its boot thresholds."""


HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""An HTTP field name (RFC 9110 token)."""


def _default(name: str) -> Any:
    """A SidecarSettings field's default: the one place each default is stated."""
    (found,) = (f for f in dataclasses.fields(SidecarSettings) if f.name == name)
    return found.default


def header_name(text: str) -> str:
    """An HTTP header name."""
    if not HEADER_NAME.match(text):
        raise argparse.ArgumentTypeError(f"not an HTTP header name: {text!r}")
    return text


def add_parser(subparsers: Subcommands) -> None:
    """Register `sidecar`: one flag per SidecarSettings field, defaulting to the field's default."""
    parser = subparsers.add_parser(
        "sidecar", help="run the admission gate in front of llama-server", description=__doc__
    )
    parser.add_argument(
        "--upstream", type=http_url, required=True, help="llama-server base URL (same pod: http://127.0.0.1:8080)"
    )
    # Not required to exist: the operator mounts it from an optional ConfigMap, and a
    # sidecar without it starts not ready until thresholds are pushed (it logs why).
    parser.add_argument("--thresholds", type=Path, help="thresholds JSON at boot (the ConfigMap mount)")
    parser.add_argument("--host", default=_default("host"), help="bind address (0.0.0.0 in a pod)")
    parser.add_argument("--port", type=port, default=_default("port"), help="client port")
    parser.add_argument("--admin-port", type=port, default=_default("admin_port"), help="admin API and /metrics port")
    parser.add_argument(
        "--admin-token-file",
        type=existing_file,
        help="file holding the bearer token that PUT /slogate/v1/thresholds must bear (re-read on every push); "
        "without it the admin API refuses every threshold push (401)",
    )
    parser.add_argument("--api-key-classes", type=existing_file, help="JSON file: {api key: class}")
    parser.add_argument(
        "--api-key-tenants",
        type=existing_file,
        help="JSON file: {api key: tenant}, the tenant of a request without the tenant header, read only while "
        "the thresholds carry a tenant policy (spec.tenants)",
    )
    parser.add_argument(
        "--class-header",
        type=header_name,
        default=_default("class_header"),
        help="request header naming the request's class, ahead of --api-key-classes; a class the policy does not "
        "list is served as its defaultClass (default: %(default)s)",
    )
    parser.add_argument(
        "--prompt-counting",
        choices=[m.value for m in PromptCounting],
        default=_default("prompt_counting").value,
        help="n_in from llama-server's /tokenize (exact, a loopback call) or estimated from characters",
    )
    parser.add_argument(
        "--max-body-bytes", type=positive_int, default=_default("max_body_bytes"), help="larger request bodies get 413"
    )
    parser.add_argument(
        "--max-output-tokens",
        type=positive_int,
        default=_default("max_output_tokens"),
        help="an output limit (max_tokens, n_predict, ...) above this is refused with 400 as absurd; "
        "what fits the KV cache is the gate's decision, not this bound's",
    )
    parser.add_argument(
        "--upstream-connect-timeout",
        type=positive_float,
        default=_default("upstream_connect_timeout_s"),
        help="seconds to connect to llama-server: 504 beyond (a refused connection is 503 at once)",
    )
    parser.add_argument(
        "--upstream-read-timeout",
        type=positive_float,
        default=_default("upstream_read_timeout_s"),
        help="seconds without upstream bytes: 504",
    )
    parser.add_argument(
        "--client-read-timeout",
        type=positive_float,
        default=_default("client_read_timeout_s"),
        help="seconds a client has to send its whole request, on both ports (headers late: the connection "
        "is closed; body late: 408); also how long an idle keep-alive connection stays open",
    )
    parser.add_argument(
        "--poll-interval",
        type=positive_float,
        default=_default("poll_interval_s"),
        help="seconds between reads of llama-server's /health and /metrics (the live rates)",
    )
    parser.add_argument(
        "--rate-max-age",
        type=positive_float,
        default=_default("rate_max_age_s"),
        help="seconds after which a live rate is stale and the calibrated one is used again",
    )
    parser.add_argument(
        "--drain-deadline",
        type=positive_float,
        default=_default("drain_deadline_s"),
        help="seconds admitted streams may run on once a drain begins (SIGTERM; or GET /slogate/v1/drain on the "
        "admin port, the llama.cpp container's preStop hook, answered then at the latest); after a SIGTERM, "
        "streams still running then are cut and the sidecar exits",
    )
    parser.add_argument(
        "--overload-status",
        type=int,
        choices=OVERLOAD_STATUSES,
        default=_default("overload_status"),
        help="the status of a deliberate shed (the gate's refusal, a drain's), with its Retry-After: 429 for "
        "clients and gateways that retry later or elsewhere; 503 (vLLM's, SGLang's) or 529 (NVIDIA Dynamo's) "
        "for clients built for those. A 5xx counts against availability SLOs and makes Envoy's outlier "
        "detection eject the pod (docs/routing.md)",
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


def key_map(flag: str, path: Path | None) -> dict[str, str]:
    """A JSON file of {api key: name}; empty without the flag. A bad file is a one-line error."""
    if path is None:
        return {}
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{flag} {path}: {error}") from None
    if not isinstance(loaded, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()):
        raise ValueError(f"{flag} {path}: expected a JSON object of strings")
    return loaded


def settings_from(args: argparse.Namespace) -> SidecarSettings:
    """Settings from flags; a bad key-class or key-tenant file is a one-line error."""
    return SidecarSettings(
        upstream=args.upstream,
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        thresholds_file=args.thresholds,
        admin_token_file=args.admin_token_file,
        api_key_classes=key_map("--api-key-classes", args.api_key_classes),
        api_key_tenants=key_map("--api-key-tenants", args.api_key_tenants),
        class_header=args.class_header,
        prompt_counting=PromptCounting(args.prompt_counting),
        max_body_bytes=args.max_body_bytes,
        max_output_tokens=args.max_output_tokens,
        upstream_connect_timeout_s=args.upstream_connect_timeout,
        upstream_read_timeout_s=args.upstream_read_timeout,
        client_read_timeout_s=args.client_read_timeout,
        poll_interval_s=args.poll_interval,
        rate_max_age_s=args.rate_max_age,
        drain_deadline_s=args.drain_deadline,
        overload_status=args.overload_status,
        expose_upstream_admin=args.expose_upstream_admin,
        access_log=not args.no_access_log,
    )


def markdown_table(parser: argparse.ArgumentParser) -> str:
    """The flags table of docs/sidecar.md: each flag's help as --help shows it, default included."""
    formatter = parser._get_formatter()
    rows = ["| flag | meaning |", "| --- | --- |"]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        meaning = formatter._expand_help(action) + (" (required)" if action.required else "")
        rows.append(f"| `{action.option_strings[0]}` | {meaning} |")
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT has drained the sidecar (a second one stops it at once)."""
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
        try:
            await serve_forever(settings)  # it handles SIGTERM and SIGINT: a drain, then it returns
        except asyncio.CancelledError:  # a second signal
            logging.getLogger("slogate.sidecar").info("stopping")

    try:
        asyncio.run(main())
    except OSError as error:
        sys.stderr.write(f"slogate sidecar: error: {error}\n")
        return 2
    return 0
