"""One simulated pod: a llama-server's slots, queue, prefill and decode, and the front before it.

The server model (a llama.cpp CPU server; one compute resource, e.g. 2 cores):

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

In the ``exponential`` service mode a request's whole service is one Exp(mean) stretch on
its own slot, the slots in parallel (C slots: the M/M/C server; one slot: M/M/1).

A pod keeps its own clock, ``last``: the simulator moves it (``advance``) only when an
event touches this pod, so an event costs the same with 1 pod or 1,000. What happens to a
request (its front's answers, the client's patience, the measurements) is the simulator's;
a pod only moves requests between its places and says when its next completion is due.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from slogate_bench.capacity import ServerModel
from slogate_bench.simulated_fronts import Front

# Where a request is. The gate-side places come first; a request leaves llama-server's
# side only by finishing or by its client leaving.
AT_GATE = 0  # deferred by slogate, or queued in front by count-cap
SERVER_QUEUE = 1
PREFILL = 2
DECODE = 3
GONE = 4


@dataclass(slots=True, eq=False)
class SimRequest:
    """One client request, from its arrival to its leaving."""

    arrival: float
    prompt_tokens: int
    output_tokens: int
    prefill_s: float
    """T_prefill(n_in) on the pod it reaches (the exponential mode: its whole service)."""
    where: int = SERVER_QUEUE
    pod: int = -1
    """The pod whose front holds it now (the last tried)."""
    tries: int = 0
    """Pods tried so far (a refused try sent elsewhere counts)."""
    entered: bool = False
    """It got past a front's refusal once: its client's patience runs."""
    deferred: bool = False
    """A front held it at least once."""
    key: int = 0
    """The request's number, the same on each of its client's tries (its idempotency key)."""
    retries: int = 0
    """Its client's tries before this one (a retrying client's 429s)."""
    first_arrival: float = math.nan
    """When its client first sent it (``arrival`` is this try's)."""
    tenant: str | None = None
    """Who sent it (a trace's ``Traced.tenant``): told to the front, counted per tenant."""
    tried: list[int] = field(default_factory=list)
    """The pods tried (kept only when the routing retries)."""
    forwarded: bool = False
    """Went through the front (whose place it holds until it ends)."""
    abandoned: bool = False
    first_token: bool = False
    ttft: float = math.nan


class SimulatedPod:
    """A llama-server and its front, on a clock of its own."""

    __slots__ = (
        "busy",
        "conns",
        "decoders",
        "exponential",
        "free_slots",
        "front",
        "index",
        "last",
        "per_token",
        "prefill_fifo",
        "prefill_left",
        "routable",
        "scheduled",
        "seq",
        "server",
        "server_queue",
        "services",
        "version",
        "vtokens",
        "window",
    )

    def __init__(
        self, index: int, server: ServerModel, front: Front, window: float, *, exponential: bool, seq: Iterator[int]
    ) -> None:
        self.index = index
        self.server = server
        self.front = front
        self.window = window
        """Busy time is integrated over [0, window] only."""
        self.exponential = exponential
        self.seq = seq
        """The run's tie-breaker for heap entries (shared by every pod)."""
        self.free_slots = server.slots
        self.server_queue: deque[SimRequest] = deque()
        self.prefill_fifo: deque[SimRequest] = deque()
        self.prefill_left = 0.0
        self.decoders: list[tuple[float, int, SimRequest]] = []
        """(finish on the virtual token clock, seq, request)."""
        self.vtokens = 0.0
        """Tokens each decoding stream has produced since t = 0 (all advance together)."""
        self.services: list[tuple[float, int, SimRequest]] = []
        """The exponential mode: (finish time, seq, request), one per busy slot."""
        self.per_token = [0.0] + [server.decode.seconds_per_token(b) for b in range(1, server.slots + 1)]
        self.last = 0.0
        self.busy = 0.0
        self.conns = 0
        """Requests its front holds or forwarded, from routing to leaving: what a balancer's
        ``least_conn`` counts (its open connections to this pod)."""
        self.version = 0
        """Bumped whenever its next completion moved (stale heap entries skipped)."""
        self.scheduled = math.inf
        """The completion time last pushed for it (nan: consumed)."""
        self.routable = True
        """The balancer may send it requests (a starting or stopping pod may not: ``simulated_fleet``)."""

    # ------------------------------------------------------------------ time

    def advance(self, t: float) -> None:
        """Move this pod's clock to ``t``: its work in hand progresses, busy time integrates."""
        last = self.last
        if t <= last:
            return
        fifo, decoders = self.prefill_fifo, self.decoders
        if last < self.window and (fifo or decoders or self.services):
            self.busy += (t if t < self.window else self.window) - last
        if fifo:
            self.prefill_left -= t - last
        elif decoders:
            self.vtokens += (t - last) / self.per_token[len(decoders)]
        self.last = t

    def next_completion(self) -> float:
        """When its next prefill, decode or service ends at the current pace (inf: idle)."""
        if self.services:
            return self.services[0][0]
        if self.prefill_fifo:
            return self.last + self.prefill_left
        if self.decoders:
            return self.last + (self.decoders[0][0] - self.vtokens) * self.per_token[len(self.decoders)]
        return math.inf

    # ------------------------------------------------------------------ llama-server

    def forward(self, req: SimRequest) -> None:
        """Into llama-server: a free slot, else its own FIFO queue."""
        if self.free_slots > 0:
            self.free_slots -= 1
            self._start_slot(req)
        else:
            req.where = SERVER_QUEUE
            self.server_queue.append(req)

    def _start_slot(self, req: SimRequest) -> None:
        req.where = PREFILL
        if self.exponential:
            heapq.heappush(self.services, (self.last + req.prefill_s, next(self.seq), req))
            return
        self.prefill_fifo.append(req)
        if len(self.prefill_fifo) == 1:
            self.prefill_left = req.prefill_s

    def free_slot(self) -> None:
        """A slot is idle: llama-server takes the next live request from its queue."""
        while self.server_queue:
            req = self.server_queue.popleft()
            if not req.abandoned:
                self._start_slot(req)
                return
        self.free_slots += 1

    def prefill_due(self) -> bool:
        """Its next completion is a prompt's prefill (or, exponential, a service)."""
        return bool(self.services or self.prefill_fifo)

    def finish_prefill(self) -> SimRequest:
        """The head prompt's prefill (or the soonest service) ended: out of the prefill."""
        if self.services:
            return heapq.heappop(self.services)[2]
        req = self.prefill_fifo.popleft()
        self.prefill_left = self.prefill_fifo[0].prefill_s if self.prefill_fifo else 0.0
        return req

    def start_decode(self, req: SimRequest) -> None:
        """Its first token came: it decodes its n_out tokens with the other streams."""
        req.where = DECODE
        heapq.heappush(self.decoders, (self.vtokens + req.output_tokens, next(self.seq), req))

    def finish_decodes(self) -> list[SimRequest]:
        """The soonest stream (and any ending with it) generated its last token."""
        decoders = self.decoders
        finish = decoders[0][0]
        self.vtokens = finish
        done = []
        while decoders and decoders[0][0] <= finish + 1e-9:
            done.append(heapq.heappop(decoders)[2])
        return done

    def drop_unstarted(self, req: SimRequest) -> None:
        """Its client left. Queued: skipped when a slot frees. In a slot whose prefill has not
        started: dropped, the slot freed. Mid-prefill (or mid-service) it finishes first."""
        if req.where == PREFILL and self.prefill_fifo and self.prefill_fifo[0] is not req and req in self.prefill_fifo:
            self.prefill_fifo.remove(req)
            self.free_slot()
