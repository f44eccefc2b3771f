"""The slogate sidecar as its own process, as it runs in a pod, for the benchmarks.

In-process, the gate would share one event loop with the load generator, and every
rejection's latency would include the generator's own work: a separate process is
both what production runs and what the client-side latency targets mean.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from slogate_admission.schema import Thresholds
from slogate_bench.baselines import stop_process
from slogate_bench.overhead import free_port


@dataclass(frozen=True)
class GateProcess:
    """Where a spawned sidecar listens."""

    url: str
    """Client port: what the load generator sends to (and /readyz)."""
    admin_url: str
    """Admin port: state and metrics."""

    async def state(self) -> dict[str, Any]:
        """The sidecar's GET /slogate/v1/state (live accounting, TTFT prediction error)."""
        async with aiohttp.ClientSession() as session, session.get(self.admin_url + "/slogate/v1/state") as r:
            r.raise_for_status()
            state: dict[str, Any] = await r.json()
            return state


def sidecar_argv(upstream: str, thresholds_file: Path, port: int, admin_port: int) -> list[str]:
    """`slogate sidecar` with these ports, run by this interpreter (the same install)."""
    return [
        sys.executable, "-m", "slogate_cli.main", "sidecar", "--upstream", upstream,
        "--thresholds", str(thresholds_file), "--port", str(port), "--admin-port", str(admin_port),
    ]  # fmt: skip


@asynccontextmanager
async def spawned_gate(
    upstream: str, thresholds: Thresholds, work_dir: Path, ready_timeout_s: float = 30.0
) -> AsyncIterator[GateProcess]:
    """A `slogate sidecar` process in front of ``upstream``, yielded once it reports ready."""
    work_dir.mkdir(parents=True, exist_ok=True)
    thresholds_file = work_dir / "bench-thresholds.json"
    thresholds_file.write_text(thresholds.model_dump_json(by_alias=True))
    port, admin_port = free_port(), free_port()
    log = (work_dir / "bench-sidecar.log").open("ab")
    child = await asyncio.create_subprocess_exec(
        *sidecar_argv(upstream, thresholds_file, port, admin_port), stdout=log, stderr=log
    )
    gate = GateProcess(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}")
    try:
        await _until_ready(gate, child, ready_timeout_s)
        yield gate
    finally:
        await stop_process(child)
        log.close()


async def _until_ready(gate: GateProcess, child: asyncio.subprocess.Process, timeout_s: float) -> None:
    async with aiohttp.ClientSession() as session:
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    if child.returncode is not None:
                        raise RuntimeError(f"the sidecar exited with {child.returncode} (see bench-sidecar.log)")
                    try:
                        async with session.get(gate.url + "/readyz") as r:  # readiness is on the client port
                            if r.status == 200:
                                return
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise RuntimeError(f"the sidecar was not ready within {timeout_s:g} s (see bench-sidecar.log)") from None
