"""`make bench-fleet`: a real fleet on this machine (issue 15, point 3), docs/bench/fleet.json.

Two llama-server pods (``-t 1 -np 4 -c 8192``: one thread each, the single-pod suite's four
slots of 2,048 cells), each calibrated on its own, one after the other while the other pod
is up and idle, with thresholds derived from the suite's policy (``demo_policy``, TTFT SLO
2 s). Debian's nginx spreads the clients over the pods (``balancer``); what stands in front
of each pod depends on the front:

- ``direct``: nginx random straight to the llama-servers;
- ``count-cap``: nginx random to one count-cap proxy per pod (``limits.fair_count_cap`` of that pod);
- ``random``: nginx random to one ``slogate sidecar`` per pod, no retry;
- ``least_conn``: the same sidecars, nginx ``least_conn``, no retry;
- ``retry``: nginx random, a 429/503 retried on the other pod (2 tries: the number of pods);
- ``least_conn+retry``: ``least_conn`` with the same retry.

Each front runs at 1x, 2x and 4x of the fleet's capacity (the sum of the pods' μ for the chat
mix, ``capacity``) on the same arrival schedule per load (``suite.schedule_seed``), from fresh
llama-servers (at nice 10, as in the suite). Clients never retry themselves: nginx does, and
says which pods it tried (``TRIED_HEADER``, read by ``results.Result.tries``). Calibrations are
cached per pod under ``.slogate/fleet/pod-N/`` (``--recalibrate``, which ``make bench-fleet``
passes, measures both again); logs go to ``.slogate/fleet-logs/``.

docs/bench/fleet.json, the input of ``fleet_report`` and of the fleet simulator's validation:

- ``environment`` (machine and versions, ``published.environment``), ``started_at``,
  ``ended_at`` (UTC, ISO 8601), ``duration_min``, ``cpu_count``;
- ``policy`` (the Policy, camelCase), ``slo_s``, ``workload`` (a ``workloads.preset`` name),
  ``client_timeout_s``, ``duration_s`` (each run's arrival window), ``seed`` (``schedule_seed``'s),
  ``loads``, ``pod_server`` (llama-server's flags), ``llama_niceness``;
- ``pods``: per pod, ``profile`` (its CalibrationProfile), ``thresholds`` (its Thresholds),
  ``capacity_rps`` (its μ for the workload) and ``count_cap`` (``concurrency``, ``queue``);
- ``capacity_rps``: the fleet's, the sum of the pods';
- ``runs``: one row per (front, load) (``fleet_row``): ``front``, ``layer``, ``routing``, ``tries``
  (nginx's), ``load``, ``arrival_rate_rps``, ``schedule_seed``, ``duration_s``, ``offered``,
  ``goodput_rps``, ``admitted``, ``admitted_within_slo``, ``refused_after_tries``, ``never_fits``,
  ``tries_mean``, ``tries_max``, ``tries_unknown``, ``tries_counts``, ``ttft_p50_s``, ``ttft_p99_s``,
  ``per_pod_served``, ``per_pod_within_slo`` (lists indexed like ``pods``), ``Run.summary``'s counts
  (``requests``, ``ok``, ``within_slo``, ``rejected``, ``refused``, ``timeout``, ``error``),
  ``client_cpu_share`` and ``max_lag_s`` (the load generator's own load).

A row's arrivals are ``workloads.schedule(arrival_rate_rps, duration_s, preset(workload),
seed=schedule_seed)``: a replay sends the very same requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_bench.live.balancer import Balancing, spawned_balancer
from slogate_bench.live.fronts import DirectFront, Front, SlogateFront, line_up
from slogate_bench.live.load import run_arrivals
from slogate_bench.published import ran
from slogate_bench.results import Run
from slogate_bench.runs.demo import demo_policy
from slogate_bench.runs.suite import LLAMA_NICENESS, SLO_S, schedule_seed
from slogate_calibration.calibrate import CalibrationSettings
from slogate_calibration.output import write_atomic
from slogate_calibration.profile_cache import Say, cached_or_calibrated
from slogate_calibration.runtime import LlamaRuntime, LlamaServer, locate
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.workloads import Arrival, Workload, preset, schedule

PODS = 2
POD_THREADS = 1
LOADS = (1.0, 2.0, 4.0)
SECONDS = 30.0
"""Each run's arrival window. A run took 36 s here (fresh processes, the last requests' end): 18 runs
and two calibrations (at most ``CALIBRATION_BUDGET_S`` each) keep `make bench-fleet` within 20 minutes."""
SEED = 1
CALIBRATION_BUDGET_S = 150.0
"""Per pod; one thread needs about twice the two-thread suite's minimum work (docs/calibration.md)."""
WORKLOAD = "chat"
OUT = Path("docs/bench/fleet.json")

Layer = Literal["direct", "count-cap", "slogate"]
"""What stands in front of each pod, behind nginx."""


@dataclass(frozen=True)
class FleetFront:
    """One way to front the fleet: nginx's balancing, and what each pod has in front of it."""

    name: str
    """What runs and the report call it."""
    layer: Layer
    """Per pod: nothing (``direct``), a count-cap proxy, or its slogate sidecar."""
    balancing: Balancing
    """nginx's routing and tries."""


FRONTS: tuple[FleetFront, ...] = (
    FleetFront("direct", "direct", Balancing("random")),
    FleetFront("count-cap", "count-cap", Balancing("random")),
    FleetFront("random", "slogate", Balancing("random")),
    FleetFront("least_conn", "slogate", Balancing("least_conn")),
    FleetFront("retry", "slogate", Balancing("random", tries=PODS)),
    FleetFront("least_conn+retry", "slogate", Balancing("least_conn", tries=PODS)),
)


@dataclass(frozen=True)
class Pod:
    """One pod's calibration and what is derived from it."""

    profile: CalibrationProfile
    """Its own calibration."""
    thresholds: Thresholds
    """Derived from the fleet's policy and its profile."""
    capacity_rps: float
    """Its μ for the workload at its concurrency cap."""

    @classmethod
    def derived(cls, profile: CalibrationProfile, policy: Policy, workload: Workload) -> Pod:
        """The pod ``profile`` measured, with thresholds for ``policy`` and μ of ``workload``."""
        thresholds = derive_thresholds(policy, profile, derived_at=datetime.now(UTC))
        mu = capacity_rps(ServerModel.from_profile(profile), workload, thresholds.concurrency_cap)
        return cls(profile, thresholds, mu)

    def front(self, layer: Layer) -> Front:
        """What stands in front of this pod for a fleet front of ``layer``."""
        if layer == "direct":
            return DirectFront()
        fronts = line_up(self.thresholds, self.capacity_rps, SLO_S)  # the suite's fair tuning
        return fronts.count_cap if layer == "count-cap" else SlogateFront(self.thresholds)


@dataclass(frozen=True)
class Balanced:
    """A fleet front, running."""

    url: str
    """nginx: where clients send."""
    pods: tuple[str, ...]
    """Pod i's address as nginx names it (``host:port`` of what stands in front of it)."""


def hostport(url: str) -> str:
    """``http://127.0.0.1:8080`` -> ``127.0.0.1:8080``, as nginx's ``$upstream_addr`` names it."""
    return url.removeprefix("http://").rstrip("/")


@asynccontextmanager
async def fleet_in_front_of(
    front: FleetFront, pods: Sequence[Pod], upstreams: Sequence[str], work_dir: Path
) -> AsyncIterator[Balanced]:
    """Each pod's front (files in ``work_dir/pod-N``) before its upstream, nginx over them all."""
    async with AsyncExitStack() as stack:
        addresses = []
        for index, (pod, upstream) in enumerate(zip(pods, upstreams, strict=True)):
            pod_dir = work_dir / f"pod-{index}"
            pod_dir.mkdir(parents=True, exist_ok=True)
            started = await stack.enter_async_context(pod.front(front.layer).in_front_of(upstream, pod_dir))
            addresses.append(hostport(started.url))
        nginx = await stack.enter_async_context(spawned_balancer(work_dir, addresses, front.balancing))
        yield Balanced(nginx.url, tuple(addresses))


async def measure(
    front: FleetFront,
    pods: Sequence[Pod],
    upstreams: Sequence[str],
    work_dir: Path,
    *,
    arrivals: list[Arrival],
    duration_s: float,
    timeout_s: float,
) -> tuple[Run, tuple[str, ...]]:
    """``arrivals`` sent through ``front`` over pods already serving at ``upstreams``: the run, and
    pod i's address as nginx named it (to tell which pod answered)."""
    async with fleet_in_front_of(front, pods, upstreams, work_dir) as fleet:
        run = await run_arrivals(fleet.url, arrivals, duration_s, timeout_s=timeout_s)
    return run, fleet.pods


OUTCOME_KEYS = ("requests", "ok", "within_slo", "rejected", "refused", "timeout", "error")
"""``Run.summary``'s counts, kept in each row (``results.outcome_counts`` reads them)."""


def fleet_row(
    front: FleetFront, run: Run, *, load: float, rate_rps: float, seed: int, pods: Sequence[str], slo_s: float
) -> dict[str, Any]:
    """One row of fleet.json from one run (``pods``: pod i's address as nginx names it).

    ``offered``: requests sent (``requests`` too); ``admitted``: those no front refused (sent
    minus ``refused_after_tries``, the 429/503 nginx passed on after its last try, minus
    ``never_fits``, slogate's 400 for a request that can never meet the SLO); of them
    ``admitted_within_slo`` completed with a first token within the SLO (the goodput's
    requests). ``tries_mean``/``tries_max`` over the requests whose answer named the pods tried
    (``tries_unknown``: clients gave up before any answer), ``tries_counts`` how many needed each
    number of tries (``{"1": 40, "2": 7}``). ``per_pod_served``: completed
    requests by the pod that answered; ``per_pod_within_slo``: those within the SLO.
    """
    summary = run.summary(slo_s)
    by_address = {address: index for index, address in enumerate(pods)}
    served, on_time = [0] * len(pods), [0] * len(pods)
    for result in run.results:
        pod = by_address.get(result.answered_by or "")
        if result.outcome == "ok" and pod is not None:
            served[pod] += 1
            on_time[pod] += result.ttft_s is not None and result.ttft_s <= slo_s
    tries = [r.tries for r in run.results if r.tries > 0]
    rejected, never_fits = run.count("rejected"), run.count("refused")
    return {
        "front": front.name,
        "layer": front.layer,
        "routing": front.balancing.routing,
        "tries": front.balancing.tries,
        "load": load,
        "arrival_rate_rps": rate_rps,
        "schedule_seed": seed,
        "duration_s": run.duration_s,
        "offered": len(run.results),
        "goodput_rps": run.goodput(slo_s),
        "admitted": len(run.results) - rejected - never_fits,
        "admitted_within_slo": summary["within_slo"],
        "refused_after_tries": rejected,
        "never_fits": never_fits,
        "tries_mean": statistics.fmean(tries) if tries else None,
        "tries_max": max(tries, default=None),
        "tries_unknown": len(run.results) - len(tries),
        "tries_counts": {str(n): tries.count(n) for n in sorted(set(tries))},
        "ttft_p50_s": run.ttft_quantile(0.5),
        "ttft_p99_s": run.ttft_quantile(0.99),
        "per_pod_served": served,
        "per_pod_within_slo": on_time,
        **{key: summary[key] for key in OUTCOME_KEYS},
        "client_cpu_share": run.client_cpu_share(),
        "max_lag_s": run.max_lag_s(),
    }


def pod_server(runtime: LlamaRuntime, log: Path, niceness: int = 0) -> LlamaServer:
    """One pod's llama-server: one thread, the suite's slots and context."""
    return LlamaServer(runtime, threads=POD_THREADS, log_path=log, niceness=niceness)


async def calibrated_pods(
    runtime: LlamaRuntime, state_dir: Path, say: Say, budget_s: float = CALIBRATION_BUDGET_S
) -> list[CalibrationProfile]:
    """Each pod's own profile, measured one at a time while the other pod is up and idle
    (cached per pod: the two share a fingerprint, never a calibration)."""
    with ExitStack() as stack:
        servers = [
            stack.enter_context(pod_server(runtime, state_dir / f"fleet-calibration-pod-{i}.log")) for i in range(PODS)
        ]
        profiles = []
        for index, server in enumerate(servers):
            settings = CalibrationSettings(upstream=server.url, server_args=server.args[1:], budget_s=budget_s)
            say(f"pod {index}:")
            profiles.append(await cached_or_calibrated(settings, pod_cache(state_dir, index), say))
    return profiles


def pod_cache(state_dir: Path, index: int) -> Path:
    """Pod ``index``'s own profile cache."""
    return state_dir / "fleet" / f"pod-{index}"


async def fleet_bench(state_dir: Path, console: Console, seconds: float) -> dict[str, Any]:
    """Calibrate both pods, then every front at every load: fleet.json's content."""
    started = datetime.now(UTC)
    runtime = locate()
    workload, policy = preset(WORKLOAD), demo_policy(SLO_S)
    pods = [Pod.derived(p, policy, workload) for p in await calibrated_pods(runtime, state_dir, console.print)]
    capacity = sum(pod.capacity_rps for pod in pods)
    console.print(f"fleet capacity {capacity:.2f} req/s (" + " + ".join(f"{p.capacity_rps:.2f}" for p in pods) + ")")
    log_dir = state_dir / "fleet-logs"
    rows = []
    for load in LOADS:
        seed, rate = schedule_seed(SEED, load), load * capacity
        arrivals = schedule(rate, seconds, workload, seed=seed)
        for front in FRONTS:
            work_dir = log_dir / f"{front.name}-{load:g}x"
            work_dir.mkdir(parents=True, exist_ok=True)
            with ExitStack() as stack:  # fresh pods: an ungated overload leaves work queued in them
                upstreams = [
                    stack.enter_context(pod_server(runtime, work_dir / f"llama-pod-{i}.log", LLAMA_NICENESS)).url
                    for i in range(PODS)
                ]
                run, addresses = await measure(
                    front, pods, upstreams, work_dir,
                    arrivals=arrivals, duration_s=seconds, timeout_s=workload.client_timeout_s,
                )  # fmt: skip
            row = fleet_row(front, run, load=load, rate_rps=rate, seed=seed, pods=addresses, slo_s=SLO_S)
            rows.append(row)
            console.print(
                f"{front.name:<17} {load:g}x: {row['offered']} sent, goodput {row['goodput_rps']:.2f}/s, "
                f"{row['refused_after_tries']} refused after tries, tries {row['tries_mean'] or 0:.2f} "
                f"(max {row['tries_max']}), served per pod {row['per_pod_served']}"
            )
    ended = datetime.now(UTC)
    count_caps = [line_up(p.thresholds, p.capacity_rps, SLO_S).count_cap.cap for p in pods]
    return {
        **ran(started, ended),
        "policy": policy.model_dump(mode="json", by_alias=True),
        "slo_s": SLO_S,
        "workload": workload.name,
        "client_timeout_s": workload.client_timeout_s,
        "duration_s": seconds,
        "seed": SEED,
        "loads": list(LOADS),
        "pod_server": f"-t {POD_THREADS} -np 4 -c 8192 (LlamaServer's slots and context), a fresh process per run",
        "llama_niceness": LLAMA_NICENESS,
        "pods": [
            {
                "profile": pod.profile.model_dump(mode="json", by_alias=True),
                "thresholds": pod.thresholds.model_dump(mode="json", by_alias=True),
                "capacity_rps": pod.capacity_rps,
                "count_cap": {"concurrency": cap.concurrency, "queue": cap.queue},
            }
            for pod, cap in zip(pods, count_caps, strict=True)
        ],
        "capacity_rps": capacity,
        "runs": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", type=Path, default=Path(".slogate"))
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON written (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="each run's arrival window")
    parser.add_argument("--recalibrate", action="store_true", help="drop the pods' cached profiles first")
    args = parser.parse_args()
    console = Console(width=140)
    if args.recalibrate:
        for index in range(PODS):
            shutil.rmtree(pod_cache(args.state_dir, index), ignore_errors=True)
    clock = time.monotonic()
    raw = asyncio.run(fleet_bench(args.state_dir, console, args.seconds))
    write_atomic(args.out, json.dumps(raw, indent=2) + "\n")
    console.print(f"wrote {args.out} in {(time.monotonic() - clock) / 60:.1f} min")


if __name__ == "__main__":
    main()
