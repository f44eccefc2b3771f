"""One simulated pod: a llama-server (``server``'s model) and the front before it.

A pod is the server model (a ``LlamaServer``: the simulator's hot path reads the model's
state and the pod's on one object) plus what the simulator needs of it: its front, the
window its busy time is measured over, the places of a request outside llama-server,
llama-server's skipping of queued requests whose clients left and its dropping of prompts
not yet started, the routing's bookkeeping, and the exponential service mode.

In the ``exponential`` service mode a request's whole service is one Exp(mean) stretch on
its own slot, the slots in parallel (C slots: the M/M/C server; one slot: M/M/1); the
slots and the queue are the model's, prefill and decode are not used.

A pod keeps its own clock, ``last``: the simulator moves it (``advance``) only when an
event touches this pod, so an event costs the same with 1 pod or 1,000. What happens to a
request (its front's answers, the client's patience, the measurements) is the simulator's;
a pod only moves requests between its places and says when its next completion is due.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from slogate_sim.capacity import ServerModel
from slogate_sim.fronts import Front
from slogate_sim.server import PREFILL, SERVER_QUEUE, LlamaServer

# Where a request is: llama-server's places (``server``: SERVER_QUEUE, PREFILL, DECODE) lie
# between these two; it leaves llama-server only by finishing or by its client leaving.
AT_GATE = 0  # deferred by slogate, or queued in front by count-cap
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
    class_name: str | None = None
    """Its class (a trace's ``Traced.class_name``), told to the front; None: the default class."""
    tried: list[int] = field(default_factory=list)
    """The pods tried (kept only when the routing retries)."""
    forwarded: bool = False
    """Went through the front (whose place it holds until it ends)."""
    abandoned: bool = False
    first_token: bool = False
    ttft: float = math.nan


class SimulatedPod(LlamaServer[SimRequest]):
    """A llama-server and its front, on a clock of its own (``new_pod`` makes one of the run's kind)."""

    __slots__ = ("conns", "front", "index", "routable", "scheduled", "server", "version")

    def __init__(self, index: int, server: ServerModel, front: Front, window: float, *, seq: Iterator[int]) -> None:
        # seq: the run's tie-breaker for heap entries (shared by every pod); busy time is
        # measured over the run's arrival window
        super().__init__(server, seq, window=window)
        self.index = index
        self.server = server
        self.front = front
        self.conns = 0
        """Requests its front holds or forwarded, from routing to leaving: what a balancer's
        ``least_conn`` counts (its open connections to this pod)."""
        self.version = 0
        """Bumped whenever its next completion moved (stale heap entries skipped)."""
        self.scheduled = math.inf
        """The completion time last pushed for it (nan: consumed)."""
        self.routable = True
        """The balancer may send it requests (a starting or stopping pod may not: ``fleet``)."""

    def free_slot(self) -> None:
        """A slot is idle: llama-server takes the next live request from its queue (it
        noticed the others' clients leave)."""
        while self.server_queue:
            req = self.server_queue.popleft()
            if not req.abandoned:
                self._start(req)
                return
        self.free_slots += 1

    def drop_unstarted(self, req: SimRequest) -> None:
        """Its client left. Queued: skipped when a slot frees. In a slot whose prefill has not
        started: dropped, the slot freed. Mid-prefill (or mid-service) it finishes first."""
        if req.where == PREFILL and self.prefill_fifo and self.prefill_fifo[0] is not req and req in self.prefill_fifo:
            self.prefill_fifo.remove(req)
            self.free_slot()


class ExponentialPod(SimulatedPod):
    """The exponential service mode: the slots and the queue of llama-server, but a request's
    service is one stretch of its ``prefill_s`` on its slot, the slots in parallel, no decode
    (in service, it is at ``PREFILL``). A subclass rather than a flag, so that the token
    model's hot path tests nothing for it."""

    __slots__ = ("services",)

    def __init__(self, index: int, server: ServerModel, front: Front, window: float, *, seq: Iterator[int]) -> None:
        super().__init__(index, server, front, window, seq=seq)
        self.services: list[tuple[float, int, SimRequest]] = []
        """(finish time, seq, request), one per busy slot: a heap."""

    def advance(self, t: float) -> None:
        """Only busy time integrates (a service's end is fixed when it starts)."""
        last = self.last
        if t <= last:
            return
        if last < self.window and self.services:
            self.busy += (t if t < self.window else self.window) - last
        self.last = t

    def next_completion(self) -> float:
        return self.services[0][0] if self.services else math.inf

    def prefill_due(self) -> bool:
        return bool(self.services)

    def _start(self, req: SimRequest) -> None:
        req.where = PREFILL
        heapq.heappush(self.services, (self.last + req.prefill_s, next(self.seq), req))

    def finish_prefill(self) -> SimRequest:
        """The soonest service ended (its "first token": it is complete, n_out being 0)."""
        return heapq.heappop(self.services)[2]


def new_pod(
    index: int, server: ServerModel, front: Front, window: float, *, exponential: bool, seq: Iterator[int]
) -> SimulatedPod:
    """Pod ``index`` of a run, in the run's service mode."""
    return (ExponentialPod if exponential else SimulatedPod)(index, server, front, window, seq=seq)
