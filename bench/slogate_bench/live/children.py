"""Child servers a run starts beside llama-server (a sidecar on either event loop, the bare
rejector, nginx's peers): each started as the benchmarks start it, ready once a path answers
200, and stopped on exit; and the one stream that holds a one-slot gate full."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from slogate_admission.schema import Thresholds
from slogate_bench.live.event_loops import Loop, launcher
from slogate_bench.live.gate_process import sidecar_argv
from slogate_bench.live.processes import free_port, stop_process, until_ready
from slogate_bench.live.stub_upstream import HOLD_TOKEN
from slogate_calibration.output import write_atomic


@dataclass(frozen=True)
class Child:
    """A server the run started: where it answers, its process."""

    url: str
    pid: int


@asynccontextmanager
async def spawned(name: str, argv: list[str], ready_path: str, port: int, log_dir: Path) -> AsyncIterator[Child]:
    """A child server on ``port``, once ``ready_path`` answers 200; stopped on exit."""
    log = log_dir / f"{name}.log"
    with log.open("ab") as sink:
        child = await asyncio.create_subprocess_exec(*argv, stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    try:
        await until_ready(name, url + ready_path, lambda: child.returncode, 30.0, log)
        yield Child(url, child.pid)
    finally:
        await stop_process(child)


def sidecar(
    name: str, loop: Loop, upstream: str, thresholds: Thresholds, log_dir: Path, *extra: str
) -> AbstractAsyncContextManager[Child]:
    """`slogate sidecar` as the benchmarks start it (``gate_process.sidecar_argv``), on ``loop``,
    with ``extra`` flags."""
    thresholds_file = log_dir / f"{name}-thresholds.json"
    write_atomic(thresholds_file, thresholds.model_dump_json(by_alias=True))
    port = free_port()
    argv = sidecar_argv(upstream, thresholds_file, port, free_port())
    return spawned(name, [*launcher(loop), *argv[2:], *extra], "/readyz", port, log_dir)


def bare(loop: Loop, log_dir: Path) -> AbstractAsyncContextManager[Child]:
    """The bare aiohttp 429 server on ``loop``."""
    port = free_port()
    return spawned(
        f"bare-{loop}", [*launcher(loop), "slogate_bench.live.bare_rejector", str(port)], "/health", port, log_dir
    )


async def hold(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    """One stream the stub never ends: it fills a one-slot gate, which then refuses every probe."""
    body = {"prompt": [HOLD_TOKEN, 1, 2], "n_predict": 1, "stream": True}
    response = await session.post(url + "/completion", json=body)
    if response.status != 200:
        raise RuntimeError(f"the held stream through {url} got {response.status}")
    return response
