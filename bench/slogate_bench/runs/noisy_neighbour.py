"""`make bench-tenants`: the noisy neighbour on the real llama-server (issue 17.4), docs/bench/tenants.json.

One llama-server with one thread (as each of bench-fleet's pods: ``runs.fleet.pod_server``, at
nice 10, a fresh process per run), calibrated once (cached under ``<state>/profiles/``), the chat
mix in one class with the suite's policy (TTFT SLO 2 s, deferral up to 0.5 s). Two tenants send
their own Poisson arrivals, named by ``X-Slogate-Tenant``: A offers 4x μ, B 0.25x μ (μ:
``capacity.capacity_rps`` of the chat mix on that profile). Runs, each through the sidecar in its
own process, on the same arrivals per seed:

- ``B alone``: B's arrivals only, the tenant policy in force (a tenant alone is not limited, so
  this is B alone with or without it);
- ``A+B without tenants``: both, ``Policy.tenants`` unset (the gate sees one stream of requests);
- ``A+B with tenants``: both, ``spec.tenants`` at its defaults (equal weights);
- ``A+B direct`` (``--direct``): both, llama-server alone, for context.

A tenant's arrivals depend on the seed and its name only (``tenant_schedule``), so B is sent the
very same requests in every run of a seed: its difference between runs is the gate's doing.

docs/bench/tenants.json: ``environment``, ``started_at``, ``ended_at``, ``duration_min``, ``cpu_count``,
``profile`` (the CalibrationProfile), ``policy`` (the Policy with tenants, camelCase),
``tenant_thresholds`` (what the gate enforced, the output weight resolved), ``slo_s``, ``workload``,
``client_timeout_s``, ``duration_s``, ``seeds``, ``llama_server``, ``llama_niceness``,
``capacity_rps`` (μ), ``loads`` and ``rates_rps`` per tenant, ``variants`` (in run order), ``runs``
(``run_row``: per tenant and in total the client's counts, ``gate``: the sidecar's own counts), and
``summary`` and ``goals`` (``reports.tenants``), so the report reads numbers only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_admission.tenant_schema import TenantsPolicy
from slogate_bench.live.fronts import DirectFront, SlogateFront
from slogate_bench.live.load import run_arrivals
from slogate_bench.published import ran
from slogate_bench.reports.tenants import (
    B_ALONE,
    DIRECT_NAME,
    LIGHT,
    NOISY,
    TOTAL,
    WITH,
    WITHOUT,
    goals,
    summary,
    tenants_plot,
)
from slogate_bench.results import Result, Run
from slogate_bench.runs.demo import demo_policy
from slogate_bench.runs.fleet import CALIBRATION_BUDGET_S, POD_THREADS, pod_server
from slogate_bench.runs.suite import LLAMA_NICENESS, SLO_S
from slogate_calibration.calibrate import CalibrationSettings
from slogate_calibration.output import write_atomic
from slogate_calibration.profile_cache import Say, cached_or_calibrated
from slogate_calibration.runtime import LlamaRuntime, locate
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.tenant_traffic import tenant_schedule
from slogate_sim.workloads import Arrival, preset

LOADS = {NOISY: 4.0, LIGHT: 0.25}
"""Each tenant's offered load, x μ."""
SEEDS = (1, 2, 3, 4, 5)
SECONDS = 60.0
"""Each run's arrival window: B sends about 0.25 μ x 60 s ≈ 12 requests a run at one thread's μ ≈ 0.8/s.
Fifteen runs of about 63 s (the window, the last clients' patience, fresh processes; 9.3 min
for nine) and one calibration (at most ``CALIBRATION_BUDGET_S``, cached after) keep
`make bench-tenants` near 16 minutes."""
WORKLOAD = "chat"
OUT = Path("docs/bench/tenants.json")
OUTCOME_KEYS = ("requests", "ok", "within_slo", "rejected", "refused", "timeout", "error")
"""``Run.summary``'s counts, kept in each tally (``results.outcome_counts`` reads them)."""

Front = Literal["slogate", "direct"]


@dataclass(frozen=True)
class Variant:
    """One kind of run: who sends, and what stands in front of llama-server."""

    name: str
    """What the JSON and the report call it."""
    tenants: tuple[str, ...]
    """The tenants that send (each at its ``LOADS``)."""
    front: Front
    """The sidecar, or nothing (llama-server alone)."""
    tenant_policy: bool
    """The sidecar enforces ``spec.tenants`` (defaults); False: tenants are not told apart."""


VARIANTS = (
    Variant(B_ALONE, (LIGHT,), "slogate", tenant_policy=True),
    Variant(WITHOUT, (NOISY, LIGHT), "slogate", tenant_policy=False),
    Variant(WITH, (NOISY, LIGHT), "slogate", tenant_policy=True),
)
"""What every seed runs, in this order; ``DIRECT`` is added by ``--direct``."""
DIRECT = Variant(DIRECT_NAME, (NOISY, LIGHT), "direct", tenant_policy=False)


def policies(slo_s: float = SLO_S) -> tuple[Policy, Policy]:
    """The suite's policy without, then with, ``spec.tenants`` at its defaults."""
    without = demo_policy(slo_s)
    return without, without.model_copy(update={"tenants": TenantsPolicy()})


def tally(results: Sequence[Result], duration_s: float, slo_s: float) -> dict[str, Any]:
    """What became of these requests, from the client: ``Run.summary``'s counts, goodput, TTFT
    quantiles, and ``admitted`` (answered neither 429/503 nor 400: the front let it through) with
    ``attainment``, the share of the admitted whose first token came within the SLO (None: none
    admitted)."""
    run = Run(duration_s, list(results))
    counts = run.summary(slo_s)
    admitted = len(results) - run.count("rejected") - run.count("refused")
    within = len(run.within(slo_s))
    return {
        **{key: counts[key] for key in OUTCOME_KEYS},
        "admitted": admitted,
        "goodput_rps": run.goodput(slo_s),
        "attainment": within / admitted if admitted else None,
        "ttft_p50_s": counts["ttft_p50_s"],
        "ttft_p99_s": counts["ttft_p99_s"],
    }


def tenant_tallies(run: Run, tenants: Sequence[str], slo_s: float) -> dict[str, dict[str, Any]]:
    """``tally`` per tenant that sent, and over all of them (``TOTAL``)."""
    tallies = {t: tally([r for r in run.results if r.tenant == t], run.duration_s, slo_s) for t in tenants}
    return {**tallies, TOTAL: tally(run.results, run.duration_s, slo_s)}


TENANT_COUNTERS = {
    "slogate_tenant_admitted_requests": "admitted",
    "slogate_tenant_refused_requests": "refused",
    "slogate_tenant_share_refusals": "share_refusals",
}
"""The sidecar's per-tenant counters (docs/metrics.md) -> the key they get in ``gate_tallies``."""


def gate_tallies(metrics_text: str) -> dict[str, Any]:
    """What the sidecar counted itself, from its /metrics: ``reject_reasons``, its reject decisions
    by failed predicate (one decision failing two counts under both), summed over classes;
    ``tenants``, per tenant account, its admitted and refused requests and the refusals naming
    ``tenant_share`` (empty without a tenant policy: the sidecar exports no tenant series then)."""
    reasons: dict[str, int] = {}
    tenants: dict[str, dict[str, int]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name == "slogate_decisions" and sample.labels.get("outcome") == "reject":
                reason = sample.labels["reason"]
                reasons[reason] = reasons.get(reason, 0) + int(sample.value)
            elif (key := TENANT_COUNTERS.get(family.name)) is not None:
                counts = tenants.setdefault(sample.labels["tenant"], dict.fromkeys(TENANT_COUNTERS.values(), 0))
                counts[key] += int(sample.value)
    return {"reject_reasons": dict(sorted(reasons.items())), "tenants": dict(sorted(tenants.items()))}


def run_row(variant: Variant, seed: int, run: Run, gate: Mapping[str, Any] | None, slo_s: float) -> dict[str, Any]:
    """One run of tenants.json: which, and what became of each tenant's requests."""
    return {
        "variant": variant.name,
        "seed": seed,
        "front": variant.front,
        "tenant_policy": variant.tenant_policy,
        "duration_s": run.duration_s,
        "tenants": tenant_tallies(run, variant.tenants, slo_s),
        "gate": gate,
        "client_cpu_share": run.client_cpu_share(),
        "max_lag_s": run.max_lag_s(),
    }


async def one_thread_profile(runtime: LlamaRuntime, state_dir: Path, say: Say) -> CalibrationProfile:
    """The cached profile of a one-thread llama-server (as the runs start it), else a calibration."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with pod_server(runtime, state_dir / "tenants-calibration.log") as server:
        settings = CalibrationSettings(upstream=server.url, server_args=server.args[1:], budget_s=CALIBRATION_BUDGET_S)
        return await cached_or_calibrated(settings, state_dir, say)


async def measure(
    variant: Variant,
    runtime: LlamaRuntime,
    thresholds: Thresholds,
    *,
    arrivals: list[Arrival],
    duration_s: float,
    timeout_s: float,
    work_dir: Path,
) -> tuple[Run, dict[str, Any] | None]:
    """``arrivals`` through ``variant``'s front to a fresh one-thread llama-server: the run, and
    the sidecar's own counts (None: no sidecar)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with pod_server(runtime, work_dir / "llama-server.log", LLAMA_NICENESS) as server:
        if variant.front == "direct":
            async with DirectFront().in_front_of(server.url, work_dir) as direct:
                return await run_arrivals(direct.url, arrivals, duration_s, timeout_s=timeout_s), None
        async with SlogateFront(thresholds).in_front_of(server.url, work_dir) as gate:
            run = await run_arrivals(gate.url, arrivals, duration_s, timeout_s=timeout_s)
            return run, gate_tallies(await gate.metrics())


async def noisy_neighbour(
    state_dir: Path, console: Console, seconds: float, seeds: Sequence[int], variants: Sequence[Variant]
) -> dict[str, Any]:
    """Calibrate, then every variant on every seed: tenants.json's content."""
    started = datetime.now(UTC)
    runtime = locate()
    workload = preset(WORKLOAD)
    profile = await one_thread_profile(runtime, state_dir, console.print)
    without, with_tenants = policies()
    derived = {
        policy_on: derive_thresholds(policy, profile, derived_at=datetime.now(UTC))
        for policy_on, policy in ((False, without), (True, with_tenants))
    }
    mu = capacity_rps(ServerModel.from_profile(profile), workload, derived[True].concurrency_cap)
    rates = {tenant: load * mu for tenant, load in LOADS.items()}
    console.print(
        f"μ {mu:.2f} req/s (calibration {profile.id}): " + ", ".join(f"{t} {r:.2f}/s" for t, r in rates.items())
    )
    rows = []
    for seed in seeds:  # seeds outermost: a stopped bench still leaves whole seeds
        for variant in variants:
            sending = {t: rates[t] for t in variant.tenants}
            arrivals = tenant_schedule(sending, seconds, workload, seed=seed)
            work_dir = state_dir / "tenants-logs" / f"{variant.name.replace(' ', '_')}-{seed}"
            run, gate = await measure(
                variant, runtime, derived[variant.tenant_policy],
                arrivals=arrivals, duration_s=seconds, timeout_s=workload.client_timeout_s, work_dir=work_dir,
            )  # fmt: skip
            row = run_row(variant, seed, run, gate, SLO_S)
            rows.append(row)
            console.print(
                f"seed {seed} {variant.name:<20} "
                + ", ".join(
                    f"{t}: {c['requests']} sent, goodput {c['goodput_rps']:.2f}/s, {c['rejected']} rejected"
                    for t, c in row["tenants"].items()
                )
                + (f"; gate {gate}" if gate else "")
            )
    ended = datetime.now(UTC)
    tenant_thresholds = derived[True].tenants
    raw: dict[str, Any] = {
        **ran(started, ended),
        "profile": profile.model_dump(mode="json", by_alias=True),
        "policy": with_tenants.model_dump(mode="json", by_alias=True),
        "tenant_thresholds": tenant_thresholds.model_dump(mode="json", by_alias=True) if tenant_thresholds else None,
        "concurrency_cap": derived[True].concurrency_cap,
        "slo_s": SLO_S,
        "workload": workload.name,
        "client_timeout_s": workload.client_timeout_s,
        "duration_s": seconds,
        "seeds": list(seeds),
        "llama_server": f"-t {POD_THREADS} -np 4 -c 8192 (bench-fleet's pod), a fresh process per run",
        "llama_niceness": LLAMA_NICENESS,
        "capacity_rps": mu,
        "loads": dict(LOADS),
        "rates_rps": rates,
        "variants": [v.name for v in variants],
        "runs": rows,
    }
    raw["summary"] = summary(raw)
    raw["goals"] = goals(raw)
    return raw


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", type=Path, default=Path(".slogate"))
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON written (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="each run's arrival window")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="arrival schedules")
    parser.add_argument("--direct", action="store_true", help="also send A+B to llama-server alone")
    args = parser.parse_args(argv)
    console = Console(width=160)
    variants = (*VARIANTS, DIRECT) if args.direct else VARIANTS
    clock = time.monotonic()
    raw = asyncio.run(noisy_neighbour(args.state_dir, console, args.seconds, args.seeds, variants))
    write_atomic(args.out, json.dumps(raw, indent=2) + "\n")
    tenants_plot(raw, args.out.parent / "tenants.png")
    for goal in raw["goals"]:
        console.print(f"{goal['goal']}: {goal['measured']} ({goal['verdict']})")
    console.print(f"wrote {args.out} in {(time.monotonic() - clock) / 60:.1f} min")


if __name__ == "__main__":
    main()
