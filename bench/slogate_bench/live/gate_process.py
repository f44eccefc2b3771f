"""The slogate sidecar as its own process, as it runs in a pod, for the benchmarks.

In-process, the gate would share one event loop with the load generator, and every
rejection's latency would include the generator's own work: a separate process is
both what production runs and what the client-side latency targets mean.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from slogate_admission.schema import Thresholds
from slogate_bench.live.processes import free_port, stop_process, until_ready
from slogate_calibration.output import write_atomic


@dataclass(frozen=True)
class GateProcess:
    """Where a spawned sidecar listens, and what it can tell."""

    url: str
    """Client port: what the load generator sends to (and /readyz)."""
    admin_url: str
    """Admin port: state and metrics."""
    pid: int
    """The sidecar's process, for its memory and CPU time."""

    async def deferrals(self) -> dict[str, int]:
        """How deferrals ended, summed over classes: ``slogate_deferral_outcomes_total`` by result."""
        ended: dict[str, int] = {}
        for family in text_string_to_metric_families(await self.metrics()):
            if family.name == "slogate_deferral_outcomes":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        result = sample.labels["result"]
                        ended[result] = ended.get(result, 0) + int(sample.value)
        return ended

    async def metrics(self) -> str:
        """The sidecar's Prometheus text."""
        async with aiohttp.ClientSession() as session, session.get(self.admin_url + "/metrics") as r:
            r.raise_for_status()
            return await r.text()

    async def state(self) -> dict[str, Any]:
        """The sidecar's GET /slogate/v1/state (live accounting, TTFT prediction error)."""
        async with aiohttp.ClientSession() as session, session.get(self.admin_url + "/slogate/v1/state") as r:
            r.raise_for_status()
            state: dict[str, Any] = await r.json()
            return state

    async def books(self) -> dict[str, Any]:
        """Its state with how its deferrals ended: what a benchmark run records of the gate."""
        return {**await self.state(), "deferrals": await self.deferrals()}


def sidecar_argv(upstream: str, thresholds_file: Path, port: int, admin_port: int) -> list[str]:
    """`slogate sidecar` with these ports, run by this interpreter (the same install)."""
    return [
        sys.executable,
        "-m",
        "slogate_cli.main",
        "sidecar",
        "--upstream",
        upstream,
        "--thresholds",
        str(thresholds_file),
        "--port",
        str(port),
        "--admin-port",
        str(admin_port),
    ]


@asynccontextmanager
async def spawned_gate(
    upstream: str,
    thresholds: Thresholds,
    work_dir: Path,
    *,
    admin_token: bool = False,
    cpus: str | None = None,
    ready_timeout_s: float = 30.0,
) -> AsyncIterator[GateProcess]:
    """A `slogate sidecar` process in front of ``upstream``, yielded once it reports ready.

    Its thresholds, token and log are files in ``work_dir`` (sidecar-*). ``admin_token``:
    started with a token file, as the operator deploys it; ``cpus``: pinned to these CPUs
    (taskset's list, e.g. ``0``).
    """
    thresholds_file, token_file, log_file = (
        work_dir / name for name in ("sidecar-thresholds.json", "sidecar-token", "sidecar.log")
    )
    write_atomic(thresholds_file, thresholds.model_dump_json(by_alias=True))
    port, admin_port = free_port(), free_port()
    argv = sidecar_argv(upstream, thresholds_file, port, admin_port)
    if admin_token:
        write_atomic(token_file, os.urandom(16).hex())
        argv += ["--admin-token-file", str(token_file)]
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    with log_file.open("ab") as log:
        child = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
    gate = GateProcess(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", child.pid)
    try:
        # Readiness is on the client port.
        await until_ready("the sidecar", gate.url + "/readyz", lambda: child.returncode, ready_timeout_s, log_file)
        yield gate
    finally:
        await stop_process(child)
