"""A discrete-event simulation of llama-server with and without the gate, to preview a policy.

Pure: no I/O, no wall clock; every random draw comes from the seed (one RNG stream per
quantity, so every gate sees the very same arrivals); the same inputs give the same result.
The gate is the *deployed* one: the core's ``slogate_admission.gate_machine.GateMachine``,
the very object the sidecar drives on its event loop, here driven in virtual time: every
arrival, first token, release, deferral deadline and client leaving is one of its events.

The server model (a llama.cpp CPU server: slots, its own FIFO queue, prefill preempting
decode, decode on the calibrated curve) is ``server``'s docstring.

Clients
-------
Poisson arrivals (open loop), or an explicit trace (``SimulationConfig.trace``: the very
schedule a measured run sent, to judge fronts, and the ``clairvoyant`` bound, on it). A
client whose first token has not come ``client_timeout_s`` after it arrived leaves
(after the first token it reads to the end). llama-server notices
a closed connection: a request still in its queue, or in a slot whose prefill has not
started, is dropped at no cost; a prompt whose prefill is *in progress* finishes (the
batch is one ``llama_decode`` call) and is then dropped without decoding, so that compute
is burnt. The sidecar releases the request's ticket at the moment the client leaves. This
is what makes an ungated server collapse under overload: it spends its time prefilling
prompts whose clients have already hung up.

Fronts, fleets, tenants
-----------------------
What stands before each llama-server is a front (``fronts``: ``direct``, ``slogate``, the
GateMachine with the calibrated prefill rate, the sidecar's behaviour by construction,
``count-cap``, ``clairvoyant``). ``replicas`` pods (``pod``), each its own llama-server and
front (``SimulationConfig.pods``), stand behind a balancer (``routing``); a refusal sent on by
``retry-429`` costs no time, and a request's TTFT runs from its first arrival. Every event
touches one pod, so a run of 1,000 pods costs per request about what a run of one does. With
``SimulationConfig.autoscaling`` pods come and go, with ``clients`` refused clients come back
after their Retry-After, and ``rate_curve`` varies λ in time (``fleet``, ``arrivals``). The
``exponential`` service mode (``pod.ExponentialPod``) is the closed-form check: M/M/1 with one
slot and no gate, Erlang's loss system with a count cap of C slots and no queue. A trace's
arrivals may name a tenant: each front hears it, each end reports the tokens generated, and
the result counts every outcome per tenant too (``SimulationResult.tenants``).

Runs start empty (no warm-up), arrivals stop at ``duration_s``, and the run continues until
every request has left; rates and time averages are over [0, duration_s] (``tally``).
"""

from __future__ import annotations

import heapq
import itertools
import math

from slogate_admission.decision import Decision, Reason, Request
from slogate_sim.arrivals import NO_SERVICE, arrivals
from slogate_sim.fleet import (
    LATE,
    TIMED_OUT_AT_GATE,
    TIMED_OUT_FORWARDED,
    WITHIN,
    Fleet,
)
from slogate_sim.fronts import Forward, Hold, Refuse
from slogate_sim.pod import AT_GATE, GONE, SimRequest, SimulatedPod, new_pod
from slogate_sim.routing import Router
from slogate_sim.scenario import SimulationConfig, SimulationResult
from slogate_sim.tally import Tally

# Timer kinds; the fleet's (``fleet``) from _CLIENT_RETRY on.
_CLIENT_TIMEOUT = 0
_DEFER_DEADLINE = 1
_CLIENT_RETRY = 2
_POD_READY = 3
_AUTOSCALE = 4

# Event kinds.
_COMPLETION = 0
_TIMER = 1
_ARRIVAL = 2


class _Simulation:
    """The event loop. Events: arrivals, a pod's prefill head or soonest decode stream
    finishing, and timers (client timeouts, deferral deadlines)."""

    def __init__(self, config: SimulationConfig) -> None:
        self.cfg = config
        self.window = config.duration_s
        self.timeout = config.workload.client_timeout_s
        self.slo = config.ttft_slo_s
        self.now = 0.0
        self.exponential = config.workload.service == "exponential"
        self.seq = itertools.count()
        self.specs = config.pod_specs()
        self.fleet: Fleet | None = None
        # (time, seq, pod, the pod's version when pushed): stale entries skipped
        self.completions: list[tuple[float, int, SimulatedPod, int]] = []
        # timers: (time, seq, kind, req, pod of a deadline), stale entries skipped
        self.timers: list[tuple[float, int, int, SimRequest | None, int]] = []
        if config.autoscaling is None and config.clients is None:
            self.pods = [self._new_pod(i) for i in range(config.replicas)]
            self.router = Router(config.routing, len(self.pods), config.seed)
        else:  # pods that come and go, or clients that retry: the fleet keeps their lives
            self.router = Router(config.routing, 0, config.seed)
            self.fleet = Fleet(
                config.autoscaling,
                config.clients,
                self._new_pod,
                config.replicas,
                self.router.add_pod,
            )
            self.pods = self.fleet.pods
            for pod in self.pods:
                self._changed(pod)
            if config.autoscaling is not None:
                self._push_timer(config.autoscaling.hpa.interval_s, _AUTOSCALE, None)
        self.retrying = config.routing.tries > 1
        self.tally = Tally()
        """What the run measures (``tally``)."""
        self.trace = config.trace
        """The explicit trace, whose n-th entry is the n-th arrival (its tenant and class); None: Poisson."""
        if self.trace is not None and any(a.tenant is not None for a in self.trace):
            self.tally.tenants = {}

    def _new_pod(self, i: int) -> SimulatedPod:
        """Pod ``i``: the i-th of the distinct pods, cycled, with a fresh front."""
        server, front = self.specs[i % len(self.specs)]
        return new_pod(i, server, front.build(), self.window, exponential=self.exponential, seq=self.seq)

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimulationResult:
        schedule = arrivals(self.cfg)
        upcoming = next(schedule, None)
        inf = math.inf
        completions, timers, window = self.completions, self.timers, self.window
        while True:
            # The soonest event; at equal times completions go first (they free what an
            # arrival might need), then timers, then the arrival.
            while completions and completions[0][3] != completions[0][2].version:
                heapq.heappop(completions)
            t = completions[0][0] if completions else inf
            kind = _COMPLETION
            if timers and timers[0][0] < t:
                t, kind = timers[0][0], _TIMER
            if upcoming is not None and upcoming[0] < t:
                t, kind = upcoming[0], _ARRIVAL
            if t == inf:
                break
            if t > self.now:  # the run's clock; pods keep their own
                if self.now < window:
                    self.tally.area += self.tally.inside * ((t if t < window else window) - self.now)
                self.now = t
            if kind == _ARRIVAL:
                assert upcoming is not None
                self._arrive(*upcoming)
                upcoming = next(schedule, None)
            elif kind == _TIMER:
                self._timer()
            else:
                self._completion(heapq.heappop(completions)[2])
        fleet = self.fleet.record() if self.fleet is not None else None
        return self.tally.result(self.cfg, self.pods, fleet)

    def _changed(self, pod: SimulatedPod) -> None:
        """After ``pod``'s state changed: its next completion rescheduled, the router told."""
        t = pod.next_completion()
        if t != pod.scheduled:
            pod.version += 1
            pod.scheduled = t
            if t < math.inf:
                heapq.heappush(self.completions, (t, next(self.seq), pod, pod.version))
        if self.router.tracks:
            self.router.changed(pod.index, pod.conns, pod.front, routable=pod.routable)
        if self.fleet is not None:
            self.fleet.changed(pod, self.now)

    def _push_timer(self, at: float, kind: int, req: SimRequest | None, pod: int = -1) -> None:
        if at < math.inf:
            heapq.heappush(self.timers, (at, next(self.seq), kind, req, pod))

    # ------------------------------------------------------------------ arrivals, routing and fronts

    def _arrive(self, at: float, prompt_tokens: int, output_tokens: int, service: float) -> None:
        traced = self.trace[self.tally.offered] if self.trace is not None else None  # arrivals come in its order
        tenant, class_name = (traced.tenant, traced.class_name) if traced is not None else (None, None)
        if self.tally.tenants is not None:
            self.tally.tenant(tenant).offered += 1
        self.tally.offered += 1
        req = SimRequest(
            at, prompt_tokens, output_tokens, service, key=self.tally.offered, first_arrival=at, tenant=tenant,
            class_name=class_name,
        )  # fmt: skip
        self._try(req, self.router.first())

    def _try(self, req: SimRequest, index: int) -> None:
        """Offer the request to pod ``index``'s front."""
        pod = self.pods[index]
        pod.advance(self.now)
        req.pod = index
        req.tries += 1
        self.tally.tries += 1
        if self.retrying:
            req.tried.append(index)
        if self.fleet is not None:
            self.fleet.tried(pod, req, self.now)
        pod.conns += 1
        request = Request(req.prompt_tokens, req.output_tokens, req.class_name, tenant=req.tenant)
        answer = pod.front.arrive(req, request, self.now)
        if isinstance(answer, Refuse):
            pod.conns -= 1
            self._changed(pod)
            self._refused(req, answer.decision)
            return
        if not req.entered:
            self._enter(req)
        if isinstance(answer, Hold):
            if not req.deferred:
                req.deferred = True
                self.tally.deferred += 1
            req.where = AT_GATE
            self._push_timer(answer.deadline, _DEFER_DEADLINE, req, index)
        else:
            self._apply(pod, [answer])
        self._changed(pod)

    def _refused(self, req: SimRequest, decision: Decision | None) -> None:
        """A front refused it: another pod if the routing retries and tries remain, else a
        429 reaches its client, who may come back after its Retry-After."""
        wait = self.fleet.refused(self.pods[req.pod], req, decision, self.now) if self.fleet is not None else None
        if self.retrying:
            nxt = self.router.next(req.tried)
            if nxt is not None:
                self._try(req, nxt)
                return
        if req.entered:  # it had waited at a gate
            self._leave(req)
        req.where = GONE  # whatever timers this try left are stale
        if wait is not None:
            self._push_timer(self.now + wait, _CLIENT_RETRY, req)
            return
        self.tally.rejected += 1
        if self.tally.tenants is not None:
            counts = self.tally.tenant(req.tenant)
            counts.rejected += 1
            if decision is not None:
                counts.share_rejected += Reason.TENANT_SHARE in decision.reasons
                for reason in decision.reasons:
                    counts.rejected_by_reason[reason.value] = counts.rejected_by_reason.get(reason.value, 0) + 1
        if self.fleet is not None:
            self.fleet.gave_up(self.pods[req.pod], req, decision)

    def _retry(self, req: SimRequest) -> None:
        """A refused client tries again: a new try of the same request, through the router."""
        again = SimRequest(self.now, req.prompt_tokens, req.output_tokens, req.prefill_s, key=req.key,
                           retries=req.retries + 1, first_arrival=req.first_arrival, tenant=req.tenant,
                           class_name=req.class_name)  # fmt: skip
        self._try(again, self.router.first())

    def _enter(self, req: SimRequest) -> None:
        """The request is inside (not refused on the spot); its client's patience starts now."""
        req.entered = True
        self.tally.entered += 1
        self.tally.inside += 1
        self._push_timer(req.arrival + self.timeout, _CLIENT_TIMEOUT, req)

    def _apply(self, pod: SimulatedPod, answers: list[Forward | Refuse]) -> None:
        """What ``pod``'s front decided: forward (n_out clamped to what it allows) or refuse."""
        for answer in answers:
            req = answer.key
            assert isinstance(req, SimRequest)
            if isinstance(answer, Forward):
                req.output_tokens = min(req.output_tokens, answer.output_tokens)
                req.forwarded = True
                self.tally.admitted += 1
                if self.tally.tenants is not None:
                    self.tally.tenant(req.tenant).admitted += 1
                if req.prefill_s == NO_SERVICE:
                    req.prefill_s = pod.server.prefill.seconds(req.prompt_tokens)
                pod.forward(req)
            else:
                pod.conns -= 1
                self._refused(req, answer.decision)

    def _release_gate(self, pod: SimulatedPod, req: SimRequest) -> None:
        """The request ended or its client left: return its place in front (once), with the
        tokens it generated (all of them once its first token came: clients read to the end)."""
        if not req.forwarded:
            return
        req.forwarded = False
        generated = req.output_tokens if req.first_token else 0
        self._apply(pod, pod.front.ended(req, self.now, output_tokens=generated))

    # ------------------------------------------------------------------ llama-server

    def _completion(self, pod: SimulatedPod) -> None:
        pod.advance(self.now)
        pod.scheduled = math.nan  # consumed: whatever comes next is pushed anew
        if pod.prefill_due():
            self._prefill_done(pod)
        else:
            for req in pod.finish_decodes():
                self._complete(pod, req)
        self._changed(pod)

    def _prefill_done(self, pod: SimulatedPod) -> None:
        req = pod.finish_prefill()
        if req.abandoned:  # its client left mid-prefill: the compute is spent, nothing is sent
            req.where = GONE
            pod.free_slot()
            return
        req.first_token = True
        req.ttft = self.now - req.arrival
        self.tally.ttfts.append(req.ttft)
        self._apply(pod, pod.front.first_token(req, self.now))
        if req.output_tokens <= 0:  # the exponential mode: the whole service was the "prefill"
            self._complete(pod, req)
            return
        pod.start_decode(req)

    def _complete(self, pod: SimulatedPod, req: SimRequest) -> None:
        self.tally.completed += 1
        if self.now <= self.window:
            self.tally.completed_in_window += 1
        if req.ttft <= self.slo:
            self.tally.within += 1
        if self.tally.tenants is not None:
            counts = self.tally.tenant(req.tenant)
            counts.completed += 1
            counts.completed_within_slo += req.ttft <= self.slo
        if self.fleet is not None:
            self.fleet.outcome(req, WITHIN if req.ttft <= self.slo else LATE)
        req.where = GONE
        pod.free_slot()
        pod.conns -= 1
        self._release_gate(pod, req)
        self._leave(req)

    def _leave(self, req: SimRequest) -> None:
        req.where = GONE
        self.tally.inside -= 1
        self.tally.sojourn_sum += self.now - req.arrival
        self.tally.sojourn_count += 1

    # ------------------------------------------------------------------ timers

    def _timer(self) -> None:
        _, _, kind, req, index = heapq.heappop(self.timers)
        if kind >= _CLIENT_RETRY:
            self._fleet_timer(kind, req, index)
            return
        assert req is not None
        if req.where == GONE or req.first_token:
            return  # stale: it finished, was rejected, or its first token came
        if kind == _DEFER_DEADLINE:
            # The wait at that pod ran out: its front judges it a last time (unless it has
            # since been refused there and tried elsewhere).
            if req.where == AT_GATE and req.pod == index:
                pod = self.pods[index]
                pod.advance(self.now)
                self._apply(pod, pod.front.deadline(req, self.now))
                self._changed(pod)
            return
        self._abandon(req)

    def _abandon(self, req: SimRequest) -> None:
        """The client left before its first token."""
        self.tally.timed_out += 1
        if self.tally.tenants is not None:
            self.tally.tenant(req.tenant).timed_out += 1
        req.abandoned = True
        pod = self.pods[req.pod]
        pod.advance(self.now)
        if self.fleet is not None:
            self.fleet.outcome(req, TIMED_OUT_AT_GATE if req.where == AT_GATE else TIMED_OUT_FORWARDED)
        if req.where == AT_GATE:
            self._apply(pod, pod.front.left(req, self.now))
        else:  # in the server queue it is skipped when a slot frees; mid-prefill it finishes first
            pod.drop_unstarted(req)
        self._release_gate(pod, req)
        pod.conns -= 1
        self._leave(req)
        self._changed(pod)

    # ------------------------------------------------------------------ the fleet's events

    def _fleet_timer(self, kind: int, req: SimRequest | None, index: int) -> None:
        assert self.fleet is not None
        if kind == _CLIENT_RETRY:
            assert req is not None
            self._retry(req)
        elif kind == _POD_READY:
            pod = self.pods[index]
            self.fleet.ready(pod, self.now)
            self._changed(pod)
        else:
            self._sync()

    def _sync(self) -> None:
        """The autoscaler's sync: new pods become ready after their start-up, stopped ones
        leave the router at once and are gone once they hold nothing."""
        assert self.fleet is not None
        assert self.cfg.autoscaling is not None
        created, stopped = self.fleet.sync(self.now)
        for pod in created:
            self._changed(pod)
            self._push_timer(self.now + self.cfg.autoscaling.startup_s, _POD_READY, None, pod.index)
        for pod in stopped:
            self._changed(pod)
        interval = self.cfg.autoscaling.hpa.interval_s
        if self.now + interval <= self.window:
            self._push_timer(self.now + interval, _AUTOSCALE, None)


def simulate(config: SimulationConfig) -> SimulationResult:
    """Run one simulation to the end (every request has left); deterministic in ``config.seed``."""
    return _Simulation(config).run()
