"""The gate on the event loop: the core's GateMachine, its results mapped onto futures and timers.

Everything runs on one event loop, so the machine needs no locks. A deferred arrival
gets a future; whatever resolves its waiter (a first token, a release, new thresholds:
the machine's wake-ups) sets it; its deadline is an ``asyncio.timeout``. An admitted
request gets a Lease, to which the proxy reports its outcomes. Nothing of the gate's
bookkeeping is here: the simulator drives the same machine in virtual time. While the
sidecar drains (``drain.Drain``) the gate admits nothing: an arrival, and every waiter
when the drain begins, gets ``Draining`` at once, before the machine books anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from slogate_admission.decision import Decision, GateConfig, Request
from slogate_admission.deferral_queue import Waiter
from slogate_admission.gate_machine import GateMachine, GateNotReady, RateSource, Resolution
from slogate_admission.ledger import Ledger, Ticket
from slogate_admission.schema import Thresholds
from slogate_sidecar.drain import Drain, DrainCause, Draining
from slogate_sidecar.lease import Learner, Lease, Origin
from slogate_sidecar.metrics import DeferralResult

__all__ = ["Admission", "Draining", "Gate", "GateNotReady", "GateObserver"]

Clock = Callable[[], float]


class Cancellable(Protocol):
    """A scheduled call that can be called off (an asyncio.TimerHandle is one)."""

    def cancel(self) -> None:
        """Call it off; a no-op once it ran."""


Schedule = Callable[[float, Callable[[], None]], Cancellable]
"""``schedule(at, callback)``: call ``callback`` once ``clock()`` reaches ``at``; returns a
handle whose ``cancel()`` calls it off. Injected so a test can run deadlines on its own clock."""


def _on_the_loop(clock: Clock) -> Schedule:
    """Deadlines as event-loop timers: ``at`` on ``clock`` is so many seconds from now."""

    def schedule(at: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(max(at - clock(), 0.0), callback)

    return schedule


class GateObserver(Protocol):
    """Hears the gate's own events (the metrics)."""

    def decided(self, decision: Decision, seconds: float) -> None:
        """An arrival's first decision and its compute time, even if its client then leaves."""

    def deferral_ended(self, first: Decision, final: Decision, result: DeferralResult) -> None:
        """A deferred request was admitted, refused when its wait ended, or left."""


@dataclass(frozen=True, slots=True)
class Admission:
    """How one arrival was judged: at arrival, and in the end (they differ after a deferral)."""

    first: Decision
    final: Decision
    lease: Lease | None
    """Admitted: report its outcomes to it. None when rejected."""

    @property
    def ticket(self) -> Ticket | None:
        """The admitted request's claims on the server."""
        return self.lease.ticket if self.lease is not None else None


class Gate:
    """The sidecar's gate: decides, books and defers through one GateMachine."""

    def __init__(
        self,
        clock: Clock = time.monotonic,
        live_prefill_rate: RateSource | None = None,
        observers: Sequence[GateObserver] = (),
        learners: Sequence[Learner] = (),
        schedule: Schedule | None = None,
        *,
        drain: Drain | None = None,
    ) -> None:
        self.clock = clock
        self.schedule: Schedule = schedule or _on_the_loop(clock)
        """Runs a callback at a time on ``clock``: the deferral deadlines."""
        self.machine = GateMachine(live_prefill_rate)
        self.observers = list(observers)
        self.learners = list(learners)
        """Hear every lease's outcomes."""
        # A gate built without one (the unit tests') cuts what runs at once when it drains.
        self.drain = drain if drain is not None else Drain(deadline_s=0.0)
        """Whether the sidecar drains; the gate keeps its count of admitted streams."""
        self._pending: dict[Waiter, asyncio.Future[Resolution]] = {}

    @property
    def ready(self) -> bool:
        """Thresholds are loaded."""
        return self.machine.ready

    @property
    def config(self) -> GateConfig:
        """The compiled thresholds; raises GateNotReady before the first load."""
        return self.machine.config

    @property
    def thresholds(self) -> Thresholds | None:
        """The thresholds in force."""
        return self.machine.thresholds

    @property
    def ledger(self) -> Ledger:
        """The live accounting."""
        return self.machine.ledger

    @property
    def deferred(self) -> int:
        """Requests waiting for capacity."""
        return self.machine.deferred

    def is_idle(self) -> bool:
        """Nothing queued, decoding, reserved or deferred: every counter back at zero."""
        return self.machine.is_idle()

    def load(self, thresholds: Thresholds) -> None:
        """Swap in new thresholds atomically; waiters are judged again."""
        self._settle(self.machine.load(thresholds, self.clock()))

    def decide(self, request: Request) -> Decision:
        """The core's decision on the live state, now (booking nothing)."""
        return self.machine.decide(request, self.clock())

    def precheck(self, empty: Request, estimated_prompt_tokens: int) -> Decision:
        """An arrival judged on an empty prompt before its tokens are counted
        (``GateMachine.precheck``): a refusal here is final, and its tenant's."""
        return self.machine.precheck(empty, self.clock(), estimated_prompt_tokens)

    async def acquire(self, request: Request, origin: Origin, arrived_at: float | None = None) -> Admission:
        """Admit (a Lease), defer then admit or reject, or reject at once.

        The observers hear the arrival's decision before any deferral, so it is counted
        even if the client leaves while deferred. A request whose client leaves while
        deferred is removed from the queue, and a Ticket granted in that same instant is
        released (CancelledError propagates). ``arrived_at``: when the request reached
        the proxy (TTFT runs from there); default now. Raises ``Draining`` while the sidecar
        drains, at arrival or, for a deferred request, when the drain begins.
        """
        if self.drain.active:
            raise Draining
        arrived = self.clock() if arrived_at is None else arrived_at
        started = time.perf_counter()
        verdict = self.machine.arrive(request, self.clock())
        seconds = time.perf_counter() - started
        first = verdict.decision
        for observer in self.observers:
            observer.decided(first, seconds)
        if verdict.waiter is None:
            return Admission(first, first, self._lease(verdict.ticket, first, origin, arrived))
        try:
            resolution = await self._wait(verdict.waiter)
        except asyncio.CancelledError:
            self._deferral_ended(first, first, "cancelled")
            raise
        except Draining:
            self._deferral_ended(first, first, "timed_out")  # refused when its wait ended, as a timeout is
            raise
        final = resolution.decision
        self._deferral_ended(first, final, "admitted" if resolution.ticket is not None else "timed_out")
        return Admission(first, final, self._lease(resolution.ticket, final, origin, arrived))

    def _lease(self, ticket: Ticket | None, decision: Decision, origin: Origin, arrived: float) -> Lease | None:
        if ticket is None:
            return None
        slo = self.config.limits_for(decision.class_name).ttft_slo_s
        return Lease(ticket, decision, slo, origin, arrived, self.clock, self.learners, self.first_token, self.release)

    def _deferral_ended(self, first: Decision, final: Decision, result: DeferralResult) -> None:
        for observer in self.observers:
            observer.deferral_ended(first, final, result)

    async def _wait(self, waiter: Waiter) -> Resolution:
        """Until a wake-up resolves the waiter or its deadline does (``expire``)."""
        future: asyncio.Future[Resolution] = asyncio.get_running_loop().create_future()
        self._pending[waiter] = future
        deadline = self.schedule(waiter.deadline, lambda: self._expire(waiter))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The client left. A ticket granted in that same instant must not leak.
            if future.done() and not future.cancelled():
                granted = future.result().ticket
                if granted is not None:
                    self.release(granted)
            else:
                self.machine.cancel(waiter)
            raise
        finally:
            deadline.cancel()
            self._pending.pop(waiter, None)

    def _expire(self, waiter: Waiter) -> None:
        """The waiter's deadline: judged a last time (admitted if it fits by now, else refused)."""
        expired = self.machine.expire(waiter, self.clock())
        if expired is not None:
            self._settle([expired])

    def first_token(self, ticket: Ticket) -> None:
        """The request's first token arrived: its prompt left the prefill queue."""
        self._settle(self.machine.first_token(ticket, self.clock()))

    def release(self, ticket: Ticket, output_tokens: int | None = None) -> None:
        """The request ended (any way): return its slot and KV. ``output_tokens``: what it
        generated, when llama-server said (its tenant's served tokens are corrected to it)."""
        self._settle(self.machine.release(ticket, self.clock(), output_tokens))
        self.drain.streams_now(self.ledger.streams)

    def begin_drain(self, cause: DrainCause) -> None:
        """Admit nothing from now on; refuse every deferred request at once (``Draining``)."""
        self.drain.begin(cause, self.ledger.streams)
        for waiter, future in list(self._pending.items()):
            if not future.done() and self.machine.cancel(waiter):
                future.set_exception(Draining())

    def _settle(self, resolutions: list[Resolution]) -> None:
        """Hand each resolved waiter its result; one nobody awaits any more gives its ticket back."""
        for resolution in resolutions:
            future = self._pending.get(resolution.waiter)
            if future is not None and not future.done():
                future.set_result(resolution)
            elif resolution.ticket is not None:
                self.release(resolution.ticket)
