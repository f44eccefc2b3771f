"""What stands between the benchmark's clients and the real llama-server: one interface.

A front has a name and starts in front of an upstream URL; started, it says where clients
send, its own process (if it has one), and its books at the end of a run (if it keeps
any). The runners start any front the same way; only the fronts know what they are:

- ``direct``: llama-server alone, its own unbounded queue (nothing to start);
- ``count-cap``: ``baselines.CountCapProxy`` in its own process (503 when full);
- ``rate-limit``: ``baselines.RateLimitProxy`` in its own process (429 when empty);
- ``slogate``: the sidecar in its own process (``gate_process``), which keeps books.

``line_up`` tunes all four once from the same calibration and SLO. The simulator's
fronts (``fronts``) are the same four ideas in virtual time.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from slogate_admission.schema import Thresholds
from slogate_bench.live.gate_process import GateProcess, spawned_gate
from slogate_bench.live.processes import stop_process
from slogate_sim.limits import CountCap, RateLimit, fair_count_cap, fair_rate_limit


class Started(Protocol):
    """A front, running."""

    @property
    def url(self) -> str:
        """Where clients send."""
        ...

    @property
    def pid(self) -> int | None:
        """Its own process (None: it has none)."""
        ...

    async def books(self) -> dict[str, Any] | None:
        """What it saw, read at the end of a run (None: it keeps no books)."""
        ...


class Front(Protocol):
    """Something clients can be sent through to llama-server."""

    @property
    def name(self) -> str:
        """What runs and reports call it."""
        ...

    def in_front_of(self, upstream: str, work_dir: Path) -> AbstractAsyncContextManager[Started]:
        """Started in front of ``upstream`` (files, logs in ``work_dir``); stopped on exit."""
        ...


@dataclass(frozen=True)
class Bookless:
    """A started front that keeps no books."""

    url: str
    """Where clients send."""
    pid: int | None = None
    """Its own process (None: it has none)."""

    async def books(self) -> None:
        """None: nothing to report."""


@dataclass(frozen=True)
class DirectFront:
    """llama-server alone."""

    name: str = "direct"
    """What runs and reports call it."""

    @asynccontextmanager
    async def in_front_of(self, upstream: str, work_dir: Path) -> AsyncIterator[Started]:  # noqa: ARG002
        """The upstream itself (no files: ``work_dir`` is the interface's)."""
        yield Bookless(upstream)


@dataclass(frozen=True)
class CountCapFront:
    """A count cap, in its own process."""

    cap: CountCap
    """Its concurrency and queue."""
    name: str = "count-cap"
    """What runs and reports call it."""

    def in_front_of(self, upstream: str, work_dir: Path) -> AbstractAsyncContextManager[Started]:
        """``python -m slogate_bench.live.baselines ... count-cap``."""
        argv = ["count-cap", "--concurrency", str(self.cap.concurrency), "--queue", str(self.cap.queue)]
        return spawned_proxy(self.name, upstream, argv, work_dir)


@dataclass(frozen=True)
class RateLimitFront:
    """A token bucket, in its own process."""

    limit: RateLimit
    """Its rate and burst."""
    name: str = "rate-limit"
    """What runs and reports call it."""

    def in_front_of(self, upstream: str, work_dir: Path) -> AbstractAsyncContextManager[Started]:
        """``python -m slogate_bench.live.baselines ... rate-limit``."""
        argv = ["rate-limit", "--rate-rps", repr(self.limit.rate_rps), "--burst", str(self.limit.burst)]
        return spawned_proxy(self.name, upstream, argv, work_dir)


@dataclass(frozen=True)
class SlogateFront:
    """The slogate sidecar, in its own process."""

    thresholds: Thresholds
    """What it enforces from the start."""
    admin_token: bool = False
    """Started with an admin token file, as the operator deploys it (threshold pushes allowed)."""
    cpus: str | None = None
    """Pinned to these CPUs (taskset's list, e.g. ``0``); None: wherever the kernel runs it."""
    name: str = "slogate"
    """What runs and reports call it."""

    def in_front_of(self, upstream: str, work_dir: Path) -> AbstractAsyncContextManager[GateProcess]:
        """`slogate sidecar`, ready; its books are its state and how its deferrals ended (and the
        process it yields can tell more: its metrics, for the soak)."""
        return spawned_gate(upstream, self.thresholds, work_dir, admin_token=self.admin_token, cpus=self.cpus)


@asynccontextmanager
async def spawned_proxy(name: str, upstream: str, argv: list[str], work_dir: Path) -> AsyncIterator[Started]:
    """A baseline proxy in a child process (its CPU is not the load generator's), once it prints its URL."""
    work_dir.mkdir(parents=True, exist_ok=True)
    log = work_dir / f"{name}.log"
    command = [sys.executable, "-m", "slogate_bench.live.baselines", "--upstream", upstream, *argv]
    with log.open("ab") as sink:
        child = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, stderr=sink)
    try:
        assert child.stdout is not None
        async with asyncio.timeout(30):
            line = (await child.stdout.readline()).decode().strip()
        if not line.startswith("http://"):
            raise RuntimeError(f"the {name} proxy did not start (exit {await child.wait()}; see {log})")
        yield Bookless(line, child.pid)
    finally:
        await stop_process(child)


@dataclass(frozen=True)
class LineUp:
    """The benchmark's four fronts, tuned from one calibration and SLO."""

    direct: DirectFront
    """llama-server alone."""
    count_cap: CountCapFront
    """slots in flight, ⌊SLO · μ⌋ waiting."""
    rate_limit: RateLimitFront
    """μ per second, a burst of slots."""
    slogate: SlogateFront
    """The derived thresholds."""

    def each(self) -> tuple[Front, ...]:
        """All four, in the reports' order."""
        return (self.direct, self.count_cap, self.rate_limit, self.slogate)


def line_up(thresholds: Thresholds, mu: float, slo_s: float) -> LineUp:
    """Each front tuned fairly: the count cap and the rate limit from μ of the workload they will
    carry and the SLO (``limits``), slogate from its thresholds; the slots are the concurrency cap."""
    slots = thresholds.concurrency_cap
    return LineUp(
        DirectFront(),
        CountCapFront(fair_count_cap(slots, slo_s, slots / mu)),
        RateLimitFront(fair_rate_limit(mu, slots)),
        SlogateFront(thresholds),
    )
