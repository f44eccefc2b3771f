"""A fleet whose pods come and go: start-up, draining, the autoscaler's signals, retrying clients.

The simulator's event loop (``engine``) asks this object what to do at an autoscaler
sync, a pod becoming ready, a try reaching a pod and a refusal; it keeps the pods' lives
and the record of the run (``FleetRecord``).

- **Pods start**: created at a sync, routable only ``startup_s`` later (scheduling,
  container start, model load, readiness probe), its pod-seconds counted from creation.
- **Pods stop**: out of the router at once; the requests it holds (deferred at its gate or
  forwarded) finish there; it is gone when it holds none; pod-seconds up to then. A
  scale-down stops pods not yet ready first, then the youngest ready ones (the ReplicaSet
  controller's deletion order).
- **Offered demand** is counted at each pod as the sidecar counts it: every try is shown
  to the pod's own ``demand.RetryMemory`` (the sidecar's code) as an ``demand.Attempt``; a
  first try counts, a retry does not. Retrying clients carry their retry count
  (``x-stainless-retry-count``) unless ``RetryingClients.say_count`` is off; their
  idempotency key is the request's number either way, so a refused key is known again at
  the pod that refused it.
- **Retrying clients** wait what the 429's Retry-After header says (the sidecar's
  ``retry.retry_after_whole_s``: whole seconds, at least 1) and try again through the router, up
  to ``max_retries`` times (the OpenAI SDK's default 2). A 400 (a request no wait would
  help) is not retried.
- **Signals** (``autoscaler.SIGNALS``) read at each sync: CPU, the busy share of the last
  ``cpu_window_s`` of each ready pod (llama.cpp's threads spin while any slot prefills or
  decodes); waiting, llama-server's queue (forwarded, no slot yet) plus the gate's deferred,
  summed; slogate's ρ, the operator's query: the first tries' server-seconds per second over
  the last ``demand_window_s``, each priced as the sidecar prices it
  (``demand.offered_work_s`` on the pod's gate config, with the prompt tokens and the n_out of
  the ``Request`` the gate decides on), which is ρ = λ / μ for whatever mix arrives;
  slogate-all-tries, the same over every try; and slogate-reference (evidence, not the
  product's signal): the request ratio max(λ / μ_ref, λ_tokens / (μ_ref · n_ref)) of the first
  tries against the pods' mean reference capacity (``demand.reference_capacity``), which
  prices every request as the policy's reference request.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from slogate_admission.decision import Decision, GateConfig, Request, never_fits
from slogate_admission.demand import Attempt, Capacity, DemandBook, reference_capacity
from slogate_admission.retry import retry_after_whole_s
from slogate_sim.fronts import SlogateFront
from slogate_sim.hpa import Hpa, HpaSpec, Signal, average_value_proposal, utilization_proposal
from slogate_sim.pod import SimRequest, SimulatedPod

# A request's final outcome, by its first arrival.
WITHIN, LATE, REFUSED, TIMED_OUT_AT_GATE, TIMED_OUT_FORWARDED, UNSERVABLE = 0, 1, 2, 3, 4, 5
OUTCOMES = ("within SLO", "served late", "refused", "timed out at the gate", "timed out forwarded", "unservable")
"""``refused``: its last try refused, for want of capacity; ``unservable``: refused, and a pod
of the same kind with nothing in it would refuse it too (a 400, or a 429 whose prompt alone
predicts beyond the SLO): no number of pods serves it."""


@dataclass(frozen=True, slots=True)
class RetryingClients:
    """Clients that retry a 429 after its Retry-After, as the OpenAI SDK does."""

    max_retries: int = 2
    """Retries after the first try (the SDK's ``max_retries`` default)."""
    say_count: bool = True
    """Each retry carries its number (``x-stainless-retry-count``); off: only its key."""


@dataclass(frozen=True, slots=True)
class Autoscaling:
    """A fleet under an HPA reading one signal (or following a fixed ``plan``)."""

    signal: Signal
    """What the HPA reads."""
    target: float
    """Its target: 0.7 (CPU utilisation, slogate's ρ per pod) or 5 (waiting per pod)."""
    hpa: HpaSpec
    """Bounds, sync period and behaviour."""
    startup_s: float = 30.0
    """From a pod's creation to its readiness: scheduling, container start, model load, probe."""
    demand_window_s: float = 60.0
    """slogate's rate window (the operator's query's)."""
    cpu_window_s: float = 15.0
    """CPU usage window (metrics-server's resolution)."""
    plan: tuple[tuple[float, int], ...] = ()
    """(time, replicas) knots the fleet follows instead of the HPA (tests, oracles); empty: the HPA."""


@dataclass(slots=True)
class PodLife:
    """When a pod was created, ready, told to stop and gone (nan: not yet)."""

    created: float
    ready: float = math.nan
    stop: float = math.nan
    ended: float = math.nan
    book: DemandBook = field(default_factory=DemandBook)
    """Its sidecar's demand book (``demand.DemandBook``): what it counts, and the keys it refused."""
    busy_mark: float = 0.0
    """Its busy seconds at the last sync."""
    tries: int = 0
    """Tries that reached it."""
    misrouted: int = 0
    """Tries that reached it before it was ready or after it was told to stop (must stay 0)."""


@dataclass(frozen=True)
class FleetRecord:
    """What a fleet run saw, for the autoscaling report."""

    ticks: tuple[tuple[float, int, int, float, int], ...]
    """Per sync: (time, replicas asked before, ready pods, the signal's value, replicas after)."""
    pods: tuple[tuple[float, float, float, float], ...]
    """Per pod: (created, ready, told to stop, gone); nan: never."""
    arrivals: array[float]
    """Each request's first arrival, in order of its final outcome."""
    outcomes: array[int]
    """Its final outcome (``OUTCOMES``)."""
    unique: int
    """Requests (first tries)."""
    counted_first: int
    """Tries the pods counted as demand (not known as retries)."""
    counted_all: int
    """Every try that reached a pod."""
    work_unique: float
    """Server-seconds of the requests' first tries (``demand.offered_work_s``; 0 unless the
    signal is slogate's or slogate-all-tries)."""
    work_first: float
    """Server-seconds of the tries the pods counted as demand (likewise)."""
    misrouted: int
    """Tries that reached a pod not yet ready or told to stop (0 by construction)."""
    pod_tries: tuple[int, ...]
    """Tries that reached each pod."""
    capacity: Capacity
    """The mean reference capacity the pods export."""


class Fleet:
    """The pods' lives, their demand counters and the autoscaler, for one run."""

    def __init__(
        self,
        autoscaling: Autoscaling | None,
        clients: RetryingClients | None,
        make_pod: Callable[[int], SimulatedPod],
        initial: int,
        add_route: Callable[[], int],
    ) -> None:
        self.spec = autoscaling
        self.clients = clients
        self._make_pod = make_pod
        self._add_route = add_route
        self.hpa = Hpa(autoscaling.hpa) if autoscaling is not None else None
        self.pods: list[SimulatedPod] = []
        self.lives: list[PodLife] = []
        for _ in range(initial):  # the starting fleet: ready at once
            self.ready(self._create(0.0), 0.0)
        self._window: deque[tuple[float, bool, int, float]] = deque()
        """Tries in the demand window: (time, a first try, prompt tokens, server-seconds)."""
        self._sums = [0.0, 0.0, 0.0, 0.0]
        """Over the window: first tries, their prompt tokens, their server-seconds, every try's server-seconds."""
        self.counted_first = self.counted_all = self.unique = 0
        self.work_unique = self.work_first = 0.0
        self.ticks: list[tuple[float, int, int, float, int]] = []
        self.arrivals: array[float] = array("d")
        self.outcomes: array[int] = array("b")
        caps = [reference_capacity(p.front.thresholds) for p in self.pods if isinstance(p.front, SlogateFront)]
        self.capacity = Capacity(
            sum(c.requests_per_second for c in caps) / max(len(caps), 1),
            sum(c.prompt_tokens_per_second for c in caps) / max(len(caps), 1),
        )

    # ------------------------------------------------------------------ lives

    def _create(self, now: float) -> SimulatedPod:
        index = self._add_route()
        pod = self._make_pod(index)
        assert pod.index == len(self.pods) == index
        pod.routable = False
        self.pods.append(pod)
        self.lives.append(PodLife(now))
        return pod

    def asked(self) -> list[SimulatedPod]:
        """The pods the Deployment asks for: not told to stop."""
        return [p for p, life in zip(self.pods, self.lives, strict=True) if math.isnan(life.stop)]

    def ready(self, pod: SimulatedPod, now: float) -> None:
        """Its readiness probe passed: the router may send it requests."""
        life = self.lives[pod.index]
        if math.isnan(life.stop):
            life.ready = now
            pod.routable = True

    def changed(self, pod: SimulatedPod, now: float) -> None:
        """After any change at ``pod``: a stopping pod holding nothing is gone."""
        life = self.lives[pod.index]
        if pod.conns == 0 and not math.isnan(life.stop) and math.isnan(life.ended):
            life.ended = now

    def sync(self, now: float) -> tuple[list[SimulatedPod], list[SimulatedPod]]:
        """An autoscaler sync: read the signal, step the HPA, scale. Returns (created, stopped)."""
        assert self.spec is not None
        assert self.hpa is not None
        asked = self.asked()
        ready = [p for p in asked if self.lives[p.index].ready <= now]
        value, proposal = self._proposal(now, asked, ready)
        if self.spec.plan:
            desired = next(n for at, n in reversed(self.spec.plan) if at <= now)
        else:
            desired = self.hpa.step(now, proposal, len(asked))
        self.ticks.append((now, len(asked), len(ready), value, desired))
        created = [self._create(now) for _ in range(desired - len(asked))]
        # Not ready first (youngest first), then the youngest ready: the ReplicaSet's order.
        order = sorted(asked, key=lambda p: (self.lives[p.index].ready <= now, -self.lives[p.index].created, -p.index))
        stopped = order[: max(len(asked) - desired, 0)]
        for pod in stopped:
            self.lives[pod.index].stop = now
            pod.routable = False
        return created, stopped

    # ------------------------------------------------------------------ signals

    def _proposal(self, now: float, asked: list[SimulatedPod], ready: list[SimulatedPod]) -> tuple[float, int]:
        spec = self.spec
        assert spec is not None
        tol = spec.hpa.tolerance
        if spec.signal == "cpu":
            usages = []
            for pod in asked:
                pod.advance(now)
                life = self.lives[pod.index]
                if life.ready <= now - spec.cpu_window_s:  # a full window since ready: it has a metric
                    usages.append((pod.busy - life.busy_mark) / spec.cpu_window_s)
                life.busy_mark = pod.busy
            value = sum(usages) / len(usages) if usages else math.nan
            return value, utilization_proposal(usages, len(asked) - len(usages), spec.target, len(asked), tol)
        if spec.signal == "waiting":
            value = float(sum(_waiting(p) for p in ready))
        else:
            self._forget(now)
            seconds = min(now, spec.demand_window_s)  # rate() over what the window holds so far
            first, tokens, work, work_all = (x / seconds if seconds > 0 else 0.0 for x in self._sums)
            if spec.signal == "slogate":
                value = work  # Σ rate(slogate_offered_work_seconds_total): ρ in pods' worth
            elif spec.signal == "slogate-all-tries":
                value = work_all
            else:  # the request ratio: every request priced as the reference request
                cap = self.capacity
                value = max(first / cap.requests_per_second, tokens / cap.prompt_tokens_per_second)
        return value, average_value_proposal(value, spec.target, len(asked), tol)

    def _forget(self, now: float) -> None:
        cutoff = now - (self.spec.demand_window_s if self.spec is not None else 0.0)
        window, sums = self._window, self._sums
        while window and window[0][0] <= cutoff:
            _, first, tokens, work = window.popleft()
            sums[3] -= work
            if first:
                sums[0] -= 1
                sums[1] -= tokens
                sums[2] -= work
        if not window:  # no float residue of the subtractions: an empty window reads exactly 0
            sums[:] = [0.0, 0.0, 0.0, 0.0]

    # ------------------------------------------------------------------ tries

    def attempt(self, req: SimRequest) -> Attempt:
        """What the try says of itself: its key, and its retry count if the clients say it."""
        says = self.clients is None or self.clients.say_count
        return Attempt(str(req.key), req.retries if says else None)

    def tried(self, pod: SimulatedPod, req: SimRequest, now: float) -> None:
        """A try reached ``pod``: the sidecar's demand counters."""
        life = self.lives[pod.index]
        life.tries += 1
        if not (life.ready <= now and math.isnan(life.stop)):
            life.misrouted += 1
        priced = self.spec is not None and self.spec.signal in ("slogate", "slogate-all-tries")
        first = not life.book.is_retry(self.attempt(req), now)
        # As the sidecar counts: judged on arrival, counted once its gate decided (at once here).
        counted = life.book.count(
            retry=not first, request=Request(req.prompt_tokens, req.output_tokens), config=self._config(pod, priced)
        )
        work = counted.work_s
        if req.retries == 0 and req.tries == 1:  # a request's very first try: never a known retry
            self.unique += 1
            self.work_unique += work
        self.counted_all += 1
        if first:
            self.counted_first += 1
            self.work_first += work
        if self.spec is None:  # no autoscaler, no window to keep: counts only
            return
        self._window.append((now, first, req.prompt_tokens, work))
        self._sums[3] += work
        if first:
            self._sums[0] += 1
            self._sums[1] += req.prompt_tokens
            self._sums[2] += work

    @staticmethod
    def _config(pod: SimulatedPod, priced: bool) -> GateConfig | None:
        """What the pod's sidecar prices a try on (``slogate_offered_work_seconds_total``): its
        gate's config, with the ``Request`` its gate decides on (``SlogateFront.arrive`` passes
        ``req.output_tokens``, the arrival's max_tokens, unclamped before any forward); None when
        no signal reads the price, or no slogate gate stands before the pod."""
        return pod.front.machine.config if priced and isinstance(pod.front, SlogateFront) else None

    def refused(self, pod: SimulatedPod, req: SimRequest, decision: Decision | None, now: float) -> float | None:
        """``pod`` refused the try: its sidecar remembers the key until its Retry-After (plus
        grace). Returns the client's wait before its next try (None: it will not retry)."""
        if decision is None or not decision.fits_ever:
            return None  # a 400 (or a front that sends no Retry-After): nothing to remember, no retry
        retry_after = float(retry_after_whole_s(decision.retry_after_s or 0.0))
        self.lives[pod.index].book.refused(self.attempt(req), retry_after, now)  # as the sidecar's 429
        if self.clients is None or req.retries >= self.clients.max_retries:
            return None
        return retry_after

    def gave_up(self, pod: SimulatedPod, req: SimRequest, decision: Decision | None) -> None:
        """Its last try (at ``pod``) was refused: for want of capacity, or unservable."""
        self.outcome(req, UNSERVABLE if self._unservable(pod, req, decision) else REFUSED)

    def _unservable(self, pod: SimulatedPod, req: SimRequest, decision: Decision | None) -> bool:
        """Whether an idle pod of ``pod``'s kind would refuse the request too (the core's
        ``never_fits``, what its sidecar answers 400)."""
        if decision is not None:
            return not decision.fits_ever
        if not isinstance(pod.front, SlogateFront):
            return False
        return bool(never_fits(pod.front.machine.config, Request(req.prompt_tokens, req.output_tokens)))

    def outcome(self, req: SimRequest, code: int) -> None:
        """The request's final outcome (over all its tries)."""
        self.arrivals.append(req.first_arrival)
        self.outcomes.append(code)

    def record(self) -> FleetRecord:
        """The run's record."""
        return FleetRecord(
            ticks=tuple(self.ticks),
            pods=tuple((life.created, life.ready, life.stop, life.ended) for life in self.lives),
            arrivals=self.arrivals,
            outcomes=self.outcomes,
            unique=self.unique,
            counted_first=self.counted_first,
            counted_all=self.counted_all,
            work_unique=self.work_unique,
            work_first=self.work_first,
            misrouted=sum(life.misrouted for life in self.lives),
            pod_tries=tuple(life.tries for life in self.lives),
            capacity=self.capacity,
        )


def _waiting(pod: SimulatedPod) -> int:
    """llama-server's waiting requests (forwarded, no slot) plus those its gate defers."""
    queued = sum(1 for r in pod.server_queue if not r.abandoned)
    deferred = pod.front.machine.deferred if isinstance(pod.front, SlogateFront) else 0
    return queued + deferred
