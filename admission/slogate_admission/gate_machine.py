"""The gate as one synchronous state machine: no asyncio, no I/O, time passed in.

Ledger, deferral queue and thresholds in one object; every event (an arrival, a first
token, a release, a deadline, a client leaving, new thresholds) is a method that returns
what happened, for the caller to carry out. The sidecar maps those results onto futures
and timers (``slogate_sidecar.gate``); the simulator drives the very same object in
virtual time (``slogate_sim.engine``). So both run one gate, by construction.

Spec: "admit(r) ⇔ TTFT(r) ≤ TTFT_SLO and free_KV ≥ KV_reserved(r)" (``decision.decide``)
applied to exact live accounting (``ledger``), with deferral as the spec's first "degree
of no" (``deferral_queue``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from slogate_admission.cost_book import CostBook, bucket_of
from slogate_admission.decision import (
    Decision,
    GateConfig,
    LiveState,
    Outcome,
    Reason,
    Request,
    decide,
    own_limits,
    wait_slack_s,
)
from slogate_admission.deferral_queue import DeferralQueue, Waiter, arrival_order
from slogate_admission.ledger import Ledger, Ticket
from slogate_admission.schema import Thresholds
from slogate_admission.tenant_shares import Account, TenantShares, share_retry_after_s
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
        self.tenants: TenantShares | None = None
        """The books by tenant, when the thresholds carry a tenant policy (``tenant_shares``)."""
        self.costs = CostBook()
        """What recent arrivals cost (``cost_book``): the cost order's judge, and every
        arrival's cost quartile for the metrics, whichever the order."""
        self.thresholds: Thresholds | None = None
        self._config: GateConfig | None = None
        self._ranks: dict[str, int] = {}
        self._by_cost = False

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
        self._by_cost = thresholds.shedding_order == "cost"
        if thresholds.tenants is None:
            self.tenants = None
        elif self.tenants is None:
            self.tenants = TenantShares(thresholds.tenants, now)
        else:
            self.tenants.reconfigure(thresholds.tenants, now)
        self.queue.priority = self.tenants.priority if self.tenants is not None else arrival_order
        self.thresholds = thresholds
        return self._wake(now)

    def arrive(self, request: Request, now: float) -> Verdict:
        """Judge an arrival: admit (book a ticket), defer (queue a waiter) or reject."""
        account = self._arrival(request, now)
        # Its cost, bucketed once: the cost order reads it, the metrics count by its quartile.
        cost = self.config.request_cost_s(request.prompt_tokens, request.output_tokens)
        bucket = bucket_of(cost)
        costs = self.costs.summary(now)
        costly = self._by_cost and costs.costly_at(bucket)
        quartile = costs.quartile_of(bucket) + 1 if costs.warm else None
        decision = self.decide(request, now, account=account, costly=costly, cost_quartile=quartile)
        if decision.fits_ever:
            if costly:
                decision = self._hold_back(decision, request, now)
            self.costs.observe(cost, decision.outcome is not Outcome.REJECT, now, bucket)
        if decision.outcome is Outcome.ADMIT:
            return Verdict(decision, ticket=self._admit(decision, request, now, account))
        if decision.outcome is Outcome.REJECT:
            self._refused(account, request, decision)
            return Verdict(decision)
        rank = self._rank(decision.class_name, decision.costly)
        waiter = Waiter(rank, request, now, now + decision.max_wait_s, decision, account)
        self.queue.push(waiter)
        if self.tenants is not None and account is not None:
            self.tenants.hold(account, decision.class_name, request.prompt_tokens)
        return Verdict(decision, waiter=waiter)

    def _hold_back(self, decision: Decision, request: Request, now: float) -> Decision:
        """The cost order on a costly arrival (``cost_book``): admitted into one of the last
        ``cost_reserve_slots`` slots, it is deferred instead, for as long as a deferral of it
        may wait; waiting, it sits behind the cheap waiters of its class. A cheap arrival may
        take the slot meanwhile; at its deadline it takes one that is still free."""
        if decision.outcome is Outcome.DEFER:
            return decision._replace(costly=True)
        if decision.outcome is not Outcome.ADMIT:
            return decision
        assert self.thresholds is not None
        assert self.errors is not None
        if self.ledger.streams + 1 <= decision.concurrency_cap - self.thresholds.cost_reserve_slots:
            return decision
        # As long as a deferral of it may wait (decide's bound).
        limits = own_limits(self.config, request)
        slack = wait_slack_s(
            self.config, limits, request, self.errors.margin(decision.class_name), decision.own_prefill_s
        )
        if slack <= 0:
            return decision
        return decision._replace(
            outcome=Outcome.DEFER, reasons=(Reason.COST,), max_wait_s=slack, defer_deadline=now + slack, costly=True
        )

    def precheck(self, request: Request, now: float, counted_as: int) -> Decision:
        """An arrival judged before its prompt is counted, on ``request`` without its prompt
        tokens: they only make matters worse, so a refusal here is final (the sidecar then
        spares llama-server the /tokenize call). Books nothing but what an arrival books of
        its tenant: active from now, and a refusal counted at ``counted_as`` prompt tokens
        (the estimate it is known by). One that passes comes back through ``arrive``."""
        account = self._arrival(request, now)
        decision = self.decide(request, now, account=account)
        if decision.outcome is Outcome.REJECT:
            self._refused(account, dataclasses.replace(request, prompt_tokens=counted_as), decision)
        return decision

    def _arrival(self, request: Request, now: float) -> Account | None:
        """Its tenant's account, active in its class from now; None without tenants."""
        if self.tenants is None:
            return None
        account = self.tenants.account(request.tenant, now)
        self.tenants.arrived(account, self.config.limits_for(request.class_name).name, now)
        return account

    def first_token(self, ticket: Ticket, now: float) -> list[Resolution]:
        """The request's first token came: its prompt left the prefill queue, and its
        prediction is judged (``ttft_error``)."""
        if not self.ledger.first_token(ticket):
            return []
        if self.tenants is not None and ticket.account is not None:
            self.tenants.unhold(ticket.account, ticket.class_name, ticket.prompt_tokens, ended=False)
        if self.errors is not None and self._config is not None:
            slo = self._config.limits_for(ticket.class_name).ttft_slo_s
            self.errors.observe(
                ticket.class_name, slo, ticket.streams_before, ticket.predicted_remaining_s, now - ticket.admitted_at
            )
        return self._wake(now)

    def release(self, ticket: Ticket, now: float, output_tokens: int | None = None) -> list[Resolution]:
        """The request ended, however it ended: its slot and KV return. ``output_tokens``:
        what it generated, when known (its tenant was charged the booked n_out)."""
        prefilling = ticket.queued
        if not self.ledger.release(ticket):
            return []
        per_token, streams = self.config.decode.seconds_per_token, self.ledger.streams
        self.ledger.reprice(now, per_token(max(streams, 1)) / per_token(streams + 1))  # the rest speed up
        account = ticket.account
        if self.tenants is not None and account is not None:
            if prefilling:
                self.tenants.unhold(account, ticket.class_name, ticket.prompt_tokens, ended=False)
            self.tenants.ended(account, ticket.class_name)
            if output_tokens is not None:
                self.tenants.correct_output(account, ticket.output_tokens, output_tokens, now)
                self.queue.reprioritize(account)
        return self._wake(now)

    def expire(self, waiter: Waiter, now: float) -> Resolution | None:
        """The waiter's deadline passed: judged once more, admitted if it fits now, else
        refused (the final decision says why). None if it had already left the queue."""
        if waiter not in self.queue:
            return None
        decision = self._judge(waiter, now)
        self._dequeue(waiter)
        if decision.outcome is Outcome.ADMIT:
            return Resolution(waiter, decision, self._admit(decision, waiter.request, now, waiter.account))
        refusal = decision._replace(outcome=Outcome.REJECT)
        self._refused(waiter.account, waiter.request, refusal)
        return Resolution(waiter, refusal, None)

    def cancel(self, waiter: Waiter) -> bool:
        """The waiter's client left. True if it was still queued."""
        return self._dequeue(waiter)

    # ------------------------------------------------------------------ judging

    def decide(
        self,
        request: Request,
        now: float,
        deferred_ahead: int | None = None,
        account: Account | None = None,
        *,
        waiting: bool = False,
        costly: bool = False,
        cost_quartile: int | None = None,
    ) -> Decision:
        """The core's decision on the live state at ``now``, booking nothing.

        ``deferred_ahead``: the waiters it would queue behind; None: an arrival's (those of its
        class and above, as fair turns go). ``account``: its tenant's, when tenants are told
        apart: the share rule then applies (``tenant_shares``). ``waiting``: it is a deferred
        request judged again (its tokens are already in its tenant's holdings). ``costly``: an
        arrival the cost order holds back, which would queue behind its class's cheap waiters too.
        ``cost_quartile``: its quartile in the cost book, carried into the decision for the metrics.
        """
        config, errors = self.config, self.errors
        assert errors is not None  # loaded with the thresholds, as the config is
        limits = config.limits_for(request.class_name)
        class_name = limits.name
        if deferred_ahead is None:
            deferred_ahead = self.queue.count_at_or_above(self._rank(class_name, costly), account)
        live = self.prefill_rate(now)
        rate = (live if live is not None else config.prefill_tokens_per_s) / errors.bias.factor(self.ledger.streams)
        margin = errors.margin(class_name)
        # Its slot: the one that frees after those ahead of it took the free ones and theirs.
        free = min(limits.concurrency_cap, config.decode_streams_cap) - self.ledger.streams
        slot_wait = self.ledger.release_in_s(now, deferred_ahead + 1 - free)
        state = self.ledger.snapshot(now, rate, deferred_ahead, margin, slot_wait)
        decision = decide(config, request, state, now, cost_quartile)
        if account is None or self.tenants is None or not decision.fits_ever:
            return decision
        return self._share(decision, request, account, rate / margin, waiting=waiting, now=now)

    def _share(
        self, decision: Decision, request: Request, account: Account, depth_rate: float, *, waiting: bool, now: float
    ) -> Decision:
        """The tenant rule on top of ``decide``'s verdict (``tenant_shares``).

        The class's budget in queue tokens is what ``decide`` lets the queue hold, budget / m · R
        (``depth_rate`` = R / m); past its share a tenant is refused (or, deferred, waits on while
        others pass it). A tenant under its share needs no turn of its own: the deferral queue
        puts it ahead of heavier tenants (``tenant_shares.priority``), and ``decide`` lets it wait
        when the slot it would get there is expected within its slack."""
        tenants = self.tenants
        assert tenants is not None
        n = request.prompt_tokens
        budget = decision.ttft_budget_s * depth_rate
        excess = tenants.excess_tokens(account, decision.class_name, n, budget, n if waiting else 0)
        if excess <= 0:
            if waiting or decision.outcome is not Outcome.DEFER:
                return decision
            if not tenants.at_stream_share(account, decision.class_name, decision.concurrency_cap):
                return decision
            # At its share of the streams it takes a free slot, never a place in line for the
            # next one: that slot goes to whoever arrives, a lighter tenant's request as often.
            retry = max(decision.retry_after_s or 0.0, self.ledger.next_release_s(now))
            return decision._replace(outcome=Outcome.REJECT, reasons=(*decision.reasons, Reason.TENANT_SHARE),
                                     retry_after_s=retry, max_wait_s=0.0, defer_deadline=None)  # fmt: skip
        active = tenants.active_weight(decision.class_name)
        retry = max(decision.retry_after_s or 0.0, share_retry_after_s(excess, depth_rate, account.weight, active))
        reasons = (*decision.reasons, Reason.TENANT_SHARE)
        if waiting and decision.outcome is not Outcome.REJECT:
            # A deferred request over its share waits on; others pass it (``_wake``).
            return decision._replace(outcome=Outcome.DEFER, reasons=reasons, retry_after_s=retry)
        return decision._replace(
            outcome=Outcome.REJECT, reasons=reasons, retry_after_s=retry, max_wait_s=0.0, defer_deadline=None
        )

    def _rank(self, class_name: str, costly: bool) -> int:
        """A waiter's rank in the queue: by class, and within a class the cheap before the costly."""
        return 2 * self._ranks.get(class_name, len(self._ranks)) + costly

    def _judge(self, waiter: Waiter, now: float) -> Decision:
        """A waiter's decision now: its wait so far counts against its TTFT."""
        request = dataclasses.replace(waiter.request, waited_s=now - waiter.arrived_at)
        return self.decide(
            request, now, self.queue.count_ahead_of(waiter), waiter.account, waiting=True,
            cost_quartile=waiter.first.cost_quartile,
        )  # fmt: skip

    def _wake(self, now: float) -> list[Resolution]:
        """Judge waiters in priority order; stop at the first that must still wait for the
        server. One that waits only for its tenant's share is passed over, with its tenant."""
        if self._config is None:
            return []
        resolved: list[Resolution] = []
        for rank in self.queue.ranks():
            passed: set[Account | None] = set()
            while (waiter := self.queue.next_in(rank, passed)) is not None:
                decision = self._judge(waiter, now)
                if decision.outcome is Outcome.DEFER:
                    if decision.reasons == (Reason.TENANT_SHARE,):
                        passed.add(waiter.account)
                        continue
                    return resolved
                self._dequeue(waiter)
                ticket = None
                if decision.outcome is Outcome.ADMIT:
                    ticket = self._admit(decision, waiter.request, now, waiter.account)
                else:
                    self._refused(waiter.account, waiter.request, decision)
                resolved.append(Resolution(waiter, decision, ticket))
        return resolved

    def _admit(self, decision: Decision, request: Request, now: float, account: Account | None) -> Ticket:
        per_token = self.config.decode.seconds_per_token
        decode_s = decision.output_tokens * per_token(decision.streams_after)
        # The streams in service decode slower beside it and stall while its prompt prefills.
        slower = per_token(decision.streams_after) / per_token(max(self.ledger.streams, 1))
        self.ledger.reprice(now, slower, decision.own_prefill_s)
        ticket = self.ledger.admit(decision, request.prompt_tokens, now, decode_s, account)
        if self.tenants is not None and account is not None:
            self.tenants.hold(account, decision.class_name, request.prompt_tokens)
            self.tenants.started(account, decision.class_name)
            self.tenants.charge(account, request.prompt_tokens, decision.output_tokens, now)
            self.tenants.admitted(account, request.prompt_tokens)
            self.queue.reprioritize(account)
        return ticket

    def _refused(self, account: Account | None, request: Request, decision: Decision) -> None:
        if self.tenants is not None and account is not None:
            self.tenants.refused(account, request.prompt_tokens, share=Reason.TENANT_SHARE in decision.reasons)

    def _dequeue(self, waiter: Waiter) -> bool:
        removed = self.queue.remove(waiter)
        if removed and self.tenants is not None and waiter.account is not None:
            self.tenants.unhold(waiter.account, waiter.first.class_name, waiter.request.prompt_tokens, ended=True)
        return removed
