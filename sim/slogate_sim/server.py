"""llama-server's slots, queue, prefill and decode: the one model of the server, run by the
simulator's pods (``pod``) and by the clairvoyant's plan (``clairvoyant``).

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

The model only moves requests between its places and says when its next completion is
due; its user runs the clock (``advance`` to each event, then the completion), and decides
what a first token or an end means and what a freed slot takes. Decoding streams keep a
virtual token clock, ``vtokens`` (the tokens each has made since t = 0, all advancing
together): a stream's end is fixed on it once, when it starts, so a change of the batch
size only changes the clock's pace, never the entries of the heap.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, Self, TypeVar

from slogate_sim.capacity import ServerModel

# Where a request is in llama-server (the server marks it; its user may add places of its own).
SERVER_QUEUE = 1
PREFILL = 2  # in a slot, its prompt waiting or prefilling
DECODE = 3


class Job(Protocol):
    """What the server knows of a request (read off it where needed, not copied alongside)."""

    where: int
    """``SERVER_QUEUE``, ``PREFILL`` or ``DECODE``, set by the server."""

    @property
    def prefill_s(self) -> float:
        """T_prefill(n_in) on this server: seconds of the whole server."""

    @property
    def output_tokens(self) -> int:
        """Tokens to decode after the first."""


J = TypeVar("J", bound=Job)


class LlamaServer(Generic[J]):
    """A llama-server on a clock of its own, ``last``. Users subclass it, so that the model's
    state and theirs are attributes of one object (the simulator's hot path reads both)."""

    __slots__ = (
        "busy",
        "decoders",
        "free_slots",
        "last",
        "per_token",
        "prefill_fifo",
        "prefill_left",
        "seq",
        "server_queue",
        "vtokens",
        "window",
    )

    def __init__(self, model: ServerModel, seq: Iterator[int], *, window: float = 0.0) -> None:
        self.seq = seq
        """Tie-breaker of equal ends in ``decoders``: the order pushed (so it may be shared,
        with other servers or copies: it only has to increase)."""
        self.free_slots = model.slots
        self.server_queue: deque[J] = deque()
        """llama-server's own queue: forwarded, waiting for a slot."""
        self.prefill_fifo: deque[J] = deque()
        """In slots with prompt work, in the order they got them; the head is prefilling."""
        self.prefill_left = 0.0
        """The head's prefill seconds still to go."""
        self.decoders: list[tuple[float, int, J]] = []
        """(finish on the virtual token clock, seq, request), a heap."""
        self.vtokens = 0.0
        """Tokens each decoding stream has produced since t = 0 (all advance together)."""
        self.per_token = [0.0] + [model.decode.seconds_per_token(b) for b in range(1, model.slots + 1)]
        """t_decode(B) at index B: the seconds a token of each of B streams takes."""
        self.last = 0.0
        self.window = window
        """Busy time is integrated over [0, window] only (0: not at all)."""
        self.busy = 0.0
        """Seconds it computed (prefill or decode) within the window: its utilization. Here,
        not in its user, so that moving the clock stays one call (the simulator's hottest)."""

    def copy(self) -> Self:
        """The server's state, to run ahead on its own (the requests themselves are shared;
        a subclass with state of its own copies that too)."""
        other = type(self).__new__(type(self))
        other.seq, other.free_slots, other.per_token = self.seq, self.free_slots, self.per_token
        other.prefill_left, other.vtokens, other.last = self.prefill_left, self.vtokens, self.last
        other.window, other.busy = self.window, self.busy
        other.server_queue, other.prefill_fifo = deque(self.server_queue), deque(self.prefill_fifo)
        other.decoders = list(self.decoders)
        return other

    # ------------------------------------------------------------------ time

    def advance(self, t: float) -> None:
        """Move the clock to ``t`` (no event on the way): the work in hand progresses, busy
        time integrates."""
        last = self.last
        if t <= last:
            return
        fifo, decoders = self.prefill_fifo, self.decoders
        if last < self.window and (fifo or decoders):
            self.busy += (t if t < self.window else self.window) - last
        if fifo:
            self.prefill_left -= t - last
        elif decoders:
            self.vtokens += (t - last) / self.per_token[len(decoders)]
        self.last = t

    def next_completion(self) -> float:
        """When its next prefill or decode ends at the current pace (inf: idle)."""
        if self.prefill_fifo:
            return self.last + self.prefill_left
        if self.decoders:
            return self.last + (self.decoders[0][0] - self.vtokens) * self.per_token[len(self.decoders)]
        return math.inf

    def prefill_due(self) -> bool:
        """Its next completion is a prompt's prefill (else a decode stream's end)."""
        return bool(self.prefill_fifo)

    # ------------------------------------------------------------------ requests

    def forward(self, job: J) -> None:
        """A request reaches it: a free slot, else its FIFO queue."""
        if self.free_slots > 0:
            self.free_slots -= 1
            self._start(job)
        else:
            job.where = SERVER_QUEUE
            self.server_queue.append(job)

    def _start(self, job: J) -> None:
        """Into a slot: its prompt joins the prefill FIFO (prefilling at once if alone)."""
        job.where = PREFILL
        self.prefill_fifo.append(job)
        if len(self.prefill_fifo) == 1:
            self.prefill_left = job.prefill_s

    def free_slot(self) -> None:
        """A slot is idle: the queue's head takes it."""
        if self.server_queue:
            self._start(self.server_queue.popleft())
        else:
            self.free_slots += 1

    def finish_prefill(self) -> J:
        """At its completion, when ``prefill_due``: the head prompt's prefill ended (its first
        token); the next prompt starts. The request keeps its slot: ``start_decode`` or
        ``free_slot``."""
        job = self.prefill_fifo.popleft()
        self.prefill_left = self.prefill_fifo[0].prefill_s if self.prefill_fifo else 0.0
        return job

    def start_decode(self, job: J) -> None:
        """It decodes its n_out tokens with the other streams."""
        job.where = DECODE
        heapq.heappush(self.decoders, (self.vtokens + job.output_tokens, next(self.seq), job))

    def finish_decodes(self) -> list[J]:
        """At its completion, when not ``prefill_due``: the soonest stream (and any ending
        with it, to rounding) generated its last token. Their slots are the caller's to free."""
        decoders = self.decoders
        finish = decoders[0][0]
        self.vtokens = finish
        done = []
        while decoders and decoders[0][0] <= finish + 1e-9:
            done.append(heapq.heappop(decoders)[2])
        return done
