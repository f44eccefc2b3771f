"""Child processes of the benchmarks: a free port to give them, readiness, a clean stop."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import aiohttp


def free_port() -> int:
    """A loopback port nothing listens on now (the child binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def until_ready(
    name: str, url: str, exit_code: Callable[[], int | None], timeout_s: float, log: Path | None
) -> None:
    """Poll ``url`` until it answers 200; RuntimeError naming ``name`` and its ``log`` if the child
    exits first (``exit_code()`` is not None) or time runs out."""
    async with aiohttp.ClientSession() as session:
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    if (code := exit_code()) is not None:
                        raise RuntimeError(f"{name} exited with {code}{_see(log)}")
                    try:
                        async with session.get(url) as r:
                            if r.status == 200:
                                return
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise RuntimeError(f"{name} was not ready within {timeout_s:g} s{_see(log)}") from None


def _see(log: Path | None) -> str:
    return f" (see {log})" if log is not None else ""


async def stop_process(child: asyncio.subprocess.Process, grace_s: float = 10.0) -> None:
    """SIGTERM (a graceful shutdown may wait for held streams), SIGKILL after ``grace_s``."""
    if child.returncode is not None:
        return
    child.terminate()
    try:
        async with asyncio.timeout(grace_s):
            await child.wait()
    except TimeoutError:
        child.kill()
        await child.wait()
