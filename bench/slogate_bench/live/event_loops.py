"""Which event loop a benchmark child runs on: asyncio's own, or uvloop (libuv, in C).

The reject-latency benchmark runs the same server code on both loops side by side. Rather
than teach every server a flag, a child is started through ``launcher(loop)``: for
``uvloop`` that is ``python -m slogate_bench.live.event_loops MODULE ARGS...``, which installs
uvloop's policy and then runs ``MODULE`` as ``python -m MODULE ARGS...`` would. Every
``asyncio.run`` (and aiohttp's ``run_app``) in that process then makes a uvloop loop.
"""

from __future__ import annotations

import asyncio
import importlib
import runpy
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Literal, get_args

Loop = Literal["asyncio", "uvloop"]
LOOPS: tuple[Loop, ...] = get_args(Loop)


def launcher(loop: Loop) -> list[str]:
    """The argv prefix that runs a module (the next argument) on ``loop``."""
    if loop == "asyncio":
        return [sys.executable, "-m"]
    return [sys.executable, "-m", "slogate_bench.live.event_loops"]


def uvloop_version() -> str | None:
    """uvloop's version, or None when it is not installed (the benchmark then says how to get it)."""
    try:
        return version("uvloop")
    except PackageNotFoundError:
        return None


def run_on_uvloop(argv: list[str]) -> None:
    """``argv`` is ``[MODULE, ARGS...]``: run MODULE as ``__main__`` with uvloop's loop policy."""
    # Imported by name: uvloop is no dependency of slogate (`make bench-reject` installs it),
    # so neither the type checker nor any other process needs it.
    uvloop = importlib.import_module("uvloop")
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m slogate_bench.live.event_loops MODULE [ARGS...]")
    run_on_uvloop(sys.argv[1:])
