"""The deferred requests, in priority order: the highest class first, then arrival order.

A deferred request waits for capacity (a stream ending, a first token draining the
queue, new thresholds) instead of being rejected at once. It is judged again on those
events, never by polling, and in strict priority order; a waiter that still does not
fit stops the scan, so a large request is not starved by a stream of small ones behind it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from slogate_admission.decision import Decision, Request


@dataclass(slots=True, eq=False)
class Waiter:
    """One deferred request."""

    rank: int
    """Its class's position, 0 = highest priority."""
    request: Request
    arrived_at: float
    deadline: float
    """When its wait runs out (``arrived_at`` + the deferral's max wait): then it is refused."""
    first: Decision
    """The arrival's decision (outcome DEFER)."""


class DeferralQueue:
    """Waiters by rank, FIFO within a rank. Class counts are small, so a scan is cheap."""

    def __init__(self) -> None:
        self._by_rank: dict[int, deque[Waiter]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_rank.values())

    def __contains__(self, waiter: object) -> bool:
        return isinstance(waiter, Waiter) and waiter in self._by_rank.get(waiter.rank, ())

    def push(self, waiter: Waiter) -> None:
        """Enqueue behind waiters of the same rank."""
        self._by_rank.setdefault(waiter.rank, deque()).append(waiter)

    def remove(self, waiter: Waiter) -> bool:
        """Dequeue (admitted, refused, timed out or its client left). True if it was queued."""
        queue = self._by_rank.get(waiter.rank)
        if queue is None or waiter not in queue:
            return False
        queue.remove(waiter)
        return True

    def count_at_or_above(self, rank: int) -> int:
        """Waiters an arrival of ``rank`` would queue behind: its rank and higher."""
        return sum(len(q) for r, q in self._by_rank.items() if r <= rank)

    def count_ahead_of(self, waiter: Waiter) -> int:
        """Waiters served before ``waiter``: higher ranks, then earlier arrivals of its own."""
        own = self._by_rank.get(waiter.rank, deque())
        before = own.index(waiter) if waiter in own else len(own)
        return before + sum(len(q) for r, q in self._by_rank.items() if r < waiter.rank)

    def in_priority_order(self) -> Iterator[Waiter]:
        """Highest rank first, then arrival order (a snapshot: safe to remove while iterating)."""
        for rank in sorted(self._by_rank):
            yield from list(self._by_rank[rank])
