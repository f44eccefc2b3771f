"""The gate's live accounting: what is queued, decoding and reserved, exactly.

llama-server exposes no KV occupancy and its gauges reset on every scrape, so the
gate keeps its own books. Every admitted request holds a Ticket; its prompt tokens
leave the queue at its first token, and its stream slot and KV reservation are
returned when it ends, however it ends (completion, upstream error, client
disconnect). Both steps are idempotent, so a double release can never drive a
counter negative, and after any load with nothing in flight every counter is zero.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from slogate_admission.decision import Decision, LiveState


@dataclass(slots=True, eq=False)
class Ticket:
    """One admitted request's claims on the server."""

    class_name: str
    prompt_tokens: int
    kv_tokens: int
    output_tokens: int
    predicted_ttft_s: float
    predicted_remaining_s: float
    """From the admission to the first token, as predicted (queue wait + own prefill, the
    bias in force): what ``ttft_error`` judges the actual time against."""
    streams_before: int
    """Streams in service when it was admitted: the load its prediction was made under."""
    admitted_at: float
    expected_end: float
    """Estimated monotonic time at which it finishes (frees a slot and its KV)."""
    queued: bool = True
    """Its prompt still waits for (or is in) prefill: it counts in the queued tokens."""
    active: bool = True
    """It still holds a stream slot and its KV reservation."""
    account: Any = None
    """Its tenant's account (``tenant_shares.Account``); None without tenants."""


@dataclass(slots=True)
class Ledger:
    """Counters of the requests inside; mutated by one caller at a time (no locks)."""

    queued_prefill_tokens: int = 0
    streams: int = 0
    reserved_kv_tokens: int = 0
    _tickets: set[Ticket] = field(default_factory=set)

    def admit(self, decision: Decision, prompt_tokens: int, now: float, decode_s: float, account: Any = None) -> Ticket:
        """Book an admitted request. ``decode_s``: its expected decode time after TTFT;
        ``account``: its tenant's, when tenants are told apart."""
        ticket = Ticket(
            class_name=decision.class_name,
            prompt_tokens=prompt_tokens,
            kv_tokens=decision.kv_needed_tokens,
            output_tokens=decision.output_tokens,
            predicted_ttft_s=decision.predicted_ttft_s,
            predicted_remaining_s=decision.queue_wait_s + decision.own_prefill_s,
            streams_before=decision.streams_after - 1,
            admitted_at=now,
            expected_end=now + decision.predicted_ttft_s + decode_s,
            account=account,
        )
        self.queued_prefill_tokens += prompt_tokens
        self.streams += 1
        self.reserved_kv_tokens += ticket.kv_tokens
        self._tickets.add(ticket)
        return ticket

    def first_token(self, ticket: Ticket) -> bool:
        """The prompt is prefilled: its tokens leave the queue. True the first time only."""
        if not ticket.queued:
            return False
        ticket.queued = False
        self.queued_prefill_tokens -= ticket.prompt_tokens
        return True

    def release(self, ticket: Ticket) -> bool:
        """The request ended: return everything it held. True the first time only."""
        if not ticket.active:
            return False
        self.first_token(ticket)
        ticket.active = False
        self.streams -= 1
        self.reserved_kv_tokens -= ticket.kv_tokens
        self._tickets.discard(ticket)
        return True

    def reprice(self, now: float, decode_factor: float, stall_s: float = 0.0) -> None:
        """Move every expected end for a change of load: the rest of each request's time
        scaled by ``decode_factor`` (t_decode at the new stream count over the old), plus
        ``stall_s`` (a new prompt's prefill, which stalls every stream in service). O(cap)."""
        for ticket in self._tickets:
            ticket.expected_end = now + max(ticket.expected_end - now, 0.0) * decode_factor + stall_s

    def next_release_s(self, now: float) -> float:
        """Seconds until the soonest admitted request should finish (0 if none is inside).

        A min over at most concurrency-cap tickets: bounded, so O(1) per decision.
        """
        if not self._tickets:
            return 0.0
        return max(min(t.expected_end for t in self._tickets) - now, 0.0)

    def release_in_s(self, now: float, n: int) -> float:
        """Seconds until the ``n``-th soonest admitted request should finish: 0 for ``n`` ≤ 0,
        ``inf`` beyond the requests inside. O(k log n) over at most concurrency-cap tickets."""
        if n <= 0:
            return 0.0
        if n > len(self._tickets):
            return math.inf
        return max(heapq.nsmallest(n, (t.expected_end for t in self._tickets))[-1] - now, 0.0)

    def snapshot(
        self,
        now: float,
        prefill_tokens_per_s: float | None,
        deferred: int,
        ttft_margin: float = 1.0,
        slot_wait_s: float = 0.0,
    ) -> LiveState:
        """The live state the core's decide() reads. ``deferred``: the deferred requests the
        one being judged would wait behind (the queue is the gate's, not the ledger's);
        ``ttft_margin``: its class's (``ttft_error``); ``slot_wait_s``: when a slot frees for it
        (``release_in_s``)."""
        return LiveState(
            queued_prefill_tokens=float(self.queued_prefill_tokens),
            streams=self.streams,
            reserved_kv_tokens=self.reserved_kv_tokens,
            deferred=deferred,
            prefill_tokens_per_s=prefill_tokens_per_s,
            next_release_s=self.next_release_s(now),
            slot_wait_s=slot_wait_s,
            ttft_margin=ttft_margin,
        )

    def is_idle(self) -> bool:
        """Nothing queued, decoding or reserved."""
        return (
            self.queued_prefill_tokens == 0 and self.streams == 0 and self.reserved_kv_tokens == 0 and not self._tickets
        )
