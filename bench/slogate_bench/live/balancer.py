"""Debian's nginx as the fleet's load balancer: an upstream of pods, a routing rule, retry on shed.

This is the real balancer of the fleet tests and benchmarks (never one of our own): the
same directives a user writes in front of a Deployment of llama.cpp pods (docs/routing.md).

- ``random``: nginx's ``random`` (each request to a pod drawn uniformly), what a
  Kubernetes Service's connection spreading amounts to;
- ``least_conn``: the pod with the fewest requests in flight through this nginx;
- ``round_robin``: nginx's default.

``tries`` > 1 turns on retry on shed: ``proxy_next_upstream error http_429 http_503
non_idempotent`` with ``proxy_next_upstream_tries``. A sidecar's 429 and 503 are answered
before anything reaches llama-server (docs/routing.md, "A refusal is safe to retry"), so
sending the POST to the next pod cannot run a generation twice; ``error`` covers a pod
that is gone (connection refused). ``max_fails=0`` on every server: by default nginx takes
a server out for ``fail_timeout`` (10 s) after one failed try, and with ``http_429``
listed a shed counts as failed, so one busy moment would blind nginx to that pod.
Streaming is relayed unbuffered (``proxy_buffering off``): a first token reaches the
client when the pod sends it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from slogate_bench.live.nginx import NginxProcess, main_context, running_nginx, temp_paths

Routing = Literal["random", "least_conn", "round_robin"]
ROUTINGS: tuple[Routing, ...] = ("random", "least_conn", "round_robin")
_UPSTREAM_RULE = {"random": "random;", "least_conn": "least_conn;", "round_robin": "# round robin: nginx's default"}
TRIED_HEADER = "X-Slogate-Upstreams"
"""Response header nginx adds: every pod tried for the request (``$upstream_addr``,
comma-separated), so a client can count its tries."""


@dataclass(frozen=True)
class Balancing:
    """How nginx spreads requests over the pods."""

    routing: Routing = "random"
    """The upstream's rule (see the module's docstring)."""
    tries: int = 1
    """Pods tried per request, the first included (``proxy_next_upstream_tries``); 1: no retry."""
    read_timeout_s: float = 300.0
    """``proxy_read_timeout``: longer than any generation of the benchmark."""

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"unknown routing {self.routing!r}: one of {', '.join(ROUTINGS)}")
        if self.tries < 1:
            raise ValueError(f"tries must be >= 1, not {self.tries}")


def balancer_config(port: int, prefix: Path, pods: Sequence[str], balancing: Balancing) -> str:
    """The whole nginx.conf: 127.0.0.1:``port`` spreading over ``pods`` (``host:port`` each)."""
    if not pods:
        raise ValueError("a balancer needs at least one pod")
    servers = "\n".join(f"        server {pod} max_fails=0;" for pod in pods)
    if balancing.tries > 1:
        retry = (
            "        proxy_next_upstream error http_429 http_503 non_idempotent;\n"
            f"        proxy_next_upstream_tries {balancing.tries};"
        )
    else:
        retry = "        proxy_next_upstream off;"
    written_by = f"slogate_bench.live.balancer: {balancing.routing}, {balancing.tries} tries"
    return f"""{main_context(prefix, written_by, 4096)}

http {{
    access_log off;
{temp_paths(prefix)}
    upstream pods {{
        {_UPSTREAM_RULE[balancing.routing]}
{servers}
        keepalive 64;
    }}

    server {{
        listen 127.0.0.1:{port};

        location = /health {{
            default_type text/plain;
            return 200 "ok\\n";
        }}
        location / {{
            proxy_pass http://pods;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering on;
            proxy_read_timeout {balancing.read_timeout_s:g}s;
            client_max_body_size 1m;
{retry}
            add_header {TRIED_HEADER} $upstream_addr always;
        }}
    }}
}}
"""


@asynccontextmanager
async def spawned_balancer(
    work_dir: Path, pods: Sequence[str], balancing: Balancing, ready_timeout_s: float = 15.0
) -> AsyncIterator[NginxProcess]:
    """nginx balancing over ``pods`` (files under ``work_dir/balancer``), once it answers."""
    config = partial(_config_for, pods=tuple(pods), balancing=balancing)
    async with running_nginx(work_dir / "balancer", config, ready_timeout_s) as nginx:
        yield nginx


def _config_for(port: int, prefix: Path, *, pods: tuple[str, ...], balancing: Balancing) -> str:
    return balancer_config(port, prefix, pods, balancing)


def upstreams_of(tried_header: str | None) -> tuple[str, ...]:
    """The pods nginx tried, in order, from the ``TRIED_HEADER`` value: ``$upstream_addr``
    separates tries by commas and upstream groups by `` : `` (``a:1, b:2`` or ``a:1 : b:2``)."""
    if not tried_header:
        return ()
    return tuple(part.strip() for part in tried_header.replace(" : ", ",").split(",") if part.strip())


def tries_of(tried_header: str | None) -> int:
    """How many pods nginx tried, from the ``TRIED_HEADER`` value."""
    return len(upstreams_of(tried_header))
