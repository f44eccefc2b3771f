"""`make bench-cost-sim`: the cost order against arrival order in the simulator (issue 28.1);
writes docs/bench/cost-simulated.json and the measured block of docs/admission-math.md.

The pod is the one `make bench-full` calibrated (docs/bench/profile.json), under the suite's
policy (its TTFT SLO, maxWaitSeconds 0.5 s); the gate is the core's GateMachine with that policy
as it is (``shedding.order: arrival``) and with ``order: cost``, each on the very same arrivals
(``workloads.schedule``, ``SEEDS``) at 1x, 2x and 4x μ of both mixes. Per run: goodput (first
token within the SLO, per second) and its share of the clairvoyant's on the same trace
(``clairvoyant.bound_for_trace``), the share of admitted requests within the SLO, the token
goodput (prompt plus output tokens of on-time requests per second), and the on-time ratio of
each cost quartile (quartiles of the trace's own costs, ``demand.offered_work_s``; a request's
tenant is its quartile, so the simulator counts them apart).

``reports.cost_simulation`` renders the JSON; nothing here is edited by hand.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slogate_admission.decision import GateConfig
from slogate_admission.demand import offered_work_s
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_bench.published import ran
from slogate_bench.reports.cost_simulation import render
from slogate_calibration.output import write_atomic
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.clairvoyant import Bound, bound_for_trace
from slogate_sim.engine import simulate
from slogate_sim.fronts import Gated
from slogate_sim.scenario import config_for_trace
from slogate_sim.workloads import Arrival, preset, schedule

OUT = Path("docs/bench/cost-simulated.json")
PROFILE = Path("docs/bench/profile.json")
SLO_S = 2.0
"""The suite's TTFT SLO (``runs.suite.SLO_S``)."""
MAX_WAIT_S = 0.5
"""The suite's deferral bound."""
MIXES = ("chat", "heavy_tail")
LOADS = (1.0, 2.0, 4.0)
SEEDS = tuple(range(1, 9))
WINDOW_S = 600.0
ORDERS = ("arrival", "cost")


def thresholds_for(profile: CalibrationProfile, order: str) -> Thresholds:
    """The suite's policy with the given shedding order."""
    policy = Policy.model_validate(
        {"slo": {"ttftSeconds": SLO_S}, "deferral": {"maxWaitSeconds": MAX_WAIT_S}, "shedding": {"order": order}}
    )
    return derive_thresholds(policy, profile, derived_at=datetime(2026, 1, 1, tzinfo=UTC))


def by_quartile(config: GateConfig, arrivals: Sequence[Arrival]) -> list[Arrival]:
    """The trace with each request's tenant set to its cost quartile among the trace's, ``q1`` to ``q4``."""
    cost = [offered_work_s(config, a.prompt_tokens, a.max_tokens) for a in arrivals]
    bounds = statistics.quantiles(cost, n=4)
    return [
        dataclasses.replace(a, tenant=f"q{bisect.bisect_right(bounds, c) + 1}")
        for a, c in zip(arrivals, cost, strict=True)
    ]


def one_run(server: ServerModel, thresholds: Thresholds, tagged: Sequence[Arrival], bound: Bound) -> dict[str, Any]:
    """One order on one trace: the figures of the report."""
    result = simulate(config_for_trace(server, tagged, duration_s=WINDOW_S, ttft_slo_s=SLO_S, front=Gated(thresholds)))
    tokens: dict[str | None, list[int]] = {}
    for a in tagged:
        tokens.setdefault(a.tenant, []).append(a.prompt_tokens + a.max_tokens)
    quartiles = {}
    token_goodput = 0.0
    for name, counts in sorted((result.tenants or {}).items()):
        quartiles[name] = {"offered": counts.offered, "on_time": counts.completed_within_slo}
        token_goodput += counts.completed_within_slo * statistics.fmean(tokens[name])
    return {
        "goodput_rps": result.goodput_rps,
        "clairvoyant_rps": bound.clairvoyant_goodput_rps,
        "share": bound.share(result.goodput_rps),
        "admitted": result.admitted,
        "within_slo_of_admitted": result.completed_within_slo / result.admitted if result.admitted else None,
        "token_goodput_per_s": token_goodput / WINDOW_S,
        "quartiles": quartiles,
    }


def run_all(profile: CalibrationProfile) -> list[dict[str, Any]]:
    """Every mix, load and seed under both orders, on the same arrivals."""
    server = ServerModel.from_profile(profile)
    each = {order: thresholds_for(profile, order) for order in ORDERS}
    config = GateConfig.from_thresholds(each["arrival"])
    cap = each["arrival"].concurrency_cap
    rows = []
    for mix in MIXES:
        workload = preset(mix)
        mu = capacity_rps(server, workload, cap)
        for load in LOADS:
            for seed in SEEDS:
                arrivals = schedule(load * mu, WINDOW_S, workload, seed=1000 * seed + int(load * 100))
                tagged = by_quartile(config, arrivals)
                bound = bound_for_trace(server, cap, arrivals, SLO_S, WINDOW_S)
                for order in ORDERS:
                    row = one_run(server, each[order], tagged, bound)
                    rows.append({"mix": mix, "load": load, "seed": seed, "order": order, **row})
                print(f"{mix} {load:g}x seed {seed}: " + ", ".join(
                    f"{r['order']} {r['share']:.3f}" for r in rows[-len(ORDERS):]), flush=True)  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Run both orders on every trace, write the JSON and render the block."""
    parser = argparse.ArgumentParser(prog="python -m slogate_bench.runs.cost_simulation", description=__doc__)
    parser.parse_args(argv)
    profile = CalibrationProfile.model_validate_json(PROFILE.read_text())
    started, clock = datetime.now(UTC), time.perf_counter()
    rows = run_all(profile)
    results = {
        **ran(started, datetime.now(UTC)),
        "cpu_seconds_wall": round(time.perf_counter() - clock, 1),
        "profile": profile.id,
        "slo_s": SLO_S,
        "max_wait_s": MAX_WAIT_S,
        "window_s": WINDOW_S,
        "cost_reserve_slots": thresholds_for(profile, "cost").cost_reserve_slots,
        "runs": rows,
    }
    write_atomic(OUT, json.dumps(results, indent=1) + "\n")
    render()


if __name__ == "__main__":
    main()
