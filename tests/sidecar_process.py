"""`slogate sidecar` as its own process on fixed ports, so that it can be signalled, killed and
started again on the same ports, as Kubernetes restarts a container (the drain tests)."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ports import free_ports
from slogate_admission.schema import Thresholds
from slogate_bench.live.gate_process import sidecar_argv
from slogate_bench.live.processes import stop_process, until_ready

READY_GUARD_S = 60.0
"""Not a performance bound: a sidecar not ready after this long is broken."""


@dataclass
class SidecarProcess:
    """One sidecar's command line; ``start`` runs it (again), always on the same two ports."""

    upstream: str
    work_dir: Path
    thresholds: Thresholds
    flags: tuple[str, ...] = ()
    """More `slogate sidecar` flags (--poll-interval, --drain-deadline ...)."""
    port: int = 0
    admin_port: int = 0
    child: asyncio.subprocess.Process | None = None
    starts: int = 0
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        if not (self.port and self.admin_port):
            self.port, self.admin_port = free_ports(2)
        self.log = self.work_dir / f"sidecar-{self.port}.log"
        (self.work_dir / f"thresholds-{self.port}.json").write_text(self.thresholds.model_dump_json(by_alias=True))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def hostport(self) -> str:
        """The client port as a balancer names it."""
        return f"127.0.0.1:{self.port}"

    async def start(self, *, ready: bool = True) -> None:
        """Run the sidecar; with ``ready``, return once /readyz answers 200 (upstream healthy)."""
        argv = [*sidecar_argv(self.upstream, self.work_dir / f"thresholds-{self.port}.json", self.port,
                              self.admin_port), *self.flags]  # fmt: skip
        with self.log.open("ab") as log:
            self.child = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
        self.starts += 1
        path = "/readyz" if ready else "/healthz"
        await until_ready("the sidecar", self.url + path, lambda: self.returncode, READY_GUARD_S, self.log)

    @property
    def returncode(self) -> int | None:
        return self.child.returncode if self.child is not None else None

    def send(self, signum: signal.Signals) -> None:
        assert self.child is not None
        self.child.send_signal(signum)

    async def exited(self) -> int:
        """Its exit code, once it exits by itself (bounded by the caller)."""
        assert self.child is not None
        return await self.child.wait()

    async def state(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(self.admin_url + "/slogate/v1/state") as response:
            response.raise_for_status()
            state: dict[str, Any] = await response.json()
            return state

    async def stop(self) -> None:
        """Stopped whatever it is doing (SIGTERM, then SIGKILL): for the tests' cleanup."""
        if self.child is not None:
            await stop_process(self.child, grace_s=5.0)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
