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

An ``exponential`` service mode replaces each request's work with an Exp(mean) number of
server-seconds and no decode: with no gate it is exactly M/M/1, the closed-form check.
Runs start empty (no warm-up), arrivals stop at ``duration_s``, and the run continues
until every request has left. Rates and time averages are over [0, duration_s].
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from slogate_bench.scenario import SimulationConfig, SimulationResult
from slogate_bench.simulated_fronts import Forward, Hold, Refuse

_CHUNK = 4096
"""Arrivals drawn per batch from each RNG stream."""


# --------------------------------------------------------------------------- the engine

# Where a request is. The gate-side places come first; a request leaves llama-server's
# side only by finishing or by its client leaving.
_AT_GATE = 0  # deferred by slogate, or queued in front by count-cap
_SERVER_QUEUE = 1
_PREFILL = 2
_DECODE = 3
_GONE = 4

# Timer kinds.
_CLIENT_TIMEOUT = 0
_DEFER_DEADLINE = 1

# Event kinds.
_COMPLETION = 0
_TIMER = 1
_ARRIVAL = 2


@dataclass(slots=True, eq=False)
class _Req:
    arrival: float
    prompt_tokens: int
    output_tokens: int
    prefill_s: float
    where: int = _SERVER_QUEUE
    forwarded: bool = False
    """Went through the front (whose place it holds until it ends)."""
    abandoned: bool = False
    first_token: bool = False
    ttft: float = math.nan


def _arrivals(config: SimulationConfig) -> Iterator[tuple[float, int, int, float]]:
    """(time, prompt tokens, output tokens, prefill seconds) of each arrival in [0, duration].

    One RNG stream per quantity, spawned from the seed: every gate sees the same arrivals.
    With a ``trace``, its arrivals instead, as they are (the seed is not used).
    """
    if config.trace is not None:
        prefill = config.server.prefill
        yield from ((a.at_s, a.prompt_tokens, a.max_tokens, prefill.seconds(a.prompt_tokens)) for a in config.trace)
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
            services = [config.server.prefill.seconds(n) for n in prompts]
        arrival_times: list[float] = times[:count].tolist()
        yield from zip(arrival_times, prompts, outputs, services, strict=True)


class _Simulation:
    """The event loop. Events: arrivals, the prefill head finishing, the soonest decode
    stream finishing, and timers (client timeouts, deferral deadlines)."""

    def __init__(self, config: SimulationConfig) -> None:
        self.cfg = config
        self.window = config.duration_s
        self.timeout = config.workload.client_timeout_s
        self.slo = config.ttft_slo_s
        self.now = 0.0
        # llama-server
        self.free_slots = config.server.slots
        self.server_queue: deque[_Req] = deque()
        self.prefill_fifo: deque[_Req] = deque()
        self.prefill_left = 0.0
        self.decoders: list[tuple[float, int, _Req]] = []  # (finish on the virtual token clock, seq, req)
        self.vtokens = 0.0
        """Tokens each decoding stream has produced since t = 0 (all advance together)."""
        limit = max(config.server.slots, 1)
        self.seconds_per_token = [0.0] + [config.server.decode.seconds_per_token(b) for b in range(1, limit + 1)]
        # the gate
        self.front = config.front.build()
        # timers: (time, seq, kind, req), stale entries skipped
        self.timers: list[tuple[float, int, int, _Req]] = []
        self.seq = 0
        # measurements
        self.offered = self.admitted = self.deferred = self.rejected = 0
        self.timed_out = self.completed = self.within = self.entered = 0
        self.completed_in_window = 0
        self.inside = 0
        self.area = 0.0
        self.busy = 0.0
        self.sojourn_sum = 0.0
        self.sojourn_count = 0
        self.ttfts = array("d")

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimulationResult:
        arrivals = _arrivals(self.cfg)
        upcoming = next(arrivals, None)
        inf = math.inf
        fifo, decoders, timers, per_token = self.prefill_fifo, self.decoders, self.timers, self.seconds_per_token
        while True:
            # The soonest event; at equal times completions go first (they free what an
            # arrival might need), then timers, then the arrival.
            now = self.now
            kind = _COMPLETION
            if fifo:
                t = now + self.prefill_left
            elif decoders:
                t = now + (decoders[0][0] - self.vtokens) * per_token[len(decoders)]
            else:
                t = inf
            if timers and timers[0][0] < t:
                t, kind = timers[0][0], _TIMER
            if upcoming is not None and upcoming[0] < t:
                t, kind = upcoming[0], _ARRIVAL
            if t == inf:
                break
            self._advance(t)
            if kind == _ARRIVAL:
                assert upcoming is not None
                self._arrive(*upcoming)
                upcoming = next(arrivals, None)
            elif kind == _TIMER:
                self._timer()
            elif fifo:
                self._prefill_done()
            else:
                self._decode_done()
        return self._result()

    def _advance(self, t: float) -> None:
        """Move the clock to ``t``: integrate the counts, progress the work in hand."""
        now = self.now
        if t <= now:
            return
        window = self.window
        fifo, decoders = self.prefill_fifo, self.decoders
        if now < window:
            overlap = (t if t < window else window) - now
            self.area += self.inside * overlap
            if fifo or decoders:
                self.busy += overlap
        if fifo:
            self.prefill_left -= t - now
        elif decoders:
            self.vtokens += (t - now) / self.seconds_per_token[len(decoders)]
        self.now = t

    def _push_timer(self, at: float, kind: int, req: _Req) -> None:
        if at < math.inf:
            self.seq += 1
            heapq.heappush(self.timers, (at, self.seq, kind, req))

    # ------------------------------------------------------------------ arrivals and the gates

    def _arrive(self, at: float, prompt_tokens: int, output_tokens: int, prefill_s: float) -> None:
        req = _Req(at, prompt_tokens, output_tokens, prefill_s)
        self.offered += 1
        answer = self.front.arrive(req, prompt_tokens, output_tokens, self.now)
        if isinstance(answer, Refuse):
            self.rejected += 1
            return
        self._enter(req)
        if isinstance(answer, Hold):
            self.deferred += 1
            req.where = _AT_GATE
            self._push_timer(answer.deadline, _DEFER_DEADLINE, req)
        else:
            self._apply([answer])

    def _enter(self, req: _Req) -> None:
        """The request is inside (not rejected on the spot); its client's patience starts now."""
        self.entered += 1
        self.inside += 1
        self._push_timer(req.arrival + self.timeout, _CLIENT_TIMEOUT, req)

    def _apply(self, answers: list[Forward | Refuse]) -> None:
        """What the front decided: forward (n_out clamped to what it allows) or refuse."""
        for answer in answers:
            req = answer.key
            assert isinstance(req, _Req)
            if isinstance(answer, Forward):
                req.output_tokens = min(req.output_tokens, answer.output_tokens)
                req.forwarded = True
                self._forward(req)
            else:
                self.rejected += 1
                self._leave(req)

    def _release_gate(self, req: _Req) -> None:
        """The request ended or its client left: return its place in front (once)."""
        if not req.forwarded:
            return
        req.forwarded = False
        self._apply(self.front.ended(req, self.now))

    # ------------------------------------------------------------------ llama-server

    def _forward(self, req: _Req) -> None:
        """Into llama-server: a free slot, else its own FIFO queue."""
        self.admitted += 1
        if self.free_slots > 0:
            self.free_slots -= 1
            self._start_slot(req)
        else:
            req.where = _SERVER_QUEUE
            self.server_queue.append(req)

    def _start_slot(self, req: _Req) -> None:
        req.where = _PREFILL
        self.prefill_fifo.append(req)
        if len(self.prefill_fifo) == 1:
            self.prefill_left = req.prefill_s

    def _free_slot(self) -> None:
        """A slot is idle: llama-server takes the next live request from its queue."""
        while self.server_queue:
            req = self.server_queue.popleft()
            if not req.abandoned:
                self._start_slot(req)
                return
        self.free_slots += 1

    def _prefill_done(self) -> None:
        req = self.prefill_fifo.popleft()
        self.prefill_left = self.prefill_fifo[0].prefill_s if self.prefill_fifo else 0.0
        if req.abandoned:  # its client left mid-prefill: the compute is spent, nothing is sent
            req.where = _GONE
            self._free_slot()
            return
        req.first_token = True
        req.ttft = self.now - req.arrival
        self.ttfts.append(req.ttft)
        self._apply(self.front.first_token(req, self.now))
        if req.output_tokens <= 0:  # the exponential mode: the whole service was the "prefill"
            self._complete(req)
            return
        req.where = _DECODE
        self.seq += 1
        heapq.heappush(self.decoders, (self.vtokens + req.output_tokens, self.seq, req))

    def _decode_done(self) -> None:
        finish = self.decoders[0][0]
        self.vtokens = finish
        while self.decoders and self.decoders[0][0] <= finish + 1e-9:
            _, _, req = heapq.heappop(self.decoders)
            self._complete(req)

    def _complete(self, req: _Req) -> None:
        self.completed += 1
        if self.now <= self.window:
            self.completed_in_window += 1
        if req.ttft <= self.slo:
            self.within += 1
        req.where = _GONE
        self._free_slot()
        self._release_gate(req)
        self._leave(req)

    def _leave(self, req: _Req) -> None:
        req.where = _GONE
        self.inside -= 1
        self.sojourn_sum += self.now - req.arrival
        self.sojourn_count += 1

    # ------------------------------------------------------------------ timers

    def _timer(self) -> None:
        _, _, kind, req = heapq.heappop(self.timers)
        if req.where == _GONE or req.first_token:
            return  # stale: it finished, was rejected, or its first token came
        if kind == _DEFER_DEADLINE:
            if req.where == _AT_GATE:  # the wait ran out: the front judges it a last time
                self._apply(self.front.deadline(req, self.now))
            return
        self._abandon(req)

    def _abandon(self, req: _Req) -> None:
        """The client left before its first token."""
        self.timed_out += 1
        req.abandoned = True
        if req.where == _AT_GATE:
            self._apply(self.front.left(req, self.now))
        elif req.where == _PREFILL and self.prefill_fifo[0] is not req:
            self.prefill_fifo.remove(req)  # its prefill had not started: dropped, slot freed
            self._free_slot()
        # In the server queue it is skipped when a slot frees; mid-prefill it finishes first.
        self._release_gate(req)
        self._leave(req)

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
            utilization=self.busy / duration,
        )


def simulate(config: SimulationConfig) -> SimulationResult:
    """Run one simulation to the end (every request has left); deterministic in ``config.seed``."""
    return _Simulation(config).run()
