"""`make bench-tenants-sim`: fair shares between tenants in the simulator (issue 17); writes
docs/bench/tenants-simulated.json and its figure.

The pod is the first one `make bench-fleet` measured (docs/bench/fleet.json: its calibration
profile and policy, read by ``fleet_simulation.MeasuredFleet``), one pod, the `chat` mix, its
TTFT SLO; the gate is the core's GateMachine with thresholds derived from that policy as it
is (*without*) and with ``spec.tenants`` at its defaults (*with*). Every tenant's arrivals are
its own Poisson stream (``tenant_traffic.tenant_schedule``), so a tenant is sent the very same
requests whoever else sends and whichever gate judges them. Two parts, each on ``SEEDS``:

- **noisy neighbour**, the twin of the measured `make bench-tenants`: tenant A at 4x μ and B
  at 0.25x μ (μ = ``capacity.capacity_rps`` of the mix on this pod), one class: B alone, A+B
  without, A+B with;
- **Zipf**: 100 tenants whose demands follow Zipf(1.0), 2x and 1x μ in all, without and with;
  per tenant its demand, goodput (first token within the SLO) and what became of the rest,
  and per run the fairness measures of ``fairness``: each tenant's max-min fair share of the
  goodput the run achieved (water-filling, equal weights), the share of tenants given at
  least 90% of it, Jain's index of goodput over fair share, the light tenants' goodput.

``reports.tenant_simulation`` renders the JSON (the section of docs/benchmarks.md, the figure).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, ClassPolicy, Policy, Thresholds
from slogate_admission.tenant_schema import TenantsPolicy
from slogate_bench.published import environment
from slogate_bench.reports.tenant_simulation import FIGURE, figure, tenant_simulation_section
from slogate_bench.runs.fleet_simulation import MEASURED, MeasuredFleet
from slogate_calibration.output import write_atomic
from slogate_sim.engine import simulate
from slogate_sim.fronts import Gated
from slogate_sim.scenario import SimulationConfig, SimulationResult, TenantCounts, trace_of
from slogate_sim.tenant_traffic import tenant_schedule, zipf_rates

__all__ = ["TenantPod", "fairness", "jain_index", "main", "max_min_fair_shares", "tenant_simulation_section"]
"""``tenant_simulation_section`` is ``reports.tenant_simulation``'s, here too for ``reports.benchmarks``."""

OUT = Path("docs/bench/tenants-simulated.json")
SEEDS = (1, 2, 3, 4, 5)
"""The arrival schedules every variant runs on."""
NOISY_RATES = {"A": 4.0, "B": 0.25}
"""The noisy neighbour's tenants and their demands, in multiples of μ."""
NOISY_DURATION_S = 3600.0
"""An hour of arrivals: B sends about 0.25 μ · 3600 (some 770 requests on the fleet's pods)."""
ZIPF_TENANTS, ZIPF_EXPONENT, ZIPF_LOADS = 100, 1.0, (2.0, 1.0)
ZIPF_DURATION_S = 7200.0
"""Two hours: the lightest of the 100 tenants (1/100 of the heaviest's demand) sends about
twenty requests at 2x on the fleet's pods."""
SATISFIED = 0.9
"""A tenant is served its fair share when its goodput reaches this part of it."""
VARIANTS = ("without", "with")
"""The gate's thresholds as the policy derives them, then with ``spec.tenants`` (defaults)."""
KEPT_FOR_B = (0, 1, 2)
"""The bound arms of the noisy neighbour (issue 28.2): B in a class of its own above A's, with
this many of the cap's slots only B may use. 0 keeps no slot idle (B only goes first among
the waiters: work-conserving); 1 and 2 keep slots for B (idle while B sends nothing)."""
BY_TENANT = {"A": "a", "B": "b"}
"""The bound arms' classes, by tenant."""


def kept_for_b(slots: int) -> str:
    """The bound arm's variant name."""
    return "b_first" if slots == 0 else f"b_kept_{slots}"


# --------------------------------------------------------------------------- fairness


def max_min_fair_shares(demands: Sequence[float], capacity: float) -> tuple[list[float], float]:
    """Water-filling: each tenant's max-min fair share of ``capacity`` (equal weights), and the
    water level (a tenant demanding less than it gets its demand; inf if every demand fits)."""
    if capacity < 0 or any(d < 0 for d in demands):
        raise ValueError("capacity and demands must be >= 0")
    left, level = capacity, math.inf
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    for served, i in enumerate(order):
        even = left / (len(order) - served)
        if demands[i] > even:
            level = even
            break
        left -= demands[i]
    return [min(d, level) for d in demands], level


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (Σx)² / (n Σx²): 1 when all are equal, 1/n when one takes all."""
    if not values or any(v < 0 for v in values):
        raise ValueError("Jain's index needs at least one value, none negative")
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 1.0


def fairness(demands_rps: Sequence[float], goodputs_rps: Sequence[float]) -> dict[str, float | int | None]:
    """The fairness of one run, over the tenants that sent something; their fair shares are of
    the run's own total goodput (what the gate achieved, divided as fairly as possible)."""
    sent = [(d, g) for d, g in zip(demands_rps, goodputs_rps, strict=True) if d > 0]
    demands, goodputs = [d for d, _ in sent], [g for _, g in sent]
    shares, level = max_min_fair_shares(demands, sum(goodputs))
    targets = [min(d, s) for d, s in zip(demands, shares, strict=True)]
    ratios = [g / t for g, t in zip(goodputs, targets, strict=True) if t > 0]
    light = [(d, g) for d, g in sent if d < level]
    light_demand = sum(d for d, _ in light)
    return {
        "tenants": len(sent),
        "fair_level_rps": None if math.isinf(level) else level,
        "satisfied_share": sum(r >= SATISFIED for r in ratios) / len(ratios) if ratios else None,
        "jain": jain_index(ratios) if ratios else None,
        "light_tenants": len(light),
        "light_goodput_ratio": sum(g for _, g in light) / light_demand if light_demand else None,
    }


# --------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class TenantPod:
    """The one simulated pod, and its thresholds without and with the tenant policy."""

    fleet: MeasuredFleet
    thresholds: Mapping[str, Thresholds]
    """``VARIANTS`` -> thresholds."""
    mu_rps: float

    @classmethod
    def read(cls, path: Path) -> TenantPod:
        """Pod 0 of docs/bench/fleet.json, both variants derived from its policy and profile."""
        fleet = MeasuredFleet.read(path)
        profile = CalibrationProfile.model_validate(fleet.raw["pods"][0]["profile"])
        policy = Policy.model_validate(fleet.raw["policy"])
        at = datetime.now(UTC)
        derived = {
            "without": derive_thresholds(policy, profile, derived_at=at),
            "with": derive_thresholds(policy.model_copy(update={"tenants": TenantsPolicy()}), profile, derived_at=at),
        }
        for slots in KEPT_FOR_B:
            classes = [ClassPolicy(name="b", reserved_slots=slots), ClassPolicy(name="a")]
            derived[kept_for_b(slots)] = derive_thresholds(policy.model_copy(update={"classes": classes}), profile,
                                                           derived_at=at)  # fmt: skip
        return cls(fleet, derived, fleet.pod_capacity_rps[0])

    def run(
        self,
        rates_rps: Mapping[str, float],
        variant: str,
        duration_s: float,
        seed: int,
        classes: Mapping[str, str] | None = None,
    ) -> SimulationResult:
        """Every tenant's arrivals at its rate, through the gate of ``variant``; ``classes``:
        each tenant's class (None: the default class)."""
        arrivals = tenant_schedule(rates_rps, duration_s, self.fleet.workload, seed=seed)
        trace = trace_of(arrivals)
        if classes is not None:
            trace = tuple(dataclasses.replace(a, class_name=classes[str(a.tenant)]) for a in trace)
        config = SimulationConfig(
            server=self.fleet.servers[0],
            workload=self.fleet.workload,
            arrival_rate_rps=len(trace) / duration_s,
            duration_s=duration_s,
            ttft_slo_s=self.fleet.slo_s,
            front=Gated(self.thresholds[variant]),
            capacity_rps=self.mu_rps,
            trace=trace,
        )
        return simulate(config)


def _counts(result: SimulationResult, tenant: str) -> TenantCounts:
    assert result.tenants is not None
    return result.tenants.get(tenant) or TenantCounts()


def noisy_neighbour(pod: TenantPod, console: Console) -> dict[str, Any]:
    """B alone, A+B without and with the tenant policy, on every seed."""
    rates = {t: x * pod.mu_rps for t, x in NOISY_RATES.items()}
    runs = []
    for seed in SEEDS:
        arms: list[tuple[str, Mapping[str, float], Mapping[str, str] | None]] = [
            ("alone", {"B": rates["B"]}, None), ("without", rates, None), ("with", rates, None),
            *((kept_for_b(slots), rates, BY_TENANT) for slots in KEPT_FOR_B),
        ]  # fmt: skip
        for name, sending, classes in arms:
            variant = "without" if name == "alone" else name
            result = pod.run(sending, variant, NOISY_DURATION_S, seed, classes)
            tenants = {t: asdict(_counts(result, t)) for t in sending}
            runs.append({"variant": name, "seed": seed, "goodput_rps": result.goodput_rps, "tenants": tenants})
            b = tenants["B"]
            console.print(
                f"  noisy {name} seed {seed}: B {b['completed_within_slo']}/{b['offered']} within SLO "
                f"(refused {b['rejected']}), total goodput {result.goodput_rps:.3f}/s"
            )
    return {"duration_s": NOISY_DURATION_S, "rates_x_mu": NOISY_RATES, "rates_rps": rates, "runs": runs}


def zipf(pod: TenantPod, console: Console) -> dict[str, Any]:
    """100 Zipf tenants at each load, without and with the tenant policy, on every seed."""
    names = list(zipf_rates(1.0, ZIPF_TENANTS, ZIPF_EXPONENT))
    runs = []
    for load in ZIPF_LOADS:
        rates = zipf_rates(load * pod.mu_rps, ZIPF_TENANTS, ZIPF_EXPONENT)
        for seed in SEEDS:
            for variant in VARIANTS:
                result = pod.run(rates, variant, ZIPF_DURATION_S, seed)
                counts = [_counts(result, t) for t in names]
                per_tenant: dict[str, list[Any]] = {f: [getattr(c, f) for c in counts] for f in _PER_TENANT}
                demands = [c.offered / ZIPF_DURATION_S for c in counts]
                goodputs = [c.completed_within_slo / ZIPF_DURATION_S for c in counts]
                per_tenant["fair_share_rps"] = max_min_fair_shares(demands, sum(goodputs))[0]
                measures = fairness(demands, goodputs)
                runs.append({"load": load, "variant": variant, "seed": seed, "offered": result.offered,
                             "goodput_rps": result.goodput_rps, "rejected": result.rejected,
                             "share_rejected": sum(per_tenant["share_rejected"]), "fairness": measures,
                             "per_tenant": per_tenant})  # fmt: skip
                console.print(
                    f"  zipf {load:g}x {variant} seed {seed}: goodput {result.goodput_rps:.3f}/s, "
                    f"satisfied {measures['satisfied_share']:.2f}, Jain {measures['jain']:.3f}"
                )
    return {
        "duration_s": ZIPF_DURATION_S,
        "tenants": ZIPF_TENANTS,
        "exponent": ZIPF_EXPONENT,
        "loads": list(ZIPF_LOADS),
        "satisfied_at": SATISFIED,
        "names": names,
        "demand_rps_at_1x": [r * pod.mu_rps for r in zipf_rates(1.0, ZIPF_TENANTS, ZIPF_EXPONENT).values()],
        "runs": runs,
    }


_PER_TENANT = ("offered", "admitted", "completed_within_slo", "rejected", "share_rejected", "timed_out")
"""The counts kept per tenant of a Zipf run (``TenantCounts``)."""


def main() -> None:
    """Run both parts on pod 0 of docs/bench/fleet.json; write the JSON and the figure."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, default=MEASURED)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--figure", type=Path, default=FIGURE)
    args = parser.parse_args()
    console = Console(stderr=True)
    pod = TenantPod.read(args.measured)
    started, wall, cpu = datetime.now(UTC), time.monotonic(), time.process_time()
    fair = pod.thresholds["with"].tenants
    assert fair is not None
    noisy = noisy_neighbour(pod, console)
    spread = zipf(pod, console)
    raw = {
        "environment": environment(),
        "started_at": started.isoformat(timespec="seconds"),
        "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": time.monotonic() - wall,
        "cpu_s": time.process_time() - cpu,
        "measured_started_at": pod.fleet.raw.get("started_at"),
        "slo_s": pod.fleet.slo_s,
        "workload": pod.fleet.raw["workload"],
        "client_timeout_s": pod.fleet.workload.client_timeout_s,
        "mu_rps": pod.mu_rps,
        "concurrency_cap": pod.thresholds["with"].concurrency_cap,
        "tenant_policy": fair.model_dump(mode="json", by_alias=True),
        "seeds": list(SEEDS),
        "noisy": noisy,
        "zipf": spread,
    }
    write_atomic(args.out, json.dumps(raw, indent=1) + "\n")
    figure(raw, args.figure)
    console.print(f"wrote {args.out} and {args.figure} in {raw['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
