"""What deferral buys: the gate letting each request wait within its own bound, against the same
gate with deferral off.

Issue 12.7. A class whose TTFT SLO leaves slack (10 s, a batch class) on the chat mix at 1x
and 2x μ. The two fronts differ in one setting, ``deferral.maxWaitSeconds``: unset (a
request that finds the slots busy waits when the slot it would get is expected within its
SLO less its own prefill) or 0 (refused at once). Each pair of runs sends the same arrivals
(same seed) to a fresh llama-server. Clients wait up to 30 s for a whole answer, so a
request served within its 10 s TTFT SLO is never cut off while it decodes.

Run: ``make bench-deferral`` (about 5 minutes). Writes docs/bench/deferral.json and
re-renders docs/benchmarks.md, whose "Deferral" section is ``report.deferral_section``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_bench.live.fronts import SlogateFront
from slogate_bench.live.retries import NO_RETRY
from slogate_bench.published import environment
from slogate_bench.runs.suite import Bench, bench_profile, one_run
from slogate_sim.capacity import ServerModel
from slogate_sim.workloads import preset

SLO_S = 10.0
LOADS = (1.0, 2.0)
CLIENT_TIMEOUT_S = 30.0
VARIANTS = {"deferral (each request's own bound)": None, "deferral off": 0.0}
"""Name -> ``deferral.maxWaitSeconds``."""


def thresholds_for(max_wait_s: float | None, profile: CalibrationProfile) -> Thresholds:
    """The default policy with a 10 s TTFT SLO, deferral as given."""
    policy = Policy.model_validate({"slo": {"ttftSeconds": SLO_S}, "deferral": {"maxWaitSeconds": max_wait_s}})
    return derive_thresholds(policy, profile, derived_at=datetime.now(UTC))


def deferral_inputs(thresholds: Thresholds) -> dict[str, Any]:
    """The one class's cap and the policy's cap on a wait (None: only the SLO's slack)."""
    (cls,) = thresholds.classes
    return {"concurrency_cap": cls.concurrency_cap, "max_wait_s": thresholds.max_wait_seconds}


async def measure(seconds: float, state_dir: Path, console: Console) -> dict[str, Any]:
    """Every run: for each load, both variants on the same arrivals."""
    profile = await bench_profile(state_dir, console)
    chat = dataclasses.replace(preset("chat"), client_timeout_s=CLIENT_TIMEOUT_S)
    log_dir = state_dir / "bench-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    fronts = {name: SlogateFront(thresholds_for(max_wait, profile)) for name, max_wait in VARIANTS.items()}
    derived = {name: deferral_inputs(front.thresholds) for name, front in fronts.items()}
    runs: list[dict[str, Any]] = []
    with Progress(console=console, transient=False) as progress:
        (cap,) = {front.thresholds.concurrency_cap for front in fronts.values()}  # deferral does not change it
        bench = Bench(ServerModel.from_profile(profile), cap, seconds, log_dir, progress)
        for load in LOADS:
            for name, front in fronts.items():
                measured = await one_run(bench, front, load, chat, NO_RETRY)
                runs.append(
                    {
                        "variant": name,
                        "load": load,
                        "scenario": front.name,
                        "workload": chat.name,
                        "retry": "none",
                        **measured.run.summary(SLO_S),
                        "deferrals": (measured.gate_state or {}).get("deferrals", {}),
                    }
                )
    return {
        "environment": environment(),
        "profile": profile.id,
        "slo_s": SLO_S,
        "seconds": seconds,
        "client_timeout_s": CLIENT_TIMEOUT_S,
        "derived": derived,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=40.0, help="each run's arrival window")
    parser.add_argument("--state-dir", type=Path, default=Path(".slogate"))
    parser.add_argument("--raw", type=Path, default=Path("docs/bench/deferral.json"))
    args = parser.parse_args()
    console = Console(width=140)
    raw = asyncio.run(measure(args.seconds, args.state_dir, console))
    args.raw.parent.mkdir(parents=True, exist_ok=True)
    args.raw.write_text(json.dumps(raw, indent=2, default=str))
    console.print(f"wrote {args.raw}; `python -m slogate_bench.reports.benchmarks` renders it into docs/benchmarks.md")


if __name__ == "__main__":
    main()
