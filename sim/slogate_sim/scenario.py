"""What a simulation is asked (server, workload, front, load) and what it answers.

Plain frozen structures; the workload is the load generator's own (``workloads``), μ is
``capacity.capacity_rps``, the count cap ``limits.CountCap``. The event loop that uses
them is ``slogate_sim.engine``. A run draws its own Poisson arrivals from the seed, or
replays an explicit ``trace`` (the very schedule a measured run sent, ``trace_of``). A trace's
arrivals may name their tenant: the gate is then told it, and the result counts per tenant.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from slogate_admission.service import DecodeCurve, PrefillCurve
from slogate_sim.arrivals import RateCurve
from slogate_sim.capacity import ServerModel, capacity_rps
from slogate_sim.fleet import Autoscaling, FleetRecord, RetryingClients
from slogate_sim.fronts import Direct, FrontSpec, Gated
from slogate_sim.lengths import TokenLengths
from slogate_sim.routing import Routing
from slogate_sim.workloads import DEFAULT_CLIENT_TIMEOUT_S, Workload

GateKind = Literal["direct", "slogate", "count-cap"]
GATES: tuple[GateKind, ...] = ("direct", "slogate", "count-cap")
"""The fronts' names, as `slogate simulate --gate` takes them (``fronts.line_up``)."""


# --------------------------------------------------------------------------- inputs

Pod = tuple[ServerModel, FrontSpec]
"""A simulated pod: its llama-server and what stands before it."""


class ArrivalLike(Protocol):
    """What a trace needs of an arrival: ``workloads.Arrival`` is one."""

    @property
    def at_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Traced:
    """One request of an explicit trace: when it arrives and what it asks."""

    at_s: float
    """Seconds after the run's start."""
    prompt_tokens: int
    """n_in."""
    max_tokens: int
    """n_out, generated in full."""
    tenant: str | None = None
    """Who sent it (``workloads.Arrival.tenant``): the gate's tenant, and the result's per-tenant
    counts; None: no tenant named."""
    class_name: str | None = None
    """The class it names (the X-Slogate-Class header); None: the default class. ``trace_of``
    leaves it unset: a trace runs against thresholds that may not have the schedule's classes."""


TraceTuple = tuple[float, int, int] | tuple[float, int, int, str | None]
"""(time, n_in, n_out) or (time, n_in, n_out, tenant)."""


def trace_of(arrivals: Iterable[ArrivalLike | TraceTuple]) -> tuple[Traced, ...]:
    """A trace from a measured run's schedule (``workloads.schedule``, ``tenant_traffic``) or
    (time, n_in, n_out[, tenant]) tuples, in time order (stable: equal times keep their order).
    Tenants are kept (an arrival without a ``tenant`` attribute names none); classes are
    dropped (the thresholds a trace runs against may not have the schedule's classes): set
    ``Traced.class_name`` to send one."""
    out = [
        Traced(*a) if isinstance(a, tuple) else Traced(a.at_s, a.prompt_tokens, a.max_tokens, _tenant_of(a))
        for a in arrivals
    ]
    return tuple(sorted(out, key=lambda a: a.at_s))


def _tenant_of(arrival: ArrivalLike) -> str | None:
    tenant = getattr(arrival, "tenant", None)
    return tenant if isinstance(tenant, str) else None


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """One run."""

    server: ServerModel
    """The simulated llama-server."""
    workload: Workload
    """What the clients send, and their patience."""
    arrival_rate_rps: float
    """λ of the Poisson arrivals (with a ``trace``: informational, its mean rate)."""
    duration_s: float
    """Arrivals come in [0, duration_s]; the run ends when the last request has left."""
    ttft_slo_s: float
    """Goodput counts requests completed with TTFT within this."""
    front: FrontSpec = field(default_factory=Direct)
    """What stands before llama-server: ``Direct()``, ``CountCapped(cap)`` or ``Gated(thresholds)``."""
    seed: int = 0
    """Every random draw comes from it: the same seed, the same arrivals for every gate."""
    capacity_rps: float = math.nan
    """μ, reported back with the result (see ``capacity.capacity_rps``); informational."""
    trace: tuple[Traced, ...] | None = None
    """The arrivals to replay instead of drawing them (``trace_of``): times within
    [0, duration_s], in order. The workload then only says the clients' patience."""
    replicas: int = 1
    """Pods behind the balancer, each its own llama-server and front (``pod``)."""
    routing: Routing = field(default_factory=Routing)
    """How arrivals find a pod (``routing``); irrelevant with one replica."""
    pods: tuple[Pod, ...] = ()
    """Each pod's own server and front, pod i taking ``pods[i % len(pods)]`` (pods
    calibrated apart); empty: every pod is ``server`` behind ``front``."""
    rate_curve: RateCurve | None = None
    """λ(t) instead of the constant ``arrival_rate_rps`` (``arrivals``: thinning)."""
    autoscaling: Autoscaling | None = None
    """An HPA sizes the fleet from ``replicas`` on (``fleet``); None: a fixed fleet."""
    clients: RetryingClients | None = None
    """Clients that retry a 429 after its Retry-After; None: they never retry."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if (self.autoscaling or self.clients) and self.routing.name not in ("least-requests", "least-pressure"):
            raise ValueError(
                f"a fleet that changes size needs least-requests or least-pressure routing, not {self.routing}"
            )
        rates = ("duration_s",) if self.trace is not None else ("arrival_rate_rps", "duration_s")
        for name in rates:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not self.ttft_slo_s > 0:
            raise ValueError(f"ttft_slo_s must be > 0, got {self.ttft_slo_s!r}")
        gated = any(isinstance(front, Gated) for _, front in self.pod_specs())
        if gated and self.workload.service == "exponential":
            raise ValueError("the slogate gate predicts from token counts: use the profile service mode")
        if self.trace is not None:
            self._check_trace(self.trace)
        if self.workload.service == "profile":
            longest = self.workload.prompt_tokens.high + self.workload.output_tokens.high
            if self.trace is not None:
                longest = max((a.prompt_tokens + a.max_tokens for a in self.trace), default=0)
            for _, front in self.pod_specs():
                if isinstance(front, Gated) and longest > front.thresholds.per_request_max_tokens:
                    raise ValueError(
                        f"prompt + output tokens reach {longest}, beyond one slot's "
                        f"{front.thresholds.per_request_max_tokens}: llama-server would refuse them"
                    )

    def pod_specs(self) -> tuple[Pod, ...]:
        """The distinct pods, cycled over the replicas."""
        return self.pods or ((self.server, self.front),)

    def _check_trace(self, trace: tuple[Traced, ...]) -> None:
        if self.workload.service != "profile":
            raise ValueError("a trace gives token counts: use the profile service mode")
        previous = 0.0
        for a in trace:
            if not previous <= a.at_s <= self.duration_s:
                raise ValueError(f"trace times must be in order within [0, {self.duration_s:g}], got {a.at_s!r}")
            if a.prompt_tokens < 0 or a.max_tokens < 0:
                raise ValueError(f"token counts must be >= 0, got {a}")
            previous = a.at_s


# --------------------------------------------------------------------------- outputs


@dataclass(slots=True)
class TenantCounts:
    """One tenant's requests in a run, as ``SimulationResult`` counts them for all (filled by
    ``tally`` as the run goes; read once it is over)."""

    offered: int = 0
    """Its arrivals."""
    admitted: int = 0
    """Forwarded to llama-server."""
    rejected: int = 0
    """Refused in the end (a 429 reached its client)."""
    share_rejected: int = 0
    """Of those, refused with the reason ``tenant_share`` among the final decision's."""
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    """Of those, how many had each reason among the final decision's (``decision.Reason``;
    a refusal with several counts under each)."""
    timed_out: int = 0
    """Its clients that left before their first token."""
    completed: int = 0
    completed_within_slo: int = 0
    """Its goodput, in requests: completed with TTFT within the SLO."""


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """What one run measured. ``offered`` = admitted + rejected + left while waiting at the gate."""

    gate: str
    """The front's name (``direct``, ``count-cap``, ``slogate``)."""
    arrival_rate_rps: float
    capacity_rps: float
    duration_s: float
    offered: int
    """Arrivals in [0, duration_s]."""
    admitted: int
    """Forwarded to llama-server (at once or after waiting at the gate)."""
    deferred: int
    """Arrivals the gate first deferred (slogate), or queued in front (count-cap)."""
    rejected: int
    """429s, at arrival or when a deferral ran out."""
    timed_out: int
    """Clients that left before their first token, wherever they waited."""
    completed: int
    completed_within_slo: int
    throughput_rps: float
    """Completions inside [0, duration_s], per second: at most the capacity."""
    goodput_rps: float
    """Completed with TTFT within the SLO, per second of the arrival window."""
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    """TTFT quantiles over requests whose first token came (None if none did)."""
    mean_time_in_system_s: float | None
    """Arrival to leaving (completion, timeout, or rejection after a deferral), averaged over
    the requests not rejected on the spot."""
    mean_in_system: float
    """Time-average number of such requests inside, over [0, duration_s] (Little's L)."""
    entered: int
    """Arrivals not rejected on the spot: L = λ · W holds with λ = entered / duration_s."""
    utilization: float
    """Fraction of [0, duration_s] the server was computing (prefill or decode); for a
    fleet, the pods' mean."""
    replicas: int = 1
    """Pods in the fleet."""
    routing: str = "random"
    """How arrivals found a pod (``routing.Routing``, as the command line says it)."""
    tries: int = 0
    """Pods tried, summed over the offered requests (= offered without retries)."""
    fleet: FleetRecord | None = None
    """With autoscaling or retrying clients: the pods' lives, the syncs and each request's fate."""
    tenants: dict[str | None, TenantCounts] | None = None
    """Per tenant (None: the requests naming none), when the trace's arrivals name tenants;
    each count sums over the tenants to the run's own."""

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-ready values (the fleet's record and the tenants' counts left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("fleet", "tenants")}


# --------------------------------------------------------------------------- runs


def config_for_load(
    server: ServerModel,
    workload: Workload,
    *,
    load: float,
    duration_s: float,
    ttft_slo_s: float,
    front: FrontSpec,
    concurrency: int | None = None,
    seed: int = 0,
    replicas: int = 1,
    routing: Routing | None = None,
) -> SimulationConfig:
    """A run at ``load`` x μ, μ taken at ``concurrency`` streams (the derived concurrency cap;
    the server's slots if None); for ``replicas`` pods, ``load`` x their summed μ.

    Give every front the same ``concurrency``: the same λ, so fronts are compared on the
    same offered traffic (and, with the same seed, on the very same arrivals).
    """
    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a finite number > 0, got {load!r}")
    mu = replicas * capacity_rps(server, workload, concurrency if concurrency is not None else server.slots)
    return SimulationConfig(
        server=server,
        workload=workload,
        arrival_rate_rps=load * mu,
        duration_s=duration_s,
        ttft_slo_s=ttft_slo_s,
        front=front,
        seed=seed,
        capacity_rps=mu,
        replicas=replicas,
        routing=routing or Routing(),
    )


def config_for_trace(
    server: ServerModel,
    arrivals: Iterable[ArrivalLike | TraceTuple],
    *,
    duration_s: float,
    ttft_slo_s: float,
    front: FrontSpec,
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S,
    capacity_rps: float = math.nan,
) -> SimulationConfig:
    """A run replaying ``arrivals`` (a measured run's schedule) over a window of ``duration_s``.

    Clients are as patient as the measured ones (the load generator's 10 s by default), so
    none leaves before the SLO matters.
    """
    trace = trace_of(arrivals)
    return SimulationConfig(
        server=server,
        workload=Workload(client_timeout_s=client_timeout_s, name="trace"),
        arrival_rate_rps=len(trace) / duration_s if duration_s > 0 else math.nan,
        duration_s=duration_s,
        ttft_slo_s=ttft_slo_s,
        front=front,
        capacity_rps=capacity_rps,
        trace=trace,
    )


def mm1_config(arrival_rate_rps: float, service_rate_rps: float, duration_s: float, seed: int = 0) -> SimulationConfig:
    """The validation run: Exp(1/μ) service, one slot, no gate, patient clients: M/M/1."""
    server = ServerModel(slots=1, prefill=PrefillCurve(0.0, 1.0), decode=DecodeCurve((1.0,)))
    workload = Workload(
        prompt_tokens=TokenLengths.fixed(1),
        output_tokens=TokenLengths.fixed(1),
        client_timeout_s=math.inf,
        service="exponential",
        exponential_mean_s=1.0 / service_rate_rps,
    )
    return SimulationConfig(
        server=server,
        workload=workload,
        arrival_rate_rps=arrival_rate_rps,
        duration_s=duration_s,
        ttft_slo_s=math.inf,  # every completion counts (here TTFT = time in system)
        front=Direct(),
        seed=seed,
        capacity_rps=service_rate_rps,
    )
