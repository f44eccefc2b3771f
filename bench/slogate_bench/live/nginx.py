"""Debian's nginx, the C floor of a 429: the same client, machine and moment, no Python serving.

One nginx (one worker, like the sidecar's one process) with two ways to refuse:

- ``/return/completion``: ``return 429`` in the rewrite phase, the least an HTTP server can
  do for a request (nginx discards the body it does not read);
- ``/limit/completion``: a ``limit_req`` zone at one request a minute, so every request but
  about one a minute is refused with 429 (that one gets a 404): how a C rate limiter in front answers.

Both answer the same small JSON error with a Retry-After. Everything nginx writes (its pid,
logs, temporary directories) stays under a prefix of the benchmark's own; no system file is
read or changed. Needs the nginx binary: ``apt-get install -y nginx-light`` (Debian's).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from slogate_bench.live.processes import free_port, stop_process, until_ready

NGINX_HINT = "nginx not found: apt-get install -y nginx-light (Debian's nginx)"
ERROR_BODY = '{"error":{"message":"over capacity","type":"rate_limit_error","param":null,"code":"nginx_floor"}}'
"""The same shape as the bare aiohttp server's and the sidecar's rejections."""
RETURN_PATH, LIMIT_PATH = "/return", "/limit"
"""Base paths of the two ways to refuse; clients append ``/completion``."""


_TEMP_KINDS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def temp_paths(prefix: Path) -> str:
    """The ``*_temp_path`` lines that keep nginx's temporary files under ``prefix``."""
    return "\n".join(f"    {kind}_temp_path {prefix / 'temp' / kind};" for kind in _TEMP_KINDS)


def main_context(prefix: Path, written_by: str, worker_connections: int) -> str:
    """What every nginx.conf of ours starts with: one worker in the foreground, its pid and
    error log under ``prefix``, and its ``events`` block."""
    return f"""# Written by {written_by}.
daemon off;
master_process on;
worker_processes 1;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;

events {{
    worker_connections {worker_connections};
}}"""


def nginx_config(port: int, prefix: Path) -> str:
    """The whole nginx.conf: one worker on 127.0.0.1:``port``, files under ``prefix``, no access log."""
    temp = temp_paths(prefix)
    return f"""{main_context(prefix, "slogate_bench.live.nginx for the reject-latency benchmark", 1024)}

http {{
    access_log off;
    default_type application/json;
{temp}
    # One request a minute per client address (all are 127.0.0.1): after the first, every
    # request is over the limit. (An empty key, as $server_name is here, is never limited.)
    limit_req_zone $binary_remote_addr zone=floor:1m rate=1r/m;

    server {{
        listen 127.0.0.1:{port};

        location = /health {{
            return 200 "ok\\n";
        }}
        location = {RETURN_PATH}/completion {{
            add_header Retry-After 1 always;
            return 429 '{ERROR_BODY}';
        }}
        location = {LIMIT_PATH}/completion {{
            # limit_req runs in the preaccess phase, after any `return` (rewrite phase): the
            # refusal's body comes from error_page, and a request let through gets the static
            # handler's 404 (no such file), which the benchmark counts apart.
            limit_req zone=floor;
            limit_req_status 429;
            limit_req_log_level notice;  # below error_log's warn: a refusal writes no log line
            error_page 429 = @refused;
        }}
        location @refused {{
            add_header Retry-After 1 always;
            return 429 '{ERROR_BODY}';
        }}
    }}
}}
"""


@dataclass(frozen=True)
class NginxProcess:
    """A running nginx."""

    url: str
    """Its base URL (``RETURN_PATH`` and ``LIMIT_PATH`` below it)."""
    pid: int
    """The master's process (its worker is a child)."""


def nginx_version(binary: str = "nginx") -> str | None:
    """``nginx/1.22.1`` as nginx -v prints it, or None when it is not installed."""
    path = shutil.which(binary)
    if path is None:
        return None
    import subprocess  # noqa: PLC0415 (only here, once)

    done = subprocess.run([path, "-v"], capture_output=True, text=True, check=False)
    text = (done.stderr or done.stdout).strip()
    return text.split(":", 1)[1].strip() if ":" in text else text or None


@asynccontextmanager
async def spawned_nginx(work_dir: Path, ready_timeout_s: float = 15.0) -> AsyncIterator[NginxProcess]:
    """The reject floor's nginx (``nginx_config``) under ``work_dir/nginx``, once it answers."""
    async with running_nginx(work_dir / "nginx", nginx_config, ready_timeout_s) as nginx:
        yield nginx


@asynccontextmanager
async def running_nginx(
    prefix: Path, config_for: Callable[[int, Path], str], ready_timeout_s: float = 15.0
) -> AsyncIterator[NginxProcess]:
    """nginx in the foreground (``daemon off``) with the config ``config_for(port, prefix)``
    written under ``prefix``, once its ``/health`` answers 200; stopped on exit.

    Every config given here listens on 127.0.0.1:port, answers ``/health`` itself and keeps
    its files under ``prefix`` (``temp_paths``), so nothing of the system's nginx is touched.
    """
    binary = shutil.which("nginx")
    if binary is None:
        raise RuntimeError(NGINX_HINT)
    prefix = prefix.resolve()
    for kind in _TEMP_KINDS:
        (prefix / "temp" / kind).mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = prefix / "nginx.conf"
    config.write_text(config_for(port, prefix))
    log = prefix / "stderr.log"
    with log.open("ab") as sink:
        child = await asyncio.create_subprocess_exec(
            binary, "-p", str(prefix), "-c", str(config), "-e", str(prefix / "error.log"), stdout=sink, stderr=sink
        )
    url = f"http://127.0.0.1:{port}"
    try:
        await until_ready("nginx", url + "/health", lambda: child.returncode, ready_timeout_s, log)
        yield NginxProcess(url, child.pid)
    finally:
        await stop_process(child)
