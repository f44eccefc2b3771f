"""Fair shares between tenants within a class: the books by tenant and the share rule.

The rule (docs/tenants.md; admission-math.md, "Tenant shares"):

- **Who holds what.** A tenant holds, per class, the prompt tokens of its requests admitted
  and not yet at their first token (its part of the class's queued tokens) plus those of its
  deferred requests.
- **Share.** While more than one tenant is active in a class (it sent a request there within
  the last ``half_life_seconds``), a tenant may hold at most its weighted fair share of the
  class's token budget, share_t = budget · w_t / Σ_active w, budget = min(budget, SLO) / m · R
  (what ``decide`` lets the queue hold for that class). A tenant alone in its class is not
  limited (work-conserving: it may use the whole budget), and a tenant holding nothing may
  always send one request (a share smaller than one prompt starves nobody). Holding the
  share for a tenant that is active but momentarily holds nothing is the point: its next
  request finds the queue short enough for its SLO, however hard another tenant pushes.
- **Refusal.** An arrival that would take its tenant past its share is refused at once with
  the reason ``tenant_share``; its Retry-After is the tenant's own excess drained at its
  fair part of the prefill rate: (held + n_in − share) / (R · w_t / Σ_active w). A
  deferred request over its share waits on (others pass it) and is refused at its deadline.
- **No turn of its own.** Streams are shared by the concurrency cap, none kept idle. Every
  request, of any tenant, may wait for the slot it would get when that is expected within its
  own SLO's slack (``decision.decide``); a light tenant's slot comes sooner because it leaves
  the deferral queue first.
- **Who leaves the deferral queue first.** Within a class, the tenant with the least served
  tokens: a counter charged n_in + w_out · n_out at admission (n_out as booked, corrected
  to llama-server's count when the request ends) that halves every ``half_life_seconds``.
  ``w_out`` is measured: what a decoded token costs the server over a prefilled one
  (``derivation.tenant_thresholds``).

Every operation is O(1) or O(log tenants) (a heap of activity expiries); none loops over
requests. At most ``maxTracked`` tenants have an account; the rest share ``_other``. An
unlisted tenant idle for a half-life and holding nothing gives its account to a newcomer.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field

from slogate_admission.tenant_schema import OTHER_TENANTS, TENANT_NAME_PATTERN, TenantThresholds

__all__ = ["Account", "TenantShares", "share_excess_tokens", "share_retry_after_s"]

_VALID_NAME = re.compile(TENANT_NAME_PATTERN)


@dataclass(slots=True, eq=False)
class Account:
    """One tenant's books (or the shared account of the rest)."""

    name: str
    weight: float
    listed: bool
    """Named in the policy's weights: its account is never given away."""
    held: dict[str, int] = field(default_factory=dict)
    """Class -> prompt tokens queued (admitted, before their first token) or deferred."""
    requests_inside: int = 0
    """Its admitted requests not yet ended plus its deferred ones."""
    streams: dict[str, int] = field(default_factory=dict)
    """Class -> its admitted requests not yet ended (the streams it holds)."""
    last_arrival: float = -math.inf
    log_served: float = -math.inf
    """ln(served tokens) + λ · (now − epoch): decay never has to touch it (every account decays
    alike), so it orders accounts as their served tokens do at any instant, and in the log
    it never overflows however long the gate runs."""
    admitted_requests: int = 0
    admitted_prompt_tokens: int = 0
    refused_requests: int = 0
    refused_prompt_tokens: int = 0
    share_refusals: int = 0
    """Refusals whose reasons include ``tenant_share``."""


@dataclass(slots=True)
class _ClassActivity:
    """Who is active in one class, and the sum of their weights."""

    weight: float = 0.0
    until: dict[Account, float] = field(default_factory=dict)
    expiries: list[tuple[float, int, Account]] = field(default_factory=list)


def share_excess_tokens(held: float, prompt_tokens: int, weight: float, active_weight: float, budget: float) -> float:
    """Tokens past the tenant's share an admission would leave it holding; ≤ 0: within it.

    share = budget · w / Σ_active w. Alone (Σ_active w = w) or holding nothing, never over."""
    if held <= 0 or active_weight <= weight * (1 + 1e-12):
        return 0.0
    return held + prompt_tokens - budget * weight / active_weight


def share_retry_after_s(excess_tokens: float, rate: float, weight: float, active_weight: float) -> float:
    """Seconds until the tenant's own excess drains at its fair part of the prefill rate."""
    return excess_tokens / (rate * weight / active_weight)


class TenantShares:
    """The gate's books by tenant. Mutated by one caller at a time, with ``now`` passed in."""

    def __init__(self, policy: TenantThresholds, now: float) -> None:
        self.policy = policy
        self._decay = math.log(2) / policy.half_life_seconds
        self._epoch = now
        self.other = Account(OTHER_TENANTS, 1.0, listed=True)
        self._tracked: dict[str, Account] = {}
        self._unlisted: OrderedDict[str, Account] = OrderedDict()
        """Unlisted tracked tenants, least recently arrived first: the candidates to give way."""
        self._classes: dict[str, _ClassActivity] = {}
        self._seq = itertools.count()
        self.reconfigure(policy, now)

    # ------------------------------------------------------------------ who

    def reconfigure(self, policy: TenantThresholds, now: float) -> None:
        """New thresholds: weights and limits change, every account and its books stay (the
        served counters carried over to the new half-life at their value now)."""
        decay = math.log(2) / policy.half_life_seconds
        if decay != self._decay:
            for account in self.tracked():
                served = self.served_tokens(account, now)
                account.log_served = math.log(served) if served > 0 else -math.inf
            self._decay, self._epoch = decay, now
        self.policy = policy
        for name, account in list(self._tracked.items()):
            account.listed = name in policy.weights
            account.weight = policy.weights.get(name, 1.0)
            if not account.listed:
                self._unlisted.setdefault(name, account)
        for name, weight in policy.weights.items():
            self._tracked.setdefault(name, Account(name, weight, listed=True))
            self._unlisted.pop(name, None)
        # Fewer places than accounts (a lower maxTracked, newly listed tenants): idle unlisted
        # tenants give theirs up now; ones with requests inside keep theirs until they are idle.
        while len(self._tracked) > policy.max_tracked and self._give_way(now):
            pass
        for activity in self._classes.values():
            activity.weight = sum(a.weight for a in activity.until)

    def account(self, tenant: str | None, now: float) -> Account:
        """The account of a request naming ``tenant``: its own while there is room, else the
        shared one. A name that is not a valid tenant name counts as naming none."""
        if tenant is None or not _VALID_NAME.match(tenant):
            return self.other
        account = self._tracked.get(tenant)
        if account is not None:
            if not account.listed:
                self._unlisted.move_to_end(tenant)
            return account
        if len(self._tracked) >= self.policy.max_tracked and not self._give_way(now):
            return self.other
        while len(self._tracked) >= self.policy.max_tracked and self._give_way(now):
            pass  # still over after new thresholds: more idle accounts go
        if len(self._tracked) >= self.policy.max_tracked:
            return self.other
        account = Account(tenant, 1.0, listed=False)
        self._tracked[tenant] = account
        self._unlisted[tenant] = account
        return account

    def tracked(self) -> list[Account]:
        """Every account, the shared one last: what the metrics label. At most maxTracked + 1,
        but after new thresholds list more tenants or lower maxTracked, unlisted tenants with
        requests inside keep their accounts until they are idle (then the excess goes)."""
        return [*self._tracked.values(), self.other]

    def _give_way(self, now: float) -> bool:
        """Free the account of the least recently seen unlisted tenant if it is idle (no
        request inside, no arrival within a half-life). One candidate only: O(1)."""
        if not self._unlisted:
            return False
        name, oldest = next(iter(self._unlisted.items()))
        if oldest.requests_inside > 0 or now - oldest.last_arrival < self.policy.half_life_seconds:
            return False
        for activity in self._classes.values():
            self._expire(activity, now)
        del self._tracked[name], self._unlisted[name]
        return True

    # ------------------------------------------------------------------ activity

    def arrived(self, account: Account, class_name: str, now: float) -> None:
        """A request of ``account`` arrived in ``class_name``: it is active there for a half-life."""
        account.last_arrival = now
        activity = self._classes.setdefault(class_name, _ClassActivity())
        self._expire(activity, now)
        until = now + self.policy.half_life_seconds
        if account not in activity.until:
            activity.weight += account.weight
            heapq.heappush(activity.expiries, (until, next(self._seq), account))
        activity.until[account] = until

    def active_weight(self, class_name: str) -> float:
        """Σ w of the tenants active in the class (as of the last arrival there)."""
        activity = self._classes.get(class_name)
        return activity.weight if activity is not None else 0.0

    def _expire(self, activity: _ClassActivity, now: float) -> None:
        while activity.expiries and activity.expiries[0][0] <= now:
            _, _, account = heapq.heappop(activity.expiries)
            until = activity.until.get(account)
            if until is None:
                continue
            if until <= now:
                del activity.until[account]
                activity.weight = activity.weight - account.weight if activity.until else 0.0
            else:
                heapq.heappush(activity.expiries, (until, next(self._seq), account))

    # ------------------------------------------------------------------ holdings

    def excess_tokens(self, account: Account, class_name: str, prompt_tokens: int, budget: float, own: int) -> float:
        """Tokens past its share an admission of ``prompt_tokens`` would leave ``account``
        holding in the class (≤ 0: within it). ``own``: tokens of this very request already
        counted in its holdings (a deferred request judged again)."""
        held = account.held.get(class_name, 0) - own
        return share_excess_tokens(held, prompt_tokens, account.weight, self.active_weight(class_name), budget)

    def hold(self, account: Account, class_name: str, prompt_tokens: int) -> None:
        """Its request entered the class's queue (admitted) or the deferral queue."""
        account.held[class_name] = account.held.get(class_name, 0) + prompt_tokens
        account.requests_inside += 1

    def unhold(self, account: Account, class_name: str, prompt_tokens: int, *, ended: bool) -> None:
        """Its tokens left the queue (first token, or it left the deferral queue);
        ``ended``: the request no longer counts as inside."""
        account.held[class_name] = max(account.held.get(class_name, 0) - prompt_tokens, 0)
        if ended:
            account.requests_inside = max(account.requests_inside - 1, 0)

    def started(self, account: Account, class_name: str) -> None:
        """An admitted request of ``account`` holds a stream of the class."""
        account.streams[class_name] = account.streams.get(class_name, 0) + 1

    def ended(self, account: Account, class_name: str) -> None:
        """An admitted request ended (its tokens out of the queue already): its stream returns."""
        account.streams[class_name] = max(account.streams.get(class_name, 0) - 1, 0)
        account.requests_inside = max(account.requests_inside - 1, 0)

    def at_stream_share(self, account: Account, class_name: str, concurrency_cap: int) -> bool:
        """It holds at least its weighted share of the class's streams while another tenant
        is active there (alone in the class, its share is the whole cap)."""
        active = self.active_weight(class_name)
        if active <= account.weight * (1 + 1e-12):
            return False
        return account.streams.get(class_name, 0) >= concurrency_cap * account.weight / active

    # ------------------------------------------------------------------ service

    def charge(self, account: Account, prompt_tokens: int, output_tokens: int, now: float) -> None:
        """Served tokens: n_in + w_out · n_out, added to the decaying counter."""
        self._add(account, prompt_tokens + self.policy.output_weight * output_tokens, now)

    def correct_output(self, account: Account, booked: int, actual: int, now: float) -> None:
        """The request ended with ``actual`` output tokens where ``booked`` were charged."""
        self._add(account, self.policy.output_weight * (actual - booked), now)

    def priority(self, account: Account | None) -> float:
        """Deferral order: the least served first (a log scale: only the order counts)."""
        return account.log_served if account is not None else -math.inf

    def served_tokens(self, account: Account, now: float) -> float:
        """The decayed counter at ``now``, in weighted tokens."""
        return math.exp(account.log_served - self._decay * (now - self._epoch))

    def _add(self, account: Account, tokens: float, now: float) -> None:
        if tokens == 0:
            return
        term = math.log(abs(tokens)) + self._decay * (now - self._epoch)
        current = account.log_served
        if tokens > 0:
            high, low = max(current, term), min(current, term)
            account.log_served = high + math.log1p(math.exp(low - high)) if low > -math.inf else high
        elif current > term:  # a correction down, never below zero
            account.log_served = current + math.log1p(-math.exp(term - current))
        else:
            account.log_served = -math.inf

    # ------------------------------------------------------------------ outcomes

    def admitted(self, account: Account, prompt_tokens: int) -> None:
        """Count an admission (the metrics' admitted requests and prompt tokens)."""
        account.admitted_requests += 1
        account.admitted_prompt_tokens += prompt_tokens

    def refused(self, account: Account, prompt_tokens: int, *, share: bool) -> None:
        """Count a refusal; ``share``: ``tenant_share`` was among its reasons."""
        account.refused_requests += 1
        account.refused_prompt_tokens += prompt_tokens
        account.share_refusals += share
