"""`make bench-autoscale`: autoscaling signals on the same simulated traces (issue 16).

Every pod is one of the two pods `make bench-fleet` measured (docs/bench/fleet.json: its
calibration profile and the thresholds its sidecar ran), pod i taking pod i mod 2, each
behind its own slogate gate (the core's GateMachine), behind a least-requests balancer (an
inference gateway, or nginx ``least_conn``). Clients send the demo's `chat` mix. An HPA
(``slogate_sim.hpa``: Kubernetes' algorithm and default behaviour) reads one signal
(``fleet``) every 15 s; a new pod is routable 30 s after its creation. slogate's
signal (the operator's query) runs twice: with the scale-up stabilization window the operator
derives by default (``slogate_admission.scale_up``: the pods' start-up + the rate window + one
sync, 105 s here; the HPA then scales up to the least recommendation of that window, so a
burst shorter than a pod's start-up buys no pod), and with Kubernetes' default 0 s.

Per scenario (``slogate_sim.load_shapes``) and signal, three kinds of client: none retry; each
retries a 429 after its Retry-After up to twice and says its retry count (the OpenAI SDK);
the same saying only its idempotency key. Every combination runs on the same seed, so on the
same arrivals. Writes docs/bench/autoscaling.json (the schema: ``summary`` below);
``reports.autoscaling`` renders it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from slogate_admission.demand import reference_capacity
from slogate_admission.scale_up import lasting_demand_window_s
from slogate_bench.published import environment
from slogate_bench.runs.fleet_simulation import MEASURED, MeasuredFleet
from slogate_calibration.output import write_atomic
from slogate_sim.engine import simulate
from slogate_sim.fleet import (
    LATE,
    REFUSED,
    TIMED_OUT_FORWARDED,
    UNSERVABLE,
    WITHIN,
    Autoscaling,
    RetryingClients,
)
from slogate_sim.hpa import HpaSpec, Signal
from slogate_sim.load_shapes import (
    WARMUP_S,
    Shape,
    oracle_replicas,
    pod_seconds,
    ready_per_second,
    recovery_s,
    seconds_grid,
    shapes,
    steady_mask,
)
from slogate_sim.routing import Routing
from slogate_sim.scenario import SimulationConfig, SimulationResult

OUT = Path("docs/bench/autoscaling.json")
SEED = 16
"""The arrivals' seed, the same for every run."""
START_REPLICAS = 4
"""N₀: the oracle's fleet at 1x, and every run's fleet at t = 0."""
MIN_REPLICAS, MAX_REPLICAS = 2, 64
"""The HPA's bounds (max far above any oracle's count, so that it never hides a signal's appetite)."""
TARGETS: dict[Signal, float] = {
    "cpu": 0.7,
    "waiting": 5.0,
    "slogate": 0.7,
    "slogate-all-tries": 0.7,
    "slogate-reference": 0.7,
}
"""Each signal's target (CPU utilisation; waiting per pod; ρ per pod)."""
ORACLE_TARGET = 0.7
"""The oracle's per-pod load, the same as slogate's target."""
STARTUP_S = 30.0
"""A new pod's creation to readiness."""
DEMAND_WINDOW_S = 60.0
"""The demand query's rate window (the operator's default ``metricWindowSeconds``)."""
SYNC_S = 15.0
"""The HPA's sync period (KEDA's default ``pollingInterval``)."""
UP_WINDOW_S = float(lasting_demand_window_s(STARTUP_S, DEMAND_WINDOW_S, SYNC_S))
"""The scale-up window the operator derives for these pods, its default; slogate's signal also
runs with Kubernetes' default 0 s (*slogate, up 0 s*), the signals it is compared with only so."""
Arm = tuple[Signal, float, str]
"""A signal, the HPA's scale-up stabilization window (s) it runs with, and its label."""
_SLOGATE: tuple[Arm, ...] = (("slogate", UP_WINDOW_S, "slogate"), ("slogate", 0.0, "slogate, up 0 s"))
_DEFAULT: tuple[Arm, ...] = (("cpu", 0.0, "cpu"), ("waiting", 0.0, "waiting"), *_SLOGATE)
_REFERENCE: Arm = ("slogate-reference", UP_WINDOW_S, "slogate-reference")
CLIENTS: dict[str, tuple[RetryingClients | None, tuple[Arm, ...]]] = {
    "none": (None, (*_DEFAULT, _REFERENCE)),
    "counted": (
        RetryingClients(2, say_count=True),
        (*_DEFAULT, ("slogate-all-tries", UP_WINDOW_S, "slogate-all-tries"), _REFERENCE),
    ),
    "keyed": (RetryingClients(2, say_count=False), _SLOGATE),
}
"""Client kinds and the arms run with each: clients that never retry; that retry and say
their count; that retry with only an idempotency key (slogate's signal: its inflation).
slogate's variants run with the operator's derived window, so that they compare with it."""
SERIES_POINTS = 600
"""At most about this many points per plotted series (the day's are thinned)."""
GOALS = {"within_slo": 0.99, "steady_refused": 0.02, "pod_seconds_ratio": 1.15}
"""The issue's bars for slogate's signal."""


def config(
    fleet: MeasuredFleet,
    shape: Shape,
    base_rps: float,
    signal: Signal,
    clients: RetryingClients | None,
    *,
    up_window_s: float = 0.0,
) -> SimulationConfig:
    """One run: ``shape`` at λ₀ = ``base_rps``, the HPA reading ``signal`` (its scale-up
    stabilization window ``up_window_s``, the rest Kubernetes' defaults)."""
    base = fleet.config("slogate", Routing("least-requests"), replicas=START_REPLICAS, load=1.0,
                        duration_s=shape.duration_s, seed=SEED)  # fmt: skip
    hpa = HpaSpec(MIN_REPLICAS, MAX_REPLICAS, up_window_s=up_window_s)
    return dataclasses.replace(
        base,
        arrival_rate_rps=base_rps,
        rate_curve=shape.curve(base_rps),
        autoscaling=Autoscaling(signal, TARGETS[signal], hpa, startup_s=STARTUP_S, demand_window_s=DEMAND_WINDOW_S),
        clients=clients,
    )


def summary(result: SimulationResult, shape: Shape, base_rps: float, mu_rps: float) -> dict[str, Any]:
    """What the report shows of one run, measured over [WARMUP_S, duration]."""
    record = result.fleet
    assert record is not None
    start, end = WARMUP_S, shape.duration_s
    every = np.frombuffer(record.arrivals, dtype=np.float64)
    arrivals = every
    outcomes = np.frombuffer(record.outcomes, dtype=np.int8)
    series = _series(record.ticks, every, outcomes == REFUSED, end)
    inside = arrivals >= start
    arrivals, outcomes = arrivals[inside], outcomes[inside]
    admitted = np.isin(outcomes, (WITHIN, LATE, TIMED_OUT_FORWARDED))
    refused = outcomes == REFUSED
    grid = seconds_grid(start, end)
    rate = shape.curve(base_rps).at(grid)
    oracle = oracle_replicas(rate, ORACLE_TARGET, mu_rps, MIN_REPLICAS)
    ready = ready_per_second(record.pods, grid)
    before = oracle_replicas(shape.curve(base_rps).at(np.array([start - 0.5])), ORACLE_TARGET, mu_rps, MIN_REPLICAS)
    steady = steady_mask(ready, oracle, int(before[0]))
    second = np.clip((arrivals - start).astype(int), 0, len(grid) - 1)
    in_steady = steady[second]
    used = pod_seconds(record.pods, start, end)
    ideal = float(np.sum(oracle))  # one second per grid point
    recovery = recovery_s(arrivals, refused, shape.change_s, end) if shape.name != "daily" else None
    return {
        "requests": len(arrivals),
        "within_slo_of_admitted": float(np.mean(outcomes[admitted] == WITHIN)) if admitted.any() else None,
        "refused": float(np.mean(refused)) if len(refused) else None,
        "unservable": float(np.mean(outcomes == UNSERVABLE)) if len(outcomes) else None,
        "steady_refused": float(np.mean(refused[in_steady])) if in_steady.any() else None,
        "steady_share_of_time": float(np.mean(steady)),
        "pod_seconds": used,
        "oracle_pod_seconds": ideal,
        "pod_seconds_ratio": used / ideal,
        "recovery_s": recovery,
        "unique": record.unique,
        "counted_first": record.counted_first,
        "counted_all": record.counted_all,
        "first_try_inflation": record.counted_first / record.unique if record.unique else None,
        "all_tries_inflation": record.counted_all / record.unique if record.unique else None,
        "first_try_work_inflation": record.work_first / record.work_unique if record.work_unique else None,
        "misrouted": record.misrouted,
        "pods_created": len(record.pods),
        "max_ready": int(ready.max()),
        "mean_ready": float(ready.mean()),
        "mean_oracle": float(oracle.mean()),
        "series": series,
    }


def _series(
    ticks: Sequence[tuple[float, int, int, float, int]], arrivals: np.ndarray, refused: np.ndarray, end: float
) -> dict[str, Any]:
    """The plotted series, warm-up included: each sync (thinned to about ``SERIES_POINTS``) and
    the refused share of the requests arriving in each bin (a minute, or more for a day)."""
    ticks = ticks[:: max(1, len(ticks) // SERIES_POINTS)]
    bin_s = 60.0 * max(1, round(end / 60.0 / SERIES_POINTS))
    bins = np.arange(0.0, end + bin_s, bin_s)
    offered = np.histogram(arrivals, bins=bins)[0]
    shed = np.histogram(arrivals[refused], bins=bins)[0]
    return {
        "tick_s": [t[0] for t in ticks],
        "asked": [t[1] for t in ticks],
        "ready": [t[2] for t in ticks],
        "signal": [None if math.isnan(t[3]) else round(t[3], 4) for t in ticks],
        "refused_bin_s": bin_s,
        "refused_share": [round(float(r / o), 4) if o else None for r, o in zip(shed, offered, strict=True)],
    }


def run_all(fleet: MeasuredFleet, console: Console) -> dict[str, Any]:
    """Every scenario x client kind x signal."""
    mu = statistics.fmean(fleet.pod_capacity_rps)
    mu_ref = statistics.fmean(reference_capacity(t).requests_per_second for t in fleet.thresholds)
    base = START_REPLICAS * ORACLE_TARGET * mu
    scenarios = []
    for shape in shapes():
        grid = seconds_grid(0.0, shape.duration_s)  # plotted from t = 0, warm-up included
        rate = shape.curve(base).at(grid)
        stride = max(1, len(grid) // SERIES_POINTS)
        runs = []
        for kind, (clients, arms) in CLIENTS.items():
            for signal, up_window_s, arm in arms:
                started = time.process_time()
                result = simulate(config(fleet, shape, base, signal, clients, up_window_s=up_window_s))
                row = {
                    "clients": kind,
                    "signal": signal,
                    "up_window_s": up_window_s,
                    "arm": arm,
                    **summary(result, shape, base, mu),
                }
                row["cpu_s"] = time.process_time() - started
                console.print(
                    f"  {shape.name} {kind} {signal} up {up_window_s:g} s: "
                    f"within {row['within_slo_of_admitted']:.4f} refused "
                    f"{row['refused']:.4f} steady {row['steady_refused']} pod-s x{row['pod_seconds_ratio']:.2f} "
                    f"recovery {row['recovery_s']} ({row['cpu_s']:.1f} s)"
                )
                runs.append(row)
        scenarios.append(
            {
                "name": shape.name,
                "description": shape.description,
                "duration_s": shape.duration_s,
                "change_s": shape.change_s,
                "load_s": grid[::stride].tolist(),
                "load_rps": rate[::stride].round(4).tolist(),
                "oracle": oracle_replicas(rate, ORACLE_TARGET, mu, MIN_REPLICAS)[::stride].tolist(),
                "runs": runs,
            }
        )
    return {"mu_rps": mu, "mu_ref_rps": mu_ref, "base_rps": base, "scenarios": scenarios}


def main() -> None:
    """Run every scenario and write docs/bench/autoscaling.json."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, default=MEASURED)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    console = Console(stderr=True)
    fleet = MeasuredFleet.read(args.measured)
    started = datetime.now(UTC)
    results = run_all(fleet, console)
    raw: Mapping[str, Any] = {
        "environment": environment(),
        "started_at": started.isoformat(timespec="seconds"),
        "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "measured_started_at": fleet.raw.get("started_at"),
        "slo_s": fleet.slo_s,
        "workload": fleet.raw["workload"],
        "client_timeout_s": fleet.workload.client_timeout_s,
        "seed": SEED,
        "warmup_s": WARMUP_S,
        "start_replicas": START_REPLICAS,
        "min_replicas": MIN_REPLICAS,
        "max_replicas": MAX_REPLICAS,
        "startup_s": STARTUP_S,
        "targets": TARGETS,
        "up_window_s": UP_WINDOW_S,
        "demand_window_s": DEMAND_WINDOW_S,
        "oracle_target": ORACLE_TARGET,
        "goals": GOALS,
        "pod_capacity_rps": list(fleet.pod_capacity_rps),
        "pod_reference_rps": [t.throughput_rps for t in fleet.thresholds],
        "reference_request": [fleet.thresholds[0].reference_prompt_tokens, fleet.thresholds[0].reference_output_tokens],
        **results,
    }
    write_atomic(args.out, json.dumps(raw, indent=1) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
