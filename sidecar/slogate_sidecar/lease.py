"""An admitted request's hold on the gate, and the outcomes the proxy reports to it.

As in Netflix's concurrency-limits, the limiter hands out a listener and the integration
reports what became of the request; here three outcomes: the first token, completion
(with llama-server's usage) and abandonment (the client left, the upstream failed). The
gate's books follow them (the prompt leaves the queue at the first token; the slot and KV
return at the end), and the learners subscribed to the gate hear each one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from slogate_admission.decision import Decision
from slogate_admission.ledger import Ticket
from slogate_llama.routes import Route


@dataclass(frozen=True, slots=True)
class Origin:
    """What the proxy knew of the request when it asked the gate: for the learners."""

    route: Route
    estimated_prompt_tokens: int
    """n_in from characters x the calibrated tokens per character."""
    counted_prompt_tokens: int
    """n_in the gate decided with (counted by llama-server, or the estimate)."""
    prompt_given_as_tokens: bool
    """The prompt was token ids: n_in was exact, there is no count error to learn."""


@dataclass(frozen=True, slots=True)
class Usage:
    """llama-server's own account of a finished request; None where it did not say."""

    prompt_tokens: int | None
    completion_tokens: int | None


class Learner(Protocol):
    """Hears every lease's outcomes (subscribed to the gate)."""

    def first_token(self, lease: Lease) -> None:
        """The first token came (``lease.ttft_s`` is set)."""

    def completed(self, lease: Lease, usage: Usage) -> None:
        """The request finished and llama-server said how many tokens it took."""

    def abandoned(self, lease: Lease) -> None:
        """The request ended without completing: client gone, upstream failed."""


@dataclass(slots=True, eq=False)
class Lease:
    """One admitted request: report its first token once, then complete or abandon it once."""

    ticket: Ticket
    decision: Decision
    """The admitting decision: class, predicted TTFT, n_out reserved."""
    ttft_slo_s: float
    """Its class's TTFT SLO when it was admitted."""
    origin: Origin
    arrived_at: float
    """When the request arrived (monotonic), before counting its prompt: TTFT runs from here."""
    clock: Callable[[], float]
    learners: Sequence[Learner]
    on_first_token: Callable[[Ticket], None]
    on_end: Callable[[Ticket, int | None], None]
    """Called once at the end with the output tokens llama-server reported, None if unknown."""
    ttft_s: float | None = None
    """Arrival to first token; None until it comes."""
    ended: bool = field(default=False)

    def first_token(self) -> None:
        """The first token reached the proxy. Repeats are ignored."""
        if self.ttft_s is not None or self.ended:
            return
        self.ttft_s = self.clock() - self.arrived_at
        self.on_first_token(self.ticket)
        for learner in self.learners:
            learner.first_token(self)

    def complete(self, usage: Usage) -> None:
        """The request finished; ``usage`` is llama-server's count. Ends the lease."""
        if self._end(usage.completion_tokens):
            for learner in self.learners:
                learner.completed(self, usage)

    def abandon(self) -> None:
        """The request ended any other way. Ends the lease; a no-op after ``complete``."""
        if self._end(None):
            for learner in self.learners:
                learner.abandoned(self)

    def _end(self, output_tokens: int | None) -> bool:
        if self.ended:
            return False
        self.ended = True
        self.on_end(self.ticket, output_tokens)
        return True
