"""The deferred requests, in priority order: the highest class first, its cheap waiters before
its costly ones (under the cost order); within those the tenant served least
(``tenant_shares``), then arrival order.

A deferred request waits for capacity (a stream ending, a first token draining the
queue, new thresholds) instead of being rejected at once. It is judged again on those
events, never by polling, and in priority order; a waiter that still does not fit stops
the scan, so a large request is not starved by a stream of small ones behind it. One that
waits only for its own tenant's share is passed over with the rest of its tenant's.

Within a class the tenants with waiters sit in a heap by served tokens, kept lazily (an
entry is checked against the tenant's current count when it reaches the top, and a tenant
whose count changes is pushed afresh by ``reprioritize``): O(log tenants) per operation.
Without tenants every waiter's tenant is None: one FIFO per class, as it always was.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from slogate_admission.decision import Decision, Request


@dataclass(slots=True, eq=False)
class Waiter:
    """One deferred request."""

    rank: int
    """Its place among the ranks, 0 = served first: twice its class's position (0 = highest),
    plus one when the cost order holds it back (``Decision.costly``), so a class's cheap
    waiters go before its costly ones and every class before the classes below."""
    request: Request
    arrived_at: float
    deadline: float
    """When its wait runs out (``arrived_at`` + the deferral's max wait): then it is refused."""
    first: Decision
    """The arrival's decision (outcome DEFER)."""
    account: Any = None
    """Its tenant's account (``tenant_shares.Account``); None without tenants."""


@dataclass(slots=True)
class _Rank:
    """One class's waiters: a FIFO per tenant, and the tenants in a lazy heap by served tokens."""

    by_tenant: dict[Hashable, deque[Waiter]] = field(default_factory=dict)
    count: int = 0
    heap: list[tuple[float, int, Any]] = field(default_factory=list)
    entry: dict[Any, float] = field(default_factory=dict)
    """Tenant -> the key of its live heap entry (older entries of it are stale)."""


def arrival_order(_account: Any) -> float:
    """The order without tenants: every tenant ties, so waiters leave as they came."""
    return 0.0


class DeferralQueue:
    """Waiters by rank, by tenant within a rank, FIFO within a tenant."""

    def __init__(self) -> None:
        self._ranks: dict[int, _Rank] = {}
        self._seq = itertools.count()
        self.priority: Callable[[Any], float] = arrival_order
        """A tenant's order within its class, smallest first (its served tokens)."""

    def __len__(self) -> int:
        return sum(r.count for r in self._ranks.values())

    def __contains__(self, waiter: object) -> bool:
        if not isinstance(waiter, Waiter):
            return False
        rank = self._ranks.get(waiter.rank)
        return rank is not None and waiter in rank.by_tenant.get(waiter.account, ())

    def push(self, waiter: Waiter) -> None:
        """Enqueue behind waiters of the same rank and tenant."""
        rank = self._ranks.setdefault(waiter.rank, _Rank())
        fifo = rank.by_tenant.get(waiter.account)
        if fifo is None:
            fifo = rank.by_tenant[waiter.account] = deque()
            self._enter(rank, waiter.account)
        fifo.append(waiter)
        rank.count += 1

    def remove(self, waiter: Waiter) -> bool:
        """Dequeue (admitted, refused, timed out or its client left). True if it was queued."""
        rank = self._ranks.get(waiter.rank)
        queue = rank.by_tenant.get(waiter.account) if rank is not None else None
        if rank is None or queue is None or waiter not in queue:
            return False
        queue.remove(waiter)
        rank.count -= 1
        if not queue:
            del rank.by_tenant[waiter.account]
            rank.entry.pop(waiter.account, None)
        return True

    def reprioritize(self, account: Any) -> None:
        """``account``'s served tokens changed: its place among the tenants with waiters moves."""
        for rank in self._ranks.values():
            if account in rank.by_tenant:
                self._enter(rank, account)

    def count_at_or_above(self, rank: int, account: Any = None) -> int:
        """Waiters an arrival of ``rank`` (and tenant ``account``) would queue behind: higher
        ranks, its own tenant's, and the other tenants' unless it is served least."""
        own = self._ranks.get(rank)
        ahead = self._above(rank)
        if own is None:
            return ahead
        mine = len(own.by_tenant.get(account, ()))
        return ahead + mine + self._others_first(own, account, mine)

    def count_ahead_of(self, waiter: Waiter) -> int:
        """Waiters served before ``waiter``: higher ranks, then those ahead in its own."""
        own = self._ranks.get(waiter.rank)
        ahead = self._above(waiter.rank)
        if own is None:
            return ahead
        fifo = own.by_tenant.get(waiter.account, deque())
        position = fifo.index(waiter) if waiter in fifo else len(fifo)
        return ahead + position + self._others_first(own, waiter.account, len(fifo))

    def ranks(self) -> list[int]:
        """Ranks with waiters, highest priority first."""
        return sorted(r for r, q in self._ranks.items() if q.count)

    def next_in(self, rank: int, passed: set[Any]) -> Waiter | None:
        """The head of the least served tenant in ``rank`` not ``passed`` over; None if none.

        The heap's top, O(log tenants); only when that tenant was passed over (it waits for
        its own share) a minimum over the tenants with waiters, on an event, never per arrival."""
        queues = self._ranks.get(rank)
        if queues is None:
            return None
        top = self._least_served(queues)
        if top is not None and top not in passed:
            return queues.by_tenant[top][0]
        rest = [(self.priority(a), fifo[0].arrived_at, fifo) for a, fifo in queues.by_tenant.items() if a not in passed]
        return min(rest, key=lambda r: (r[0], r[1]))[2][0] if rest else None

    def in_priority_order(self) -> Iterator[Waiter]:
        """Every waiter, highest rank first, tenants by the order they hold now (a snapshot:
        safe to remove while iterating)."""
        for rank in self.ranks():
            queues = self._ranks[rank].by_tenant
            for account in sorted(queues, key=lambda a: (self.priority(a), queues[a][0].arrived_at)):
                yield from list(queues[account])

    def _above(self, rank: int) -> int:
        return sum(q.count for r, q in self._ranks.items() if r < rank)

    def _enter(self, rank: _Rank, account: Any) -> None:
        key = self.priority(account)
        rank.entry[account] = key
        heapq.heappush(rank.heap, (key, next(self._seq), account))

    def _least_served(self, rank: _Rank) -> Any:
        """The tenant with waiters served least (ties: the one that entered first), or None."""
        heap = rank.heap
        while heap:
            key, _, account = heap[0]
            if rank.entry.get(account) != key or account not in rank.by_tenant:
                heapq.heappop(heap)  # stale: left, or pushed afresh since
                continue
            return account
        return None

    def _others_first(self, rank: _Rank, account: Any, mine: int) -> int:
        """Other tenants' waiters whose turn comes before ``account``'s: none when it is the
        least served tenant (strictly, or the heap's top), else all of them (conservative:
        the wait it needs looks longer, so decide refuses early rather than late). Without tenants: none."""
        others = rank.count - mine
        if others == 0:
            return 0
        top = self._least_served(rank)
        if top is None or top is account or self.priority(account) < self.priority(top):
            return 0
        return others
