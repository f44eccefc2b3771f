"""The bounded wait queue of deferred requests, in priority order.

A deferred request waits for capacity (a stream ending, a first token draining the
queue, new thresholds) instead of being rejected at once. Waiters are woken by
those events, never by a polling loop, and in strict priority order: the highest
class first, then arrival order. A waiter that still does not fit stops the scan,
so a large request is not starved by a stream of small ones behind it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from slogate_admission.decision import Decision, Request
from slogate_sidecar.ledger import Ticket


@dataclass(slots=True, eq=False)
class Waiter:
    """One deferred request."""

    rank: int
    """Its class's position, 0 = highest priority."""
    request: Request
    arrived_at: float
    outcome: asyncio.Future[tuple[Decision, Ticket | None]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    """Set once: the admitting decision and its Ticket, or a rejecting decision and None."""


class DeferralQueue:
    """Waiters by rank, FIFO within a rank. Class counts are small, so a scan is cheap."""

    def __init__(self) -> None:
        self._by_rank: dict[int, deque[Waiter]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_rank.values())

    def push(self, waiter: Waiter) -> None:
        """Enqueue behind waiters of the same rank."""
        self._by_rank.setdefault(waiter.rank, deque()).append(waiter)

    def remove(self, waiter: Waiter) -> None:
        """Dequeue (it was admitted, timed out or its client left); no-op if absent."""
        queue = self._by_rank.get(waiter.rank)
        if queue is not None and waiter in queue:
            queue.remove(waiter)

    def in_priority_order(self) -> Iterator[Waiter]:
        """Highest rank first, then arrival order (a snapshot: safe to remove while iterating)."""
        for rank in sorted(self._by_rank):
            yield from list(self._by_rank[rank])
