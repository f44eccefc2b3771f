"""`slogate demo`'s work: the same overload straight at llama-server, then through slogate.

Starts the bundled llama-server, takes its cached profile or calibrates it
(``profile_cache``), derives thresholds for the TTFT SLO, and sends the same open-loop
burst (``load`` x μ of 200-token prompts with 32 tokens out, clients giving up after
10 s) through two fronts in turn (``live.fronts``: llama-server alone, then the sidecar
in its own process), waiting in between until llama-server has worked off what the first
burst left in it. The CLI parses, prints the table and draws the picture.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rich.table import Table

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_bench.live.fronts import DirectFront, Front, SlogateFront
from slogate_bench.live.load import open_loop
from slogate_bench.results import OUTCOME_COLUMNS, Run, outcome_counts
from slogate_calibration.calibrate import CalibrationSettings, Progress
from slogate_calibration.output import write_atomic
from slogate_calibration.profile_cache import Say, cached_or_calibrated, no_progress
from slogate_calibration.runtime import LlamaServer, locate
from slogate_llama.client import LlamaClient
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.workloads import preset

WORKLOAD = preset("uniform")
"""200-token prompts, 32 tokens out, clients giving up after 10 s."""
CALIBRATION_BUDGET_S = 180.0


def demo_policy(slo_s: float) -> Policy:
    """The demo's policy: its TTFT SLO, deferral for up to 0.5 s, the rest by default."""
    return Policy.model_validate({"slo": {"ttftSeconds": slo_s}, "deferral": {"maxWaitSeconds": 0.5}})


@dataclass(frozen=True)
class DemoSettings:
    """What `slogate demo` is asked."""

    state_dir: Path
    """The profile cache, thresholds.json, llama-server's and the sidecar's logs."""
    slo_s: float = 2.0
    """The TTFT SLO the thresholds are derived for and goodput is counted against."""
    load: float = 3.0
    """Offered load, x μ."""
    seconds: float = 20.0
    """Each burst's arrival window."""


@dataclass(frozen=True)
class DemoResult:
    """What each front delivered, by the name the table gives it."""

    runs: dict[str, Run]
    """The table's row name -> its run, in the order they ran."""
    rate_rps: float
    """Offered λ of both bursts."""
    slo_s: float
    """The TTFT SLO goodput is counted against."""


async def wait_until_idle(upstream: str, limit_s: float = 300.0) -> None:
    """Poll llama-server's counters until nothing is processing or deferred (bounded)."""
    async with LlamaClient(upstream) as llama:
        for _ in range(int(limit_s / 0.5)):
            counters = await llama.counters()
            if counters.requests_processing == 0 and counters.requests_deferred == 0:
                return
            await asyncio.sleep(0.5)


async def demo(
    settings: DemoSettings, say: Say, progress: Callable[[], AbstractContextManager[Progress]] = no_progress
) -> DemoResult:
    """Run both bursts; CalibrationError, LlamaServerError, RuntimeNotFound or OSError say why not."""
    state = settings.state_dir
    state.mkdir(parents=True, exist_ok=True)
    with LlamaServer(locate(), log_path=state / "llama-server.log") as server:
        calibration = CalibrationSettings(
            upstream=server.url, server_args=server.args[1:], budget_s=CALIBRATION_BUDGET_S
        )
        profile = await cached_or_calibrated(calibration, state, say, progress)
        thresholds = derive_thresholds(demo_policy(settings.slo_s), profile, derived_at=datetime.now(UTC))
        write_atomic(state / "thresholds.json", thresholds.model_dump_json(by_alias=True, indent=2))
        mu = capacity_rps(ServerModel.from_profile(profile), WORKLOAD, thresholds.concurrency_cap)
        rate = settings.load * mu
        say(
            f"capacity μ for {WORKLOAD.prompt_tokens.describe()}-token prompts, {WORKLOAD.output_tokens.describe()} "
            f"tokens out: {mu:.2f} req/s (calibration {profile.id}); offering {settings.load:g}x"
        )
        fronts: tuple[tuple[str, Front], ...] = (
            ("llama-server alone", DirectFront()),
            ("through slogate", SlogateFront(thresholds)),
        )
        runs: dict[str, Run] = {}
        for name, front in fronts:
            # llama-server keeps working through requests whose clients gave up (that is the
            # collapse): each burst starts once it is idle, from the same state.
            await wait_until_idle(server.url)
            async with front.in_front_of(server.url, state / "demo") as started:
                runs[name] = await open_loop(started.url, rate, settings.seconds, WORKLOAD, seed=7)
    return DemoResult(runs, rate, settings.slo_s)


def outcomes(run: Run, slo_s: float) -> dict[str, int]:
    """What became of every request sent, by column (the benchmark's columns): they add up to `sent`."""
    summary = run.summary(slo_s)
    return {"sent": len(run.results), **dict(zip(OUTCOME_COLUMNS, outcome_counts(summary), strict=True))}


def table(runs: dict[str, Run], slo: float, rate: float) -> Table:
    """The side-by-side summary: every request sent in one outcome column, then latency and goodput."""
    t = Table(title=f"{rate:.2f} req/s offered for {next(iter(runs.values())).duration_s:g} s, TTFT SLO {slo:g} s")
    counts = {name: outcomes(r, slo) for name, r in runs.items()}
    for column in ("", *next(iter(counts.values())), "p50 TTFT", "p99 TTFT", "goodput"):
        t.add_column(column, justify="right" if column else "left")
    for name, r in runs.items():
        quantiles = [f"{v:.2f} s" if v is not None else "-" for v in (r.ttft_quantile(0.5), r.ttft_quantile(0.99))]
        t.add_row(name, *(str(n) for n in counts[name].values()), *quantiles, f"{r.goodput(slo):.2f} req/s")
    return t
