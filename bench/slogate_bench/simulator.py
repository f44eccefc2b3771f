"""A discrete-event simulation of llama-server with and without the gate, to preview a policy.

Pure: no I/O, no wall clock; every random draw comes from the seed (one RNG stream per
quantity, so every gate sees the very same arrivals); the same inputs give the same result.
The gate is the *deployed* one: the core's ``slogate_admission.gate_machine.GateMachine``,
the very object the sidecar drives on its event loop, here driven in virtual time: every
arrival, first token, release, deferral deadline and client leaving is one of its events.

The server model (a llama.cpp CPU server; one compute resource, e.g. 2 cores)
-------------------------------------------------------------------------------
- ``slots`` parallel slots. A request takes a slot when one is free, else it waits in
  llama-server's own unbounded FIFO queue (its "deferred" task queue).
- Prefill and decode share the cores, and **prefill preempts decode**: while any slot
  has prompt work, the whole server prefills, one prompt at a time, FIFO by slot
  assignment, a prompt of n tokens taking the calibrated T_prefill(n); decoding streams
  stall meanwhile. With no prompt work, the B decoding streams advance together, each at
  the calibrated per-stream rate 1 / t_decode(B) (processor sharing on the decode curve).
  This is the model under the core's formulas: the TTFT predicate drains the queue at the
  full prefill rate, and ``service.server_seconds_per_request`` charges a request
  T_prefill(n_in) + n_out · t_decode(B) / B of exclusive server time, so at B = cap the
  simulator's capacity *is* the derived μ.
  Simplification: llama-server really puts the decode tokens of every generating slot in
  the same batch as a prompt chunk, so streams do creep forward during a prefill; on a
  CPU that batch costs about as much as the prompt alone, so we let them stall, and we
  neither overlap prefill with decode at full speed (which would overstate capacity) nor
  batch several prompts into one pass (T_prefill per prompt, intercept included).
- The first token is emitted when a prompt's prefill ends (TTFT). Decode then costs the
  request's n_out token steps, as in the core's T(r) = T_prefill + n_out · t_decode
  (the one-token off-by-one is ignored, slightly conservative). Output length = the
  request's max_tokens (the load generator's ``ignore_eos``), so the gate's reserved n_out
  is exact; real traffic that stops early only frees capacity sooner.

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

Gates
-----
- ``none``: llama-server alone; everything is admitted into its queue.
- ``slogate``: the GateMachine with the calibrated prefill rate (the sidecar uses the
  live measured one); every arrival is of the default class. ADMIT forwards, REJECT is a
  429, DEFER waits until a first token or a finished request makes room, and is judged a
  last time when its wait runs out (the sidecar's behaviour, by construction).
- ``count-cap``: the usual magic numbers: at most ``concurrency`` forwarded, at most
  ``queue`` waiting in front (FIFO), reject when both are full.
- ``clairvoyant``: on a trace, a plan made knowing every request's service
  (``clairvoyant.bound_for_trace``): each arrival forwarded at once or refused.

Fleets
------
``replicas`` pods (``simulated_pod``), each its own llama-server and front (its own
GateMachine and calibrated curves: ``SimulationConfig.pods``), behind a balancer
(``simulated_routing``: random, round-robin, least-requests, retry-429, central). A pod's
refusal sent to another pod by ``retry-429`` costs no time; a request's TTFT runs from its
first arrival. Every event touches one pod, so a run of 1,000 pods costs per request about
what a run of one does.

An ``exponential`` service mode replaces each request's work with an Exp(mean) number of
server-seconds on its own slot (slots in parallel) and no decode: with no gate and one
slot it is exactly M/M/1, the closed-form check; with a count cap of C slots and no queue,
C servers with no waiting room, Erlang's loss system.
Runs start empty (no warm-up), arrivals stop at ``duration_s``, and the run continues
until every request has left. Rates and time averages are over [0, duration_s].
"""

from __future__ import annotations

import heapq
import itertools
import math
from array import array
from collections.abc import Iterator

import numpy as np

from slogate_bench.scenario import SimulationConfig, SimulationResult
from slogate_bench.simulated_fronts import Forward, Hold, Refuse
from slogate_bench.simulated_pod import AT_GATE, GONE, SimRequest, SimulatedPod
from slogate_bench.simulated_routing import Router

_CHUNK = 4096
"""Arrivals drawn per batch from each RNG stream."""

# Timer kinds.
_CLIENT_TIMEOUT = 0
_DEFER_DEADLINE = 1

# Event kinds.
_COMPLETION = 0
_TIMER = 1
_ARRIVAL = 2

_NO_SERVICE = -1.0
"""An arrival's service when the pod it reaches decides it (T_prefill of that pod's curve)."""


def _arrivals(config: SimulationConfig) -> Iterator[tuple[float, int, int, float]]:
    """(time, prompt tokens, output tokens, exponential service or ``_NO_SERVICE``) of each
    arrival in [0, duration].

    One RNG stream per quantity, spawned from the seed: every gate sees the same arrivals
    (a fifth stream is the router's). With a ``trace``, its arrivals instead, as they are.
    """
    if config.trace is not None:
        yield from ((a.at_s, a.prompt_tokens, a.max_tokens, _NO_SERVICE) for a in config.trace)
        return
    wl = config.workload
    times_rng, prompt_rng, output_rng, service_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(4)
    )
    exponential = wl.service == "exponential"
    t = 0.0
    while t <= config.duration_s:
        times = t + np.cumsum(times_rng.exponential(1.0 / config.arrival_rate_rps, size=_CHUNK))
        t = float(times[-1])
        count = int(np.searchsorted(times, config.duration_s, side="right"))
        prompts = wl.prompt_tokens.draw(prompt_rng, _CHUNK)[:count]
        outputs = wl.output_tokens.draw(output_rng, _CHUNK)[:count]
        if exponential:  # the whole service is one Exp(mean) stretch of work, no decode
            services: list[float] = service_rng.exponential(wl.exponential_mean_s, size=_CHUNK)[:count].tolist()
            outputs = [0] * count
        else:
            services = [_NO_SERVICE] * count
        arrival_times: list[float] = times[:count].tolist()
        yield from zip(arrival_times, prompts, outputs, services, strict=True)


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
        specs = itertools.cycle(config.pod_specs())
        self.pods = [
            SimulatedPod(i, server, front.build(), self.window, exponential=self.exponential, seq=self.seq)
            for i, (server, front) in zip(range(config.replicas), specs, strict=False)
        ]
        self.router = Router(config.routing, len(self.pods), config.seed)
        self.retrying = config.routing.tries > 1
        # (time, seq, pod, the pod's version when pushed): stale entries skipped
        self.completions: list[tuple[float, int, SimulatedPod, int]] = []
        # timers: (time, seq, kind, req, pod of a deadline), stale entries skipped
        self.timers: list[tuple[float, int, int, SimRequest, int]] = []
        # measurements
        self.offered = self.admitted = self.deferred = self.rejected = self.tries = 0
        self.timed_out = self.completed = self.within = self.entered = 0
        self.completed_in_window = 0
        self.inside = 0
        self.area = 0.0
        self.sojourn_sum = 0.0
        self.sojourn_count = 0
        self.ttfts = array("d")

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimulationResult:
        arrivals = _arrivals(self.cfg)
        upcoming = next(arrivals, None)
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
                    self.area += self.inside * ((t if t < window else window) - self.now)
                self.now = t
            if kind == _ARRIVAL:
                assert upcoming is not None
                self._arrive(*upcoming)
                upcoming = next(arrivals, None)
            elif kind == _TIMER:
                self._timer()
            else:
                self._completion(heapq.heappop(completions)[2])
        return self._result()

    def _changed(self, pod: SimulatedPod) -> None:
        """After ``pod``'s state changed: its next completion rescheduled, the router told."""
        t = pod.next_completion()
        if t != pod.scheduled:
            pod.version += 1
            pod.scheduled = t
            if t < math.inf:
                heapq.heappush(self.completions, (t, next(self.seq), pod, pod.version))
        if self.router.tracks:
            self.router.changed(pod.index, pod.conns, pod.front)

    def _push_timer(self, at: float, kind: int, req: SimRequest, pod: int = -1) -> None:
        if at < math.inf:
            heapq.heappush(self.timers, (at, next(self.seq), kind, req, pod))

    # ------------------------------------------------------------------ arrivals, routing and fronts

    def _arrive(self, at: float, prompt_tokens: int, output_tokens: int, service: float) -> None:
        self.offered += 1
        self._try(SimRequest(at, prompt_tokens, output_tokens, service), self.router.first())

    def _try(self, req: SimRequest, index: int) -> None:
        """Offer the request to pod ``index``'s front."""
        pod = self.pods[index]
        pod.advance(self.now)
        req.pod = index
        req.tries += 1
        self.tries += 1
        if self.retrying:
            req.tried.append(index)
        pod.conns += 1
        answer = pod.front.arrive(req, req.prompt_tokens, req.output_tokens, self.now)
        if isinstance(answer, Refuse):
            pod.conns -= 1
            self._changed(pod)
            self._refused(req)
            return
        if not req.entered:
            self._enter(req)
        if isinstance(answer, Hold):
            if not req.deferred:
                req.deferred = True
                self.deferred += 1
            req.where = AT_GATE
            self._push_timer(answer.deadline, _DEFER_DEADLINE, req, index)
        else:
            self._apply(pod, [answer])
        self._changed(pod)

    def _refused(self, req: SimRequest) -> None:
        """A front refused it: another pod if the routing retries and tries remain, else a
        429 reaches its client."""
        if self.retrying:
            nxt = self.router.next(req.tried)
            if nxt is not None:
                self._try(req, nxt)
                return
        self.rejected += 1
        if req.entered:  # it had waited at a gate
            self._leave(req)

    def _enter(self, req: SimRequest) -> None:
        """The request is inside (not refused on the spot); its client's patience starts now."""
        req.entered = True
        self.entered += 1
        self.inside += 1
        self._push_timer(req.arrival + self.timeout, _CLIENT_TIMEOUT, req)

    def _apply(self, pod: SimulatedPod, answers: list[Forward | Refuse]) -> None:
        """What ``pod``'s front decided: forward (n_out clamped to what it allows) or refuse."""
        for answer in answers:
            req = answer.key
            assert isinstance(req, SimRequest)
            if isinstance(answer, Forward):
                req.output_tokens = min(req.output_tokens, answer.output_tokens)
                req.forwarded = True
                self.admitted += 1
                if req.prefill_s == _NO_SERVICE:
                    req.prefill_s = pod.server.prefill.seconds(req.prompt_tokens)
                pod.forward(req)
            else:
                pod.conns -= 1
                self._refused(req)

    def _release_gate(self, pod: SimulatedPod, req: SimRequest) -> None:
        """The request ended or its client left: return its place in front (once)."""
        if not req.forwarded:
            return
        req.forwarded = False
        self._apply(pod, pod.front.ended(req, self.now))

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
        self.ttfts.append(req.ttft)
        self._apply(pod, pod.front.first_token(req, self.now))
        if req.output_tokens <= 0:  # the exponential mode: the whole service was the "prefill"
            self._complete(pod, req)
            return
        pod.start_decode(req)

    def _complete(self, pod: SimulatedPod, req: SimRequest) -> None:
        self.completed += 1
        if self.now <= self.window:
            self.completed_in_window += 1
        if req.ttft <= self.slo:
            self.within += 1
        req.where = GONE
        pod.free_slot()
        pod.conns -= 1
        self._release_gate(pod, req)
        self._leave(req)

    def _leave(self, req: SimRequest) -> None:
        req.where = GONE
        self.inside -= 1
        self.sojourn_sum += self.now - req.arrival
        self.sojourn_count += 1

    # ------------------------------------------------------------------ timers

    def _timer(self) -> None:
        _, _, kind, req, index = heapq.heappop(self.timers)
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
        self.timed_out += 1
        req.abandoned = True
        pod = self.pods[req.pod]
        pod.advance(self.now)
        if req.where == AT_GATE:
            self._apply(pod, pod.front.left(req, self.now))
        else:  # in the server queue it is skipped when a slot frees; mid-prefill it finishes first
            pod.drop_unstarted(req)
        self._release_gate(pod, req)
        pod.conns -= 1
        self._leave(req)
        self._changed(pod)

    # ------------------------------------------------------------------ results

    def _result(self) -> SimulationResult:
        duration = self.window
        ttfts = np.frombuffer(self.ttfts, dtype=np.float64) if len(self.ttfts) else None
        p50 = p99 = None
        if ttfts is not None:
            p50, p99 = (float(q) for q in np.quantile(ttfts, [0.5, 0.99]))
        return SimulationResult(
            gate=self.cfg.front.name,
            arrival_rate_rps=self.cfg.arrival_rate_rps,
            capacity_rps=self.cfg.capacity_rps,
            duration_s=duration,
            offered=self.offered,
            admitted=self.admitted,
            deferred=self.deferred,
            rejected=self.rejected,
            timed_out=self.timed_out,
            completed=self.completed,
            completed_within_slo=self.within,
            throughput_rps=self.completed_in_window / duration,
            goodput_rps=self.within / duration,
            ttft_p50_s=p50,
            ttft_p99_s=p99,
            mean_time_in_system_s=self.sojourn_sum / self.sojourn_count if self.sojourn_count else None,
            mean_in_system=self.area / duration,
            entered=self.entered,
            utilization=sum(pod.busy for pod in self.pods) / len(self.pods) / duration,
            replicas=len(self.pods),
            routing=str(self.cfg.routing),
            tries=self.tries,
        )


def simulate(config: SimulationConfig) -> SimulationResult:
    """Run one simulation to the end (every request has left); deterministic in ``config.seed``."""
    return _Simulation(config).run()
