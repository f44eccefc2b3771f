"""The gate as one synchronous state machine: no asyncio, no I/O, time passed in.

Ledger, deferral queue and thresholds in one object; every event (an arrival, a first
token, a release, a deadline, a client leaving, new thresholds) is a method that returns
what happened, for the caller to carry out. The sidecar maps those results onto futures
and timers (``slogate_sidecar.gate``); the simulator drives the very same object in
virtual time (``slogate_bench.simulator``). So both run one gate, by construction.

Spec: "admit(r) ⇔ TTFT(r) ≤ TTFT_SLO and free_KV ≥ KV_reserved(r)" (``decision.decide``)
applied to exact live accounting (``ledger``), with deferral as the spec's first "degree
of no" (``deferral_queue``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from slogate_admission.decision import Decision, GateConfig, LiveState, Outcome, Request, decide
from slogate_admission.deferral_queue import DeferralQueue, Waiter
from slogate_admission.ledger import Ledger, Ticket
from slogate_admission.schema import Thresholds
from slogate_admission.ttft_error import TtftErrorModel

RateSource = Callable[[float], float | None]
"""Given ``now``, the measured prefill rate if fresh, or None: then the calibrated one."""


class GateNotReady(RuntimeError):  # noqa: N818 - a state, named as one
    """No thresholds are loaded: the gate cannot decide."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the gate did with an arrival."""

    decision: Decision
    ticket: Ticket | None = None
    """Admitted: its claims on the server, to report first token and end against."""
    waiter: Waiter | None = None
    """Deferred: its place in the queue, until ``deadline`` or a wake-up resolves it."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """A deferred request's end: admitted (with a ticket) or refused (without)."""

    waiter: Waiter
    decision: Decision
    ticket: Ticket | None


class GateMachine:
    """Decides, books and defers; one per gate (one per sidecar, one per simulated server)."""

    def __init__(self, prefill_rate: RateSource | None = None) -> None:
        self.prefill_rate: RateSource = prefill_rate or (lambda _now: None)
        self.errors: TtftErrorModel | None = None
        """What first tokens taught of the TTFT prediction's error (``ttft_error``): the
        prefill rate in use, live or calibrated, is divided by the bias at the streams in
        service, and each class admits against its margin for the SLO's quantile."""
        self.ledger = Ledger()
        self.queue = DeferralQueue()
        self.thresholds: Thresholds | None = None
        self._config: GateConfig | None = None
        self._ranks: dict[str, int] = {}

    @property
    def ready(self) -> bool:
        """Thresholds are loaded."""
        return self._config is not None

    @property
    def config(self) -> GateConfig:
        """The compiled thresholds; raises GateNotReady before the first load."""
        if self._config is None:
            raise GateNotReady("no thresholds loaded")
        return self._config

    @property
    def deferred(self) -> int:
        """Requests waiting in the deferral queue."""
        return len(self.queue)

    def accounting(self, now: float) -> LiveState:
        """The books as /state and the metrics show them: every deferred request counted."""
        return self.ledger.snapshot(now, None, self.deferred)

    def is_idle(self) -> bool:
        """Nothing queued, decoding, reserved or deferred."""
        return self.ledger.is_idle() and not self.queue

    # ------------------------------------------------------------------ events

    def load(self, thresholds: Thresholds, now: float) -> list[Resolution]:
        """Swap in new thresholds whole; waiters are judged again under them.

        What was learned of the prediction's error is kept while it still describes the
        same server (calibration), quantile and slots; otherwise it starts afresh."""
        old = self.thresholds
        if (
            self.errors is None
            or old is None
            or (old.calibration_id, old.ttft_quantile, old.concurrency_cap)
            != (thresholds.calibration_id, thresholds.ttft_quantile, thresholds.concurrency_cap)
        ):
            self.errors = TtftErrorModel.fresh(
                thresholds.ttft_quantile, thresholds.ttft_margin_prior, thresholds.concurrency_cap
            )
        self._config = GateConfig.from_thresholds(thresholds)
        self._ranks = {c.name: rank for rank, c in enumerate(thresholds.classes)}
        self.thresholds = thresholds
        return self._wake(now)

    def arrive(self, request: Request, now: float) -> Verdict:
        """Judge an arrival: admit (book a ticket), defer (queue a waiter) or reject."""
        decision = self.decide(request, now)
        if decision.outcome is Outcome.ADMIT:
            return Verdict(decision, ticket=self._admit(decision, request, now))
        if decision.outcome is Outcome.REJECT:
            return Verdict(decision)
        rank = self._ranks.get(decision.class_name, len(self._ranks))
        waiter = Waiter(rank, request, now, now + decision.max_wait_s, decision)
        self.queue.push(waiter)
        return Verdict(decision, waiter=waiter)

    def first_token(self, ticket: Ticket, now: float) -> list[Resolution]:
        """The request's first token came: its prompt left the prefill queue, and its
        prediction is judged (``ttft_error``)."""
        if not self.ledger.first_token(ticket):
            return []
        if self.errors is not None and self._config is not None:
            slo = self._config.limits_for(ticket.class_name).ttft_slo_s
            self.errors.observe(
                ticket.class_name, slo, ticket.streams_before, ticket.predicted_remaining_s, now - ticket.admitted_at
            )
        return self._wake(now)

    def release(self, ticket: Ticket, now: float) -> list[Resolution]:
        """The request ended, however it ended: its slot and KV return."""
        return self._wake(now) if self.ledger.release(ticket) else []

    def expire(self, waiter: Waiter, now: float) -> Resolution | None:
        """The waiter's deadline passed: judged once more, admitted if it fits now, else
        refused (the final decision says why). None if it had already left the queue."""
        if waiter not in self.queue:
            return None
        decision = self._judge(waiter, now)
        self._dequeue(waiter)
        if decision.outcome is Outcome.ADMIT:
            return Resolution(waiter, decision, self._admit(decision, waiter.request, now))
        return Resolution(waiter, decision._replace(outcome=Outcome.REJECT), None)

    def cancel(self, waiter: Waiter) -> bool:
        """The waiter's client left. True if it was still queued."""
        return self._dequeue(waiter)

    # ------------------------------------------------------------------ judging

    def decide(self, request: Request, now: float, deferred_ahead: int | None = None) -> Decision:
        """The core's decision on the live state at ``now``, booking nothing.

        ``deferred_ahead``: the waiters it would queue behind; None: an arrival's (the
        waiters of its class and above).
        """
        config, errors = self.config, self.errors
        assert errors is not None  # loaded with the thresholds, as the config is
        class_name = config.limits_for(request.class_name).name
        if deferred_ahead is None:
            deferred_ahead = self.queue.count_at_or_above(self._ranks.get(class_name, len(self._ranks)))
        live = self.prefill_rate(now)
        rate = (live if live is not None else config.prefill_tokens_per_s) / errors.bias.factor(self.ledger.streams)
        state = self.ledger.snapshot(now, rate, deferred_ahead, errors.margin(class_name))
        return decide(config, request, state, now)

    def _judge(self, waiter: Waiter, now: float) -> Decision:
        """A waiter's decision now: its wait so far counts against its TTFT."""
        request = dataclasses.replace(waiter.request, waited_s=now - waiter.arrived_at)
        return self.decide(request, now, self.queue.count_ahead_of(waiter))

    def _wake(self, now: float) -> list[Resolution]:
        """Judge waiters in priority order; stop at the first that must still wait."""
        if self._config is None:
            return []
        resolved: list[Resolution] = []
        for waiter in self.queue.in_priority_order():
            decision = self._judge(waiter, now)
            if decision.outcome is Outcome.DEFER:
                break
            self._dequeue(waiter)
            ticket = self._admit(decision, waiter.request, now) if decision.outcome is Outcome.ADMIT else None
            resolved.append(Resolution(waiter, decision, ticket))
        return resolved

    def _admit(self, decision: Decision, request: Request, now: float) -> Ticket:
        decode_s = decision.output_tokens * self.config.decode.seconds_per_token(decision.streams_after)
        return self.ledger.admit(decision, request.prompt_tokens, now, decode_s)

    def _dequeue(self, waiter: Waiter) -> bool:
        return self.queue.remove(waiter)
