"""`slogate simulate`'s work: a policy previewed in the simulator, as a report the CLI prints.

Every front at every load (and, for a fleet of ``replicas`` pods, every routing) on the
same arrivals (one seed), μ by ``capacity.capacity_rps``, what the workload can never get
(warnings), and, in the exponential service mode, the closed forms beside the simulation:
each request replaced by Exp(slots/μ) seconds of work on one of ``slots`` parallel slots;
with one slot and one pod, M/M/1's W = 1 / (μ − λ); with a count cap of at most ``slots``
and no queue, Erlang B's blocking, per pod under ``random`` routing, over the whole fleet
under ``least-pressure``. The CLI parses and prints the table (``slogate_cli.simulate_table``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any

from slogate_admission.derivation import longest_prompt_within
from slogate_admission.queueing import erlang_b, mm1_time_in_system
from slogate_admission.schema import CalibrationProfile, ClassThresholds, Thresholds
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.engine import simulate
from slogate_sim.fronts import CountCapped, line_up
from slogate_sim.lengths import Lengths
from slogate_sim.limits import CountCap, fair_count_cap
from slogate_sim.routing import Routing
from slogate_sim.scenario import GateKind, SimulationConfig, config_for_load
from slogate_sim.workloads import CHAT_OUTPUTS, CHAT_PROMPTS, DEFAULT_CLIENT_TIMEOUT_S, ServiceMode, Workload

CHAT = "chat"
"""What the chat mix's lengths are called on the command line and in reports."""


@dataclass(frozen=True)
class PreviewRequest:
    """What `slogate simulate` is asked."""

    profile: CalibrationProfile
    """The calibrated server."""
    thresholds: Thresholds
    """Derived from the profile and the policy: what the slogate front enforces."""
    prompt_tokens: Lengths
    """n_in of the simulated requests."""
    output_tokens: Lengths
    """n_out, generated in full."""
    gates: tuple[GateKind, ...]
    """The fronts compared."""
    loads: tuple[float, ...]
    """Offered loads, x μ."""
    duration_s: float
    """Simulated seconds of arrivals."""
    seed: int
    """The same seed, the same arrivals for every front."""
    service: ServiceMode = "profile"
    """``exponential``: the M/M/1 check."""
    client_timeout_s: float | None = None
    """None: 10 s, and never in the exponential mode."""
    count_cap_concurrency: int | None = None
    """The count-cap front's streams; None: the derived concurrency cap."""
    count_cap_queue: int | None = None
    """The count-cap front's queue; None: the fair one the benchmarks use, floor(SLO · μ)
    (``limits.fair_count_cap``), the deepest whose last request still starts within the SLO."""
    replicas: int = 1
    """Pods, each its own server and front, behind the balancer."""
    routings: tuple[Routing, ...] = (Routing(),)
    """How arrivals find a pod (``routing``); each is run at every gate and load."""
    slots: int = 1
    """The exponential mode's parallel slots per pod (1: the M/M/1 check)."""


def describe(lengths: Lengths) -> str:
    """As given on the command line: ``chat``, ``512`` or ``100-900``."""
    return CHAT if lengths in (CHAT_PROMPTS, CHAT_OUTPUTS) else lengths.describe()


def _percent(share: float) -> str:
    return "<0.1%" if 0 < share < 0.001 else f"{share:.1%}"


def workload_warnings(
    server: ServerModel, workload: Workload, default: ClassThresholds, gates: tuple[GateKind, ...]
) -> list[str]:
    """What the workload cannot get whatever the load: requests whose own prefill on an idle
    server misses the default class's TTFT SLO (warned if there is any), and, for the slogate
    gate, those beyond the class's admit-now budget when the classes above cap it lower."""
    if workload.service == "exponential":  # no token counts: prefill is not simulated
        return []
    warnings = []
    within_slo = longest_prompt_within(server.prefill, default.ttft_slo_seconds)
    missed = workload.prompt_tokens.share_over(within_slo)
    slo_text = f"the {default.ttft_slo_seconds:g} s TTFT SLO of class {default.name!r}"
    if missed >= 1:
        warnings.append(
            f"every request of the workload needs more than {slo_text} for its own prefill on an idle server "
            f"(only prompts up to {within_slo} tokens fit): no gate serves any within it, goodput is 0"
        )
    elif missed > 0:
        warnings.append(
            f"{_percent(missed)} of the workload's requests (prompts over {within_slo} tokens) need more than "
            f"{slo_text} for their own prefill on an idle server: no gate serves them within it, so goodput "
            f"is at most {_percent(1 - missed)} of the offered rate"
        )
    if "slogate" in gates and default.ttft_budget_seconds < default.ttft_slo_seconds:
        within_budget = longest_prompt_within(server.prefill, default.ttft_budget_seconds)
        refused = workload.prompt_tokens.share_over(within_budget)
        if refused > missed:
            warnings.append(
                f"slogate never admits {_percent(refused)} of the workload's requests (prompts over "
                f"{within_budget} tokens): the admit-now TTFT budget of class {default.name!r} is "
                f"{default.ttft_budget_seconds:g} s, capped by the classes above it"
            )
    return warnings


def exponential_check(
    server: ServerModel, workload: Workload, streams: int, slots: int
) -> tuple[ServerModel, Workload]:
    """The closed-form check: the same μ, as Exp(slots/μ) seconds of work on each of
    ``slots`` parallel slots (one slot: M/M/1)."""
    mu = capacity_rps(server, workload, streams)
    return ServerModel(slots, server.prefill, server.decode), dataclasses.replace(
        workload, service="exponential", exponential_mean_s=slots / mu
    )


def erlang_b_check(config: SimulationConfig, cap: CountCap) -> float | None:
    """Erlang B's blocking for an exponential run whose pods are loss systems (a count cap
    of at most the slots, no queue): per pod under ``random`` (Poisson split N ways),
    for the fleet under ``least-pressure``; None for any other run."""
    front = config.front
    if (
        config.workload.service != "exponential"
        or not isinstance(front, CountCapped)
        or cap.queue
        or cap.concurrency > config.server.slots
    ):
        return None
    erlangs = config.arrival_rate_rps * config.workload.exponential_mean_s
    if config.routing.name == "random":
        return erlang_b(cap.concurrency, erlangs / config.replicas)
    if config.routing.name == "least-pressure":
        return erlang_b(cap.concurrency * config.replicas, erlangs)
    return None


def _count_cap(request: PreviewRequest, server: ServerModel, workload: Workload, slo_s: float) -> CountCap:
    """The count-cap front: as given, else as a careful operator would size it (``fair_count_cap``:
    the concurrency cap's streams, and the queue whose last request starts within the SLO)."""
    streams = request.count_cap_concurrency or request.thresholds.concurrency_cap
    if request.count_cap_queue is not None:
        return CountCap(streams, request.count_cap_queue)
    mu = capacity_rps(server, workload, streams)
    return fair_count_cap(streams, slo_s, streams / mu)


def preview(request: PreviewRequest) -> dict[str, Any]:
    """Every front at every load; a JSON-ready report. ValueError on input the simulator refuses."""
    thresholds = request.thresholds
    exponential = request.service == "exponential"
    if exponential and "slogate" in request.gates:
        raise ValueError("--service exponential has no token counts for the slogate gate: use none or count-cap")
    timeout = request.client_timeout_s or (math.inf if exponential else DEFAULT_CLIENT_TIMEOUT_S)
    server = ServerModel.from_profile(request.profile)
    workload = Workload(request.prompt_tokens, request.output_tokens, client_timeout_s=timeout)
    if exponential:
        server, workload = exponential_check(server, workload, thresholds.concurrency_cap, request.slots)
    default = thresholds.default_class_thresholds
    count_cap = _count_cap(request, server, workload, default.ttft_slo_seconds)
    fronts = line_up(thresholds, count_cap)
    runs: list[dict[str, Any]] = []
    for gate, routing, load in itertools.product(request.gates, request.routings, request.loads):
        config = config_for_load(
            server,
            workload,
            load=load,
            duration_s=request.duration_s,
            ttft_slo_s=default.ttft_slo_seconds,
            front=fronts[gate],
            concurrency=thresholds.concurrency_cap,
            seed=request.seed,
            replicas=request.replicas,
            routing=routing,
        )
        run_report: dict[str, Any] = {"load": load, **simulate(config).as_dict()}
        if exponential and request.slots == 1 and request.replicas == 1:
            w = mm1_time_in_system(config.arrival_rate_rps, config.capacity_rps)
            run_report["mm1_time_in_system_s"] = w if math.isfinite(w) else None
        if exponential:
            run_report["erlang_b_blocking"] = erlang_b_check(config, count_cap)
        runs.append(run_report)
    return {
        "calibration_id": thresholds.calibration_id,
        "model": thresholds.model,
        "service": request.service,
        "ttft_slo_s": default.ttft_slo_seconds,
        "default_class": default.name,
        "classes": [{"name": c.name, "ttft_slo_s": c.ttft_slo_seconds} for c in thresholds.classes],
        "prompt_tokens": describe(request.prompt_tokens),
        "output_tokens": describe(request.output_tokens),
        "warnings": workload_warnings(server, workload, default, request.gates),
        "concurrency_cap": thresholds.concurrency_cap,
        "count_cap": {"concurrency": count_cap.concurrency, "queue": count_cap.queue},
        "replicas": request.replicas,
        "client_timeout_s": timeout if math.isfinite(timeout) else None,
        "capacity_rps": runs[0]["capacity_rps"],
        "runs": runs,
    }
