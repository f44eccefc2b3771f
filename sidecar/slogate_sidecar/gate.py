"""The gate: the core's O(1) decision applied to live accounting, with deferral.

Everything runs on one event loop, so the counters need no locks; every mutation
is followed by a wake-up of the deferral queue, because only mutations (a first
token, a finished request, new thresholds) can make room.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from slogate_admission.decision import Decision, GateConfig, Outcome, Request, decide
from slogate_admission.schema import Thresholds
from slogate_sidecar.deferral import DeferralQueue, Waiter
from slogate_sidecar.ledger import Ledger, Ticket

Clock = Callable[[], float]
RateSource = Callable[[float], float | None]
"""Given ``now``, the live prefill rate, or None when it is stale or unknown."""


@dataclass(frozen=True, slots=True)
class Admission:
    """How one arrival was judged: at arrival, and in the end (they differ after a deferral)."""

    first: Decision
    final: Decision
    ticket: Ticket | None
    """Held until the request ends; None when rejected."""
    decide_seconds: float
    """Time the arrival's (first) decision took."""


class GateNotReady(RuntimeError):  # noqa: N818 - a state, named as one
    """No thresholds are loaded: the gate cannot decide."""


class Gate:
    """Decides, books and defers. One per sidecar."""

    def __init__(self, clock: Clock = time.monotonic, live_prefill_rate: RateSource | None = None) -> None:
        self.clock = clock
        self.live_prefill_rate: RateSource = live_prefill_rate or (lambda _now: None)
        self.ledger = Ledger()
        self.thresholds: Thresholds | None = None
        self._config: GateConfig | None = None
        self._ranks: dict[str, int] = {}
        self._waiters = DeferralQueue()

    @property
    def ready(self) -> bool:
        """Thresholds are loaded."""
        return self._config is not None

    def load(self, thresholds: Thresholds) -> None:
        """Swap in new thresholds atomically (one assignment); waiters are re-judged."""
        self._config = GateConfig.from_thresholds(thresholds)
        self._ranks = {c.name: rank for rank, c in enumerate(thresholds.classes)}
        self.thresholds = thresholds
        self._wake()

    @property
    def config(self) -> GateConfig:
        """The compiled thresholds; raises GateNotReady before the first load."""
        if self._config is None:
            raise GateNotReady("no thresholds loaded")
        return self._config

    def decide(self, request: Request) -> Decision:
        """The core's decision on the live state, now."""
        now = self.clock()
        state = self.ledger.snapshot(now, self.live_prefill_rate(now))
        return decide(self.config, request, state, now)

    async def acquire(self, request: Request, on_first: Callable[[Decision, float], None] | None = None) -> Admission:
        """Admit (a Ticket), defer then admit or reject, or reject at once.

        ``on_first`` sees the arrival's decision and its compute time before any
        deferral, so it is counted even if the client leaves while deferred. A request
        whose client leaves while deferred is removed from the queue, and a Ticket
        granted in that same instant is released (CancelledError propagates).
        """
        started = time.perf_counter()
        first = self.decide(request)
        seconds = time.perf_counter() - started
        if on_first is not None:
            on_first(first, seconds)
        if first.outcome is Outcome.ADMIT:
            return Admission(first, first, self._admit(first, request), seconds)
        if first.outcome is Outcome.REJECT:
            return Admission(first, first, None, seconds)
        final, ticket = await self._defer(first, request)
        return Admission(first, final, ticket, seconds)

    async def _defer(self, decision: Decision, request: Request) -> tuple[Decision, Ticket | None]:
        rank = self._ranks.get(decision.class_name, len(self._ranks))
        waiter = Waiter(rank=rank, request=request, arrived_at=self.clock())
        self._waiters.push(waiter)
        self.ledger.deferred += 1
        try:
            async with asyncio.timeout(decision.max_wait_s):
                return await asyncio.shield(waiter.outcome)
        except TimeoutError:
            if waiter.outcome.done():  # admitted in the same instant the wait ran out
                return waiter.outcome.result()
            final = self._decide_waited(waiter)
            return final._replace(outcome=Outcome.REJECT), None
        except asyncio.CancelledError:
            # The client left. A ticket granted in that same instant must not leak.
            if waiter.outcome.done():
                _, ticket = waiter.outcome.result()
                if ticket is not None:
                    self.release(ticket)
            raise
        finally:
            self._waiters.remove(waiter)
            self.ledger.deferred -= 1
            if not waiter.outcome.done():
                waiter.outcome.cancel()

    def _decide_waited(self, waiter: Waiter) -> Decision:
        waited = self.clock() - waiter.arrived_at
        return self.decide(dataclasses.replace(waiter.request, waited_s=waited))

    def _admit(self, decision: Decision, request: Request) -> Ticket:
        decode_s = decision.output_tokens * self.config.decode.seconds_per_token(decision.streams_after)
        return self.ledger.admit(decision, request.prompt_tokens, self.clock(), decode_s)

    def first_token(self, ticket: Ticket) -> None:
        """The request's first token arrived: its prompt left the prefill queue."""
        if self.ledger.first_token(ticket):
            self._wake()

    def release(self, ticket: Ticket) -> None:
        """The request ended (any way): return its slot and KV."""
        if self.ledger.release(ticket):
            self._wake()

    def _wake(self) -> None:
        """Re-judge waiters in priority order; stop at the first that must still wait."""
        if self._config is None:
            return
        for waiter in self._waiters.in_priority_order():
            if waiter.outcome.done():
                continue
            decision = self._decide_waited(waiter)
            if decision.outcome is Outcome.DEFER:
                return
            self._waiters.remove(waiter)
            ticket = self._admit(decision, waiter.request) if decision.outcome is Outcome.ADMIT else None
            waiter.outcome.set_result((decision, ticket))
