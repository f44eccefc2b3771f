"""`make bench-fleet-sim`: the fleet simulator checked against the measured fleet, then at 10,
100 and 1,000 pods (issue 15, point 4); writes docs/bench/fleet-simulated.json.

Every simulated pod is one of the two pods `make bench-fleet` measured (docs/bench/fleet.json:
its calibration profile, the thresholds its sidecar ran and its count cap), pod i taking
pod i mod 2, so each drives the core's GateMachine with its own calibrated curves. Three parts:

- **validation**: every measured run replayed: two pods, the run's very arrival schedule
  (``workloads.schedule`` with its seed), the same front and routing (nginx ``random`` is
  ``random``, ``least_conn`` is ``least-requests``, random with retry on 429 is
  ``retry-429:TRIES``; ``least_conn+retry`` has no simulated twin and is left out);
  simulated goodput beside measured, and their ratio;
- **study**: the slogate gate on every pod, goodput of each routing as a share of
  ``least-pressure``'s (each request to the least pressed pod's gate: a balancer that reads
  every gate) at N = 10, 100 and 1,000 pods and loads 0.8x, 1x and 2x of the fleet's capacity,
  on several arrival seeds (``SIZES``: mean, least and most);
- **speed**: the CPU seconds (``time.process_time``, one core) of 1,000 pods for 10
  simulated minutes at 1x, each routing, every pod the single-pod suite's (two threads).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_bench.published import environment
from slogate_bench.runs.demo import demo_policy
from slogate_calibration.output import write_atomic
from slogate_sim.capacity import ServerModel
from slogate_sim.engine import simulate
from slogate_sim.fronts import CountCapped, Direct, FrontSpec, Gated
from slogate_sim.limits import CountCap
from slogate_sim.routing import Routing
from slogate_sim.scenario import Pod, SimulationConfig, SimulationResult, config_for_load, trace_of
from slogate_sim.workloads import Arrival, Workload, preset, schedule

MEASURED = Path("docs/bench/fleet.json")
OUT = Path("docs/bench/fleet-simulated.json")
LOADS = (0.8, 1.0, 2.0)
ROUTINGS = ("random", "round-robin", "least-requests", "retry-429:2", "retry-429:3", "least-pressure")
SIZES: dict[int, tuple[float, tuple[int, ...]]] = {
    10: (3000.0, (1, 2, 3)),
    100: (600.0, (1, 2, 3)),
    1000: (300.0, (1,)),
}
"""Pods -> (simulated seconds of arrivals, seeds): about 20,000 arrivals per run at 1x for 10
and 40,000 for 100 pods, each on three schedules; 200,000 for 1,000 pods, on one (its spread
over seeds is below the others')."""
SPEED_REPLICAS, SPEED_SECONDS = 1000, 600.0
"""The speed figure: 1,000 pods, 10 simulated minutes, at 1x."""
SPEED_PROFILE = Path("docs/bench/profile.json")
"""The speed figure's pod: the single-pod suite's, `make bench-full`'s calibration."""


@dataclass(frozen=True)
class MeasuredFleet:
    """What `make bench-fleet` measured and ran, as the simulator needs it."""

    servers: tuple[ServerModel, ...]
    thresholds: tuple[Thresholds, ...]
    count_caps: tuple[CountCap, ...]
    workload: Workload
    slo_s: float
    duration_s: float
    pod_capacity_rps: tuple[float, ...]
    raw: Mapping[str, Any]

    @classmethod
    def read(cls, path: Path) -> MeasuredFleet:
        """docs/bench/fleet.json; a clear error if `make bench-fleet` has not written it."""
        if not path.exists():
            raise SystemExit(f"{path} not found: run `make bench-fleet` first (the simulated pods are its pods)")
        raw = json.loads(path.read_text())
        pods = raw["pods"]
        return cls(
            servers=tuple(ServerModel.from_profile(CalibrationProfile.model_validate(p["profile"])) for p in pods),
            thresholds=tuple(Thresholds.model_validate(p["thresholds"]) for p in pods),
            count_caps=tuple(CountCap(p["count_cap"]["concurrency"], p["count_cap"]["queue"]) for p in pods),
            workload=dataclasses.replace(preset(raw["workload"]), client_timeout_s=float(raw["client_timeout_s"])),
            slo_s=float(raw["slo_s"]),
            duration_s=float(raw["duration_s"]),
            pod_capacity_rps=tuple(float(p["capacity_rps"]) for p in pods),
            raw=raw,
        )

    def pods(self, layer: str) -> tuple[Pod, ...]:
        """Each measured pod behind the front of ``layer`` (``direct``, ``count-cap``, ``slogate``)."""
        fronts: list[FrontSpec]
        if layer == "direct":
            fronts = [Direct() for _ in self.servers]
        elif layer == "count-cap":
            fronts = [CountCapped(cap) for cap in self.count_caps]
        else:
            fronts = [Gated(t) for t in self.thresholds]
        return tuple(zip(self.servers, fronts, strict=True))

    def config(
        self, layer: str, routing: Routing, *, replicas: int, load: float, duration_s: float, seed: int
    ) -> SimulationConfig:
        """A run of ``replicas`` pods (the measured ones, cycled) at ``load`` x their summed μ."""
        pods = self.pods(layer)
        capacity = sum(self.pod_capacity_rps[i % len(pods)] for i in range(replicas))
        return SimulationConfig(
            server=pods[0][0],
            workload=self.workload,
            arrival_rate_rps=load * capacity,
            duration_s=duration_s,
            ttft_slo_s=self.slo_s,
            front=pods[0][1],
            seed=seed,
            capacity_rps=capacity,
            replicas=replicas,
            routing=routing,
            pods=pods,
        )


def simulated_routing(row: Mapping[str, Any]) -> Routing | None:
    """The simulated twin of a measured front's nginx routing (None: it has none)."""
    if row["tries"] > 1:
        return Routing("retry-429", row["tries"]) if row["routing"] == "random" else None
    return Routing.parse(
        {"random": "random", "least_conn": "least-requests", "round_robin": "round-robin"}[row["routing"]]
    )


def validation(fleet: MeasuredFleet) -> list[dict[str, Any]]:
    """Every measured run replayed in the simulator on its own arrivals."""
    rows = []
    for row in fleet.raw["runs"]:
        routing = simulated_routing(row)
        if routing is None:
            continue
        arrivals = schedule(row["arrival_rate_rps"], fleet.duration_s, fleet.workload, seed=row["schedule_seed"])
        config = fleet.config(
            row["layer"], routing, replicas=len(fleet.servers), load=row["load"], duration_s=fleet.duration_s, seed=0
        )
        config = _with_trace(config, arrivals)
        result = simulate(config)
        rows.append(
            {
                "front": row["front"],
                "routing": str(routing),
                "load": row["load"],
                "measured_goodput_rps": row["goodput_rps"],
                "simulated_goodput_rps": result.goodput_rps,
                "ratio": result.goodput_rps / row["goodput_rps"] if row["goodput_rps"] else None,
                "measured_refused": row["refused_after_tries"],
                "simulated_refused": result.rejected,
                "offered": row["offered"],
                "simulated_offered": result.offered,
            }
        )
    return rows


def _with_trace(config: SimulationConfig, arrivals: Sequence[Arrival]) -> SimulationConfig:
    trace = trace_of(arrivals)
    return dataclasses.replace(config, trace=trace, arrival_rate_rps=len(trace) / config.duration_s)


def study(fleet: MeasuredFleet, console: Console) -> list[dict[str, Any]]:
    """Every routing at every size, load and seed; goodput as a share of ``least-pressure``'s."""
    rows = []
    for replicas, (duration, seeds) in SIZES.items():
        for load, seed in ((load, seed) for load in LOADS for seed in seeds):
            rows += _study_point(fleet, console, replicas=replicas, load=load, duration=duration, seed=seed)
    return rows


def _study_point(
    fleet: MeasuredFleet, console: Console, *, replicas: int, load: float, duration: float, seed: int
) -> list[dict[str, Any]]:
    results = {
        name: simulate(
            fleet.config("slogate", Routing.parse(name), replicas=replicas, load=load, duration_s=duration, seed=seed)
        )
        for name in ROUTINGS
    }
    least_pressure = results["least-pressure"].goodput_rps
    console.print(f"  {replicas} pods, {load:g}x, seed {seed}: " + ", ".join(
        f"{n} {r.goodput_rps / least_pressure:.3f}" for n, r in results.items()
    ))  # fmt: skip
    return [
        {"replicas": replicas, "load": load, "seed": seed, **_study_row(r, least_pressure)} for r in results.values()
    ]


def _study_row(result: SimulationResult, reference_rps: float) -> dict[str, Any]:
    return {
        "routing": result.routing,
        "duration_s": result.duration_s,
        "offered": result.offered,
        "goodput_rps": result.goodput_rps,
        "capacity_rps": result.capacity_rps,
        "share_of_least_pressure": result.goodput_rps / reference_rps if reference_rps else None,
        "refused": result.rejected,
        "tries_per_request": result.tries / result.offered if result.offered else None,
        "within_slo_of_completed": result.completed_within_slo / result.completed if result.completed else None,
        "ttft_p99_s": result.ttft_p99_s,
    }


def speed(profile_path: Path, slo_s: float) -> list[dict[str, Any]]:
    """CPU seconds of 1,000 pods for 10 simulated minutes at 1x, per routing: every pod the
    single-pod suite's (``profile_path``: two threads, four slots), the heavier pod (about
    twice the arrivals of the fleet's one-thread pods at the same load)."""
    profile = CalibrationProfile.model_validate_json(profile_path.read_text())
    thresholds = derive_thresholds(demo_policy(slo_s), profile, derived_at=datetime.now(UTC))
    server = ServerModel.from_profile(profile)
    rows = []
    for name in ROUTINGS:
        config = config_for_load(
            server, preset("chat"), load=1.0, duration_s=SPEED_SECONDS, ttft_slo_s=slo_s, front=Gated(thresholds),
            concurrency=thresholds.concurrency_cap, seed=1, replicas=SPEED_REPLICAS, routing=Routing.parse(name),
        )  # fmt: skip
        started = time.process_time()
        result = simulate(config)
        rows.append(
            {
                "routing": name,
                "replicas": SPEED_REPLICAS,
                "simulated_s": SPEED_SECONDS,
                "offered": result.offered,
                "cpu_s": time.process_time() - started,
            }
        )
    return rows


def main() -> None:
    """Run the three parts and write docs/bench/fleet-simulated.json; then render the doc."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, default=MEASURED)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--speed-profile", type=Path, default=SPEED_PROFILE)
    args = parser.parse_args()
    console = Console(stderr=True)
    fleet = MeasuredFleet.read(args.measured)
    started = datetime.now(UTC)
    console.print(f"validation: {len(fleet.raw['runs'])} measured runs replayed")
    checked = validation(fleet)
    console.print("study: " + ", ".join(ROUTINGS))
    studied = study(fleet, console)
    console.print(f"speed: {SPEED_REPLICAS} pods, {SPEED_SECONDS:g} s at 1x")
    timed = speed(args.speed_profile, fleet.slo_s)
    raw = {
        "environment": environment(),
        "started_at": started.isoformat(timespec="seconds"),
        "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "measured_started_at": fleet.raw.get("started_at"),
        "slo_s": fleet.slo_s,
        "workload": fleet.raw["workload"],
        "pod_capacity_rps": list(fleet.pod_capacity_rps),
        "sizes": {str(n): {"duration_s": d, "seeds": list(s)} for n, (d, s) in SIZES.items()},
        "loads": list(LOADS),
        "routings": list(ROUTINGS),
        "validation": checked,
        "study": studied,
        "speed_profile": str(args.speed_profile),
        "speed": timed,
    }
    write_atomic(args.out, json.dumps(raw, indent=1) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
