"""The reject-latency floor: what each layer under the sidecar's 429 costs, in one run (issue 14.6).

The benchmarks publish the sidecar's rejection latency at the client (p99 ~8-10 ms at 4x,
against a goal of 2 ms). This run takes that number apart on the same machine, at the same
moments, under the same background load: the real llama-server (nice 10, as the benchmarks
run it) kept busy by the chat mix at 4x μ through a real `slogate sidecar`, while one client
sends probes, one at a time and in a shuffled order, to every layer (``probes``: timed by
aiohttp as the benchmarks' clients time them, and by curl for two of them):

- nginx (Debian's, in C): ``return 429``, and a ``limit_req`` zone answering 429 (``nginx``);
- a bare aiohttp server answering 429, on asyncio and on uvloop (``bare_rejector``);
- `slogate sidecar` with no load of its own, its gate held full on a stub upstream, on
  asyncio and on uvloop: slogate's code path on a busy machine;
- the `slogate sidecar` that carries the 4x load, the probes sent in a class of their own
  that its gate refuses whenever any stream is in (the load's own class is the benchmarks').

Six conditions, each repeated in rotating order: as the benchmarks run (llama-server's
threads at nice 10); the load carried by a uvloop sidecar instead; llama-server's threads at
nice 0; llama-server's session group at nice 10 (``priority`` says why that differs);
every front at nice −10; no load at all (the machine's floor). Writes the marked block of
docs/reject-latency.md (and the raw probes to ``.slogate/bench-logs/reject-floor.json``).

Run: ``make bench-reject`` (about 9 minutes; needs nginx and uvloop, which it installs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_bench.live import priority
from slogate_bench.live.children import Child, bare, hold, sidecar, spawned
from slogate_bench.live.event_loops import Loop, uvloop_version
from slogate_bench.live.nginx import LIMIT_PATH, RETURN_PATH, nginx_version, spawned_nginx
from slogate_bench.live.probes import PROBE_CLASS, Prober, Target
from slogate_bench.live.processes import free_port
from slogate_bench.published import environment, replace_block
from slogate_bench.reports.reject_floor import CARRIER, DOC_BEGIN, DOC_END, markdown
from slogate_bench.runs.overhead import stub_profile
from slogate_bench.runs.suite import LLAMA_NICENESS, SLO_S, bench_profile
from slogate_calibration.output import write_atomic
from slogate_calibration.runtime import LlamaServer, locate
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.workloads import preset

LOAD = 4.0
HELD_STREAM_FLAGS = ("--upstream-read-timeout", "86400")
"""The sidecars with no load of their own: their one held stream never sends a byte after its first."""


@dataclass(frozen=True)
class Condition:
    """What the machine's priorities and the load's carrier are during a phase."""

    key: str
    short: str
    """The tables' column."""
    label: str
    """What changes, in words."""
    carrier: Loop | None
    """The loop of the sidecar that carries the load; None: no load (llama-server idle)."""
    llama_nice: int
    """llama-server's threads."""
    llama_group_nice: int
    """llama-server's session autogroup (``priority``)."""
    fronts_nice: int
    """nginx, the bare servers and every sidecar."""


CONDITIONS = (
    Condition("default", "default", "as the benchmarks run it", "asyncio", LLAMA_NICENESS, 0, 0),
    Condition("uvloop", "uvloop carries", "the load carried by a uvloop sidecar", "uvloop", LLAMA_NICENESS, 0, 0),
    Condition("llama-0", "llama nice 0", "llama-server's threads at nice 0 (all at 0)", "asyncio", 0, 0, 0),
    Condition(
        "llama-group-10",
        "llama group nice 10",
        "llama-server's session group at nice 10 (its threads at 10 too)",
        "asyncio",
        LLAMA_NICENESS,
        10,
        0,
    ),
    Condition("fronts-10", "fronts nice −10", "every front at nice −10", "asyncio", LLAMA_NICENESS, 0, -10),
    Condition(
        "no-load",
        "no load",
        "no load at all: llama-server idle (nothing for the carrier to refuse)",
        None,
        LLAMA_NICENESS,
        0,
        0,
    ),
)
TARGETS = {
    "nginx-return": "nginx `return 429` (C)",
    "nginx-limit": "nginx `limit_req` 429 (C)",
    "bare-asyncio": "bare aiohttp 429, asyncio",
    "bare-uvloop": "bare aiohttp 429, uvloop",
    "idle-asyncio": "sidecar, no load of its own, asyncio",
    "idle-uvloop": "sidecar, no load of its own, uvloop",
    CARRIER: "sidecar carrying the 4x load (its loop: the condition's)",
    "curl-nginx-return": "nginx `return 429`, timed by curl",
    f"curl-{CARRIER}": "sidecar carrying the 4x load, timed by curl",
}
"""Each layer probed, in the tables' order; aiohttp times the probes unless curl is named."""


@dataclass(frozen=True)
class Settings:
    """One run's shape."""

    repeats: int = 3
    seconds: float = 22.0
    """Probing per phase."""
    warmup_s: float = 5.0
    """Load before probing, per phase (the gate fills; the previous phase's aborted work drains)."""
    gap_ms: tuple[float, float] = (5.0, 25.0)
    """Pause between two probes, drawn uniformly: random, so probes never lock onto a periodic stall."""
    load: float = LOAD
    seed: int = 14
    only: tuple[str, ...] = ()
    """Run only these conditions (keys); empty: all of them."""

    def conditions(self) -> tuple[Condition, ...]:
        """The conditions to run, in the tables' order."""
        return tuple(c for c in CONDITIONS if not self.only or c.key in self.only)


def probe_policy() -> Policy:
    """The benchmarks' policy (2 s TTFT SLO) with deferral off and one more class below the
    load's: the probes', which may use one slot only (3 reserved above it), so its gate refuses a
    probe at once whenever a stream is in. Deferral is off because what is timed is a refusal
    at arrival: with it, a probe whose slot is expected within the wait would wait and then
    count as a slow refusal. The load's class keeps the benchmarks' cap and budget; it is
    refused when full, as it was under the bound this policy had before (its class's L_max
    equalled its cap on the bench pod, so it never deferred either)."""
    return Policy.model_validate(
        {
            "slo": {"ttftSeconds": SLO_S},
            "deferral": {"maxWaitSeconds": 0.0},
            "classes": [{"name": "default", "reservedSlots": 3}, {"name": PROBE_CLASS}],
            "defaultClass": "default",
        }
    )


def held_full_thresholds() -> Thresholds:
    """The overhead benchmark's rejecting gate: one slot, no deferral (one held stream fills it)."""
    policy = {"slo": {"ttftSeconds": 5.0}, "concurrency": {"max": 1}, "deferral": {"maxWaitSeconds": 0}}
    return derive_thresholds(Policy.model_validate(policy), stub_profile(), derived_at=datetime.now(UTC))


class Machine:
    """The processes whose priorities the conditions set."""

    def __init__(self, llama_pid: int, fronts: Sequence[int]) -> None:
        self.llama_pid = llama_pid
        self.fronts = tuple(fronts)
        self.groups = priority.autogroup_enabled()

    def apply(self, condition: Condition) -> None:
        priority.renice_tree(self.llama_pid, condition.llama_nice)
        if self.groups:
            priority.set_autogroup_nice(self.llama_pid, condition.llama_group_nice)
        for pid in self.fronts:
            priority.renice_tree(pid, condition.fronts_nice)


async def phase(
    *,
    condition: Condition,
    carrier_url: str | None,
    targets: dict[str, Target],
    prober: Prober,
    settings: Settings,
    rate_rps: float,
    rng: random.Random,
    log_dir: Path,
) -> dict[str, Any]:
    """The load through the condition's carrier (if any), a warm-up, then a window of probes; the
    load's outcomes."""
    if carrier_url is None:
        await asyncio.sleep(settings.warmup_s)  # the previous phase's aborted work drains alike
        probes = await prober.window(targets, settings.seconds, settings.gap_ms, rng)
        return {"condition": condition.key, "probes": probes, "load": {}}
    seconds = settings.warmup_s + settings.seconds + 60.0  # stopped before its arrivals end
    argv = [sys.executable, "-m", "slogate_bench.live.floor_load", carrier_url, repr(rate_rps), repr(seconds)]
    with (log_dir / "floor-load.log").open("ab") as sink:
        load = await asyncio.create_subprocess_exec(
            *argv, "--slo", repr(SLO_S), stdout=asyncio.subprocess.PIPE, stderr=sink
        )
    try:
        await asyncio.sleep(settings.warmup_s)
        probes = await prober.window(targets, settings.seconds, settings.gap_ms, rng)
    finally:
        load.terminate()
        out, _ = await load.communicate()
    return {"condition": condition.key, "probes": probes, "load": json.loads(out or b"{}")}


async def measure(settings: Settings, state_dir: Path, console: Console) -> dict[str, Any]:
    """The whole run: every process started once, then the conditions' phases in rotating order."""
    started = time.monotonic()
    profile: CalibrationProfile = await bench_profile(state_dir, console)
    loaded = derive_thresholds(probe_policy(), profile, derived_at=datetime.now(UTC))
    chat = preset("chat")
    mu = capacity_rps(ServerModel.from_profile(profile), chat, loaded.concurrency_cap)
    rate = settings.load * mu
    log_dir = state_dir / "bench-logs" / "reject-floor"
    log_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(settings.seed)
    phases: list[dict[str, Any]] = []
    with LlamaServer(locate(), log_path=log_dir / "llama-server.log", niceness=LLAMA_NICENESS) as server:
        async with AsyncExitStack() as stack:
            nginx = await stack.enter_async_context(spawned_nginx(log_dir))
            stub_port = free_port()
            stub = await stack.enter_async_context(
                spawned(
                    "stub",
                    [sys.executable, "-m", "slogate_bench.live.stub_upstream", str(stub_port)],
                    "/health",
                    stub_port,
                    log_dir,
                )
            )
            children: dict[str, Child] = {}
            for loop in ("asyncio", "uvloop"):
                children[f"bare-{loop}"] = await stack.enter_async_context(bare(loop, log_dir))
                children[f"idle-{loop}"] = await stack.enter_async_context(
                    # The held stream is silent: no upstream read timeout may end it during the run.
                    sidecar(f"idle-{loop}", loop, stub.url, held_full_thresholds(), log_dir, *HELD_STREAM_FLAGS)
                )
                children[f"carrier-{loop}"] = await stack.enter_async_context(
                    sidecar(f"carrier-{loop}", loop, server.url, loaded, log_dir)
                )
            holding = await stack.enter_async_context(aiohttp.ClientSession())
            for loop in ("asyncio", "uvloop"):
                stack.push_async_callback(_closed, await hold(holding, children[f"idle-{loop}"].url))
            # A fresh connection per probe, as the benchmarks' clients (load.py) make them.
            session = await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0))
            )
            prober = Prober(session, log_dir / "probe-body.json")
            fixed = {
                "nginx-return": Target(nginx.url + RETURN_PATH + "/completion"),
                "nginx-limit": Target(nginx.url + LIMIT_PATH + "/completion"),
                **{
                    key: Target(children[key].url + "/completion")
                    for key in ("bare-asyncio", "bare-uvloop", "idle-asyncio", "idle-uvloop")
                },
                "curl-nginx-return": Target(nginx.url + RETURN_PATH + "/completion", "curl"),
            }
            machine = Machine(server.pid or 0, [nginx.pid, *(c.pid for c in children.values())])
            for _ in range(20):  # warm every path (and spend nginx's one request a minute)
                for target in fixed.values():
                    await prober.one(target)
            console.print(f"μ {mu:.2f} req/s; the load at {settings.load:g}x: {rate:.2f} req/s")
            try:
                for repeat in range(settings.repeats):
                    conditions = settings.conditions()
                    for condition in conditions[repeat % len(conditions) :] + conditions[: repeat % len(conditions)]:
                        machine.apply(condition)
                        carrier = None if condition.carrier is None else children[f"carrier-{condition.carrier}"].url
                        targets = dict(fixed)
                        if carrier is not None:
                            targets[CARRIER] = Target(carrier + "/completion")
                            targets[f"curl-{CARRIER}"] = Target(carrier + "/completion", "curl")
                        result = await phase(
                            condition=condition,
                            carrier_url=carrier,
                            targets=targets,
                            prober=prober,
                            settings=settings,
                            rate_rps=rate,
                            rng=rng,
                            log_dir=log_dir,
                        )
                        phases.append({**result, "repeat": repeat})
                        console.print(_phase_line(result, repeat))
            finally:
                machine.apply(CONDITIONS[0])
    return {
        "environment": {
            **environment(),
            "kernel": _kernel(),
            "autogroup": "on" if priority.autogroup_enabled() else "off",
            "nginx": nginx_version() or "-",
            "uvloop": uvloop_version() or "-",
        },
        "settings": asdict(settings),
        "profile": profile.id,
        "mu_rps": mu,
        "rate_rps": rate,
        "conditions": [asdict(c) for c in settings.conditions()],
        "targets": [{"key": k, "label": v} for k, v in TARGETS.items()],
        "phases": phases,
        "wall_s": time.monotonic() - started,
    }


async def _closed(response: aiohttp.ClientResponse) -> None:
    response.close()


def _kernel() -> str:
    return Path("/proc/sys/kernel/osrelease").read_text().strip()


def _phase_line(result: dict[str, Any], repeat: int) -> str:
    parts = []
    for key, probes in result["probes"].items():
        values = sorted(probes["rejected_s"])
        p99 = values[min(len(values) - 1, round(0.99 * (len(values) - 1)))] * 1e3 if values else float("nan")
        parts.append(f"{key} {p99:.2f}")
    return f"{result['condition']:<15} #{repeat + 1}  p99 ms: " + ", ".join(parts) + f"  load {result['load']}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=Settings.repeats)
    parser.add_argument("--seconds", type=float, default=Settings.seconds, help="probing per phase")
    parser.add_argument("--warmup", type=float, default=Settings.warmup_s, help="load before probing, per phase")
    parser.add_argument("--state-dir", type=Path, default=Path(".slogate"))
    parser.add_argument("--doc", type=Path, default=Path("docs/reject-latency.md"))
    parser.add_argument("--raw", type=Path, default=None, help="default: STATE_DIR/bench-logs/reject-floor.json")
    parser.add_argument("--render", action="store_true", help="only re-render the doc's block from --raw")
    parser.add_argument(
        "--only", action="append", choices=[c.key for c in CONDITIONS], help="only these conditions (a partial run)"
    )
    args = parser.parse_args(argv)
    raw_path = args.raw or args.state_dir / "bench-logs" / "reject-floor.json"
    console = Console(width=160)
    if args.render:
        raw = json.loads(raw_path.read_text())
    else:
        if uvloop_version() is None:
            sys.exit("uvloop is not installed: .venv/bin/pip install uvloop (or `make bench-reject`)")
        settings = Settings(
            repeats=args.repeats, seconds=args.seconds, warmup_s=args.warmup, only=tuple(args.only or ())
        )
        raw = asyncio.run(measure(settings, args.state_dir, console))
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(raw_path, json.dumps(raw, default=str))
    replace_block(args.doc, DOC_BEGIN, DOC_END, markdown(raw))
    console.print(f"wrote the block of {args.doc} (raw probes: {raw_path})")


if __name__ == "__main__":
    main()
