"""What stands between the simulated clients and the simulated llama-server: one interface.

A front hears a request's arrival, its first token, its end, its client leaving while it
waits in front, and its deadline; it answers with what to do: forward requests to the
server, refuse them, or hold one (until a later event forwards or refuses it). The
simulator runs any front the same way; only the fronts know what they are.

- ``direct``: llama-server alone: everything is forwarded to its own queue.
- ``count-cap``: at most ``concurrency`` forwarded, ``queue`` more held in a FIFO, the
  rest refused (the usual magic numbers).
- ``slogate``: the core's GateMachine, the sidecar's very own, in virtual time; it is told
  each request's tenant (booked under it when the thresholds carry a tenant policy) and the
  tokens each generated (what the tenant is charged in the end).
- ``clairvoyant``: a plan made knowing the whole trace (``clairvoyant``): the n-th
  arrival is forwarded at once if the plan admits it, else refused.

A run is configured with a front's *spec* (``Direct``, ``CountCapped``, ``Gated``, ``Planned``: a
name and what that front needs, nothing else), which builds a fresh front per run.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

from slogate_admission.decision import Decision, Request
from slogate_admission.deferral_queue import Waiter
from slogate_admission.gate_machine import GateMachine, Resolution
from slogate_admission.ledger import Ticket
from slogate_admission.schema import Thresholds
from slogate_sim.limits import CountCap

Key = Hashable
"""The simulator's handle on a request (fronts never look inside it)."""
_DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the request to the server, generating at most ``output_tokens``."""

    key: Key
    output_tokens: int
    decision: Decision | None = None
    """slogate's admitting decision (None for fronts that decide nothing)."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer at once: no capacity (a 429 or 503)."""

    key: Key
    decision: Decision | None = None
    """slogate's refusing decision: reasons and Retry-After."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep the request in front until an event forwards or refuses it, or ``deadline``."""

    key: Key
    deadline: float = math.inf
    decision: Decision | None = None


Answer = Forward | Refuse | Hold


class Front(Protocol):
    """The events a front hears; each returns what became of the requests it concerns."""

    def arrive(self, key: Key, request: Request, now: float) -> Answer:
        """A request arrives: the core's ``Request`` (its prompt, booked output, class and
        tenant), as the sidecar builds it from the HTTP request."""
        ...

    def first_token(self, key: Key, now: float) -> list[Forward | Refuse]:
        """A forwarded request's first token came."""
        ...

    def ended(self, key: Key, now: float, output_tokens: int | None = None) -> list[Forward | Refuse]:
        """A forwarded request ended: completed, or its client left; ``output_tokens``: what
        it generated (None: unknown)."""
        ...

    def left(self, key: Key, now: float) -> list[Forward | Refuse]:
        """A held request's client left."""
        ...

    def deadline(self, key: Key, now: float) -> list[Forward | Refuse]:
        """A held request's deadline came."""
        ...

    def pressure(self) -> float:
        """How pressed it is now, for a router that sees every front (``least-pressure``): the pod
        with the least is sent the next request."""
        ...


class _Holdless:
    """A front that decides at arrival and never holds: every later event is nothing to it."""

    __slots__ = ()

    def first_token(self, key: Key, now: float) -> list[Forward | Refuse]:
        """Nothing to do."""
        return []

    def ended(self, key: Key, now: float, output_tokens: int | None = None) -> list[Forward | Refuse]:
        """Nothing to do."""
        return []

    def left(self, key: Key, now: float) -> list[Forward | Refuse]:
        """Never holds anything."""
        return []

    def deadline(self, key: Key, now: float) -> list[Forward | Refuse]:
        """Never holds anything."""
        return []


class DirectFront(_Holdless):
    """llama-server alone."""

    __slots__ = ("inside",)

    def __init__(self) -> None:
        self.inside = 0

    def arrive(self, key: Key, request: Request, now: float) -> Answer:
        """Everything goes in."""
        self.inside += 1
        return Forward(key, request.output_tokens)

    def ended(self, key: Key, now: float, output_tokens: int | None = None) -> list[Forward | Refuse]:
        """One fewer inside."""
        self.inside -= 1
        return []

    def pressure(self) -> float:
        """Requests in llama-server (join the shortest queue)."""
        return float(self.inside)


@dataclass(slots=True, eq=False)
class CountCapFront:
    """A fixed concurrency with a FIFO in front: the baseline a careful operator configures."""

    cap: CountCap
    in_flight: set[Key] = field(default_factory=set)
    held: deque[tuple[Key, int]] = field(default_factory=deque)

    def arrive(self, key: Key, request: Request, now: float) -> Answer:
        """Forward while under the cap, hold while the queue has room, else refuse (tenants
        are not told apart)."""
        if len(self.in_flight) < self.cap.concurrency:
            self.in_flight.add(key)
            return Forward(key, request.output_tokens)
        if len(self.held) < self.cap.queue:
            self.held.append((key, request.output_tokens))
            return Hold(key)
        return Refuse(key)

    def first_token(self, key: Key, now: float) -> list[Forward | Refuse]:
        """A count cap does not see first tokens."""
        return []

    def ended(self, key: Key, now: float, output_tokens: int | None = None) -> list[Forward | Refuse]:
        """Its place goes to the head of the queue."""
        if key not in self.in_flight:
            return []
        self.in_flight.discard(key)
        if not self.held:
            return []
        nxt, output_tokens = self.held.popleft()
        self.in_flight.add(nxt)
        return [Forward(nxt, output_tokens)]

    def left(self, key: Key, now: float) -> list[Forward | Refuse]:
        """Out of the queue."""
        for i, (held, _) in enumerate(self.held):
            if held == key:
                del self.held[i]
                break
        return []

    def deadline(self, key: Key, now: float) -> list[Forward | Refuse]:
        """Its queue has no deadline."""
        return []

    def pressure(self) -> float:
        """Requests forwarded and queued: a pod under its cap has fewer than ``concurrency``."""
        return float(len(self.in_flight) + len(self.held))


class SlogateFront:
    """The GateMachine: every arrival of the default class, the calibrated prefill rate."""

    def __init__(self, thresholds: Thresholds) -> None:
        self.machine = GateMachine()
        self._tickets: dict[Key, Ticket] = {}
        self._waiters: dict[Key, Waiter] = {}
        self._keys: dict[Waiter, Key] = {}
        self._streams_cap = 0
        self._seconds_per_token = 0.0
        self.swap(thresholds, 0.0)

    def swap(self, thresholds: Thresholds, now: float) -> list[Forward | Refuse]:
        """New thresholds in force (as pushed to a sidecar); waiters are judged again."""
        self.thresholds = thresholds
        resolutions = self.machine.load(thresholds, now)
        config = self.machine.config
        self._streams_cap = min(config.decode_streams_cap, config.limits_for(None).concurrency_cap)
        self._seconds_per_token = 1.0 / config.prefill_tokens_per_s
        return self._answers(resolutions)

    def arrive(self, key: Key, request: Request, now: float) -> Answer:
        """Admit, defer (held until its deadline at the latest) or reject; the default class
        unless the request names one (a trace's ``Traced.class_name``). Its tenant counts only
        when the thresholds carry a tenant policy (the machine's ``tenants``)."""
        verdict = self.machine.arrive(request, now)
        if verdict.ticket is not None:
            return self._forward(key, verdict.ticket, verdict.decision)
        if verdict.waiter is not None:
            self._waiters[key] = verdict.waiter
            self._keys[verdict.waiter] = key
            return Hold(key, verdict.waiter.deadline, verdict.decision)
        return Refuse(key, verdict.decision)

    def first_token(self, key: Key, now: float) -> list[Forward | Refuse]:
        """The prompt left the queue: waiters may now fit."""
        ticket = self._tickets.get(key)
        return self._answers(self.machine.first_token(ticket, now)) if ticket is not None else []

    def ended(self, key: Key, now: float, output_tokens: int | None = None) -> list[Forward | Refuse]:
        """Its slot and KV return: waiters may now fit. ``output_tokens`` corrects what its
        tenant was charged (the booked n_out) to what it generated."""
        ticket = self._tickets.pop(key, None)
        if ticket is None:
            return []
        return self._answers(self.machine.release(ticket, now, output_tokens=output_tokens))

    def left(self, key: Key, now: float) -> list[Forward | Refuse]:
        """Out of the deferral queue."""
        waiter = self._waiters.pop(key, None)
        if waiter is not None:
            del self._keys[waiter]
            self.machine.cancel(waiter)
        return []

    def deadline(self, key: Key, now: float) -> list[Forward | Refuse]:
        """Judged a last time: admitted if it fits by now, else refused."""
        waiter = self._waiters.get(key)
        if waiter is None:
            return []
        expired = self.machine.expire(waiter, now)
        return self._answers([expired]) if expired is not None else []

    def pressure(self) -> float:
        """The predicted queue wait (queued prompt tokens at the calibrated rate), plus a day
        if no stream is free or requests are deferred: any pod that can admit comes first."""
        ledger = self.machine.ledger
        wait = ledger.queued_prefill_tokens * self._seconds_per_token
        if ledger.streams >= self._streams_cap or self.machine.queue:
            wait += _DAY_S
        return wait

    def _answers(self, resolutions: list[Resolution]) -> list[Forward | Refuse]:
        answers: list[Forward | Refuse] = []
        for r in resolutions:
            key = self._keys.pop(r.waiter)
            del self._waiters[key]
            if r.ticket is not None:
                answers.append(self._forward(key, r.ticket, r.decision))
            else:
                answers.append(Refuse(key, r.decision))
        return answers

    def _forward(self, key: Key, ticket: Ticket, decision: Decision) -> Forward:
        self._tickets[key] = ticket
        return Forward(key, ticket.output_tokens, decision)


@dataclass(slots=True, eq=False)
class PlannedFront(_Holdless):
    """An admission plan fixed in advance: arrivals are told apart by their order."""

    admit: frozenset[int]
    arrived: int = 0

    def pressure(self) -> float:
        """A plan for one server's trace: never routed among others."""
        return 0.0

    def arrive(self, key: Key, request: Request, now: float) -> Answer:
        """Forward the planned arrivals in full, refuse the others."""
        n, self.arrived = self.arrived, self.arrived + 1
        return Forward(key, request.output_tokens) if n in self.admit else Refuse(key)


@dataclass(frozen=True, slots=True)
class Direct:
    """llama-server alone."""

    name: str = "direct"

    def build(self) -> Front:
        """A fresh front for one run."""
        return DirectFront()


@dataclass(frozen=True, slots=True)
class CountCapped:
    """A count cap in front."""

    cap: CountCap
    name: str = "count-cap"

    def build(self) -> Front:
        """A fresh front for one run."""
        return CountCapFront(self.cap)


@dataclass(frozen=True, slots=True)
class Gated:
    """slogate in front, with these thresholds."""

    thresholds: Thresholds
    name: str = "slogate"

    def build(self) -> Front:
        """A fresh front for one run (an empty GateMachine)."""
        return SlogateFront(self.thresholds)


@dataclass(frozen=True, slots=True)
class Planned:
    """Forward exactly the arrivals whose 0-based index (in arrival order) is in ``admit``.

    Only meaningful on a trace, whose arrivals are known: the clairvoyant bound's plan.
    """

    admit: frozenset[int]
    name: str = "clairvoyant"

    def build(self) -> Front:
        """A fresh front for one run."""
        return PlannedFront(self.admit)


FrontSpec = Direct | CountCapped | Gated | Planned
"""Which front a simulated run puts before llama-server."""


def line_up(thresholds: Thresholds, cap: CountCap) -> dict[str, FrontSpec]:
    """Every front by its name, tuned from one calibration: what `slogate simulate` compares."""
    return {"direct": Direct(), "slogate": Gated(thresholds), "count-cap": CountCapped(cap)}
