"""The per-arrival decision: admit, defer or reject, with every reason and number.

Spec: "admit(r) ⇔ TTFT(r) ≤ TTFT_SLO and free_KV ≥ KV_reserved(r)", plus the
concurrency cap with reserved slots and the resident-stream decode check. The gate
config is compiled once from Thresholds; ``decide`` is O(1): a handful of
arithmetic operations and dictionary look-ups, no loops over requests.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple

from slogate_admission.retry import retry_after_s
from slogate_admission.schema import Thresholds
from slogate_admission.service import DecodeCurve, PrefillCurve
from slogate_admission.ttft import queue_wait_s


class Outcome(StrEnum):
    """What the gate does with an arrival."""

    ADMIT = "admit"
    DEFER = "defer"
    REJECT = "reject"


class Reason(StrEnum):
    """A predicate that failed."""

    TTFT = "ttft"
    KV = "kv"
    CONCURRENCY = "concurrency"
    DECODE = "decode"
    QUEUE_FULL = "queue_full"
    """A wait would not end in time: the slot it would get (after those deferred ahead of
    it) or the queue's drain to its depth is expected after its SLO's slack."""
    COST = "cost"
    """The cost order held it back (deferred, never refused for it): it would take one of the
    last slots while cheaper requests arrive that fill the pod (``cost_book``)."""
    TENANT_SHARE = "tenant_share"
    """Its tenant would hold more than its weighted fair share of the class's queued prompt
    tokens while other tenants are active there (``tenant_shares``)."""


@dataclass(frozen=True, slots=True)
class ClassLimits:
    """One class's compiled limits."""

    name: str
    ttft_slo_s: float
    ttft_budget_s: float
    concurrency_cap: int


@dataclass(frozen=True, slots=True)
class GateConfig:
    """Thresholds compiled for the hot path (frozen; swapped whole on update)."""

    prefill: PrefillCurve
    decode: DecodeCurve
    prefill_tokens_per_s: float
    decode_streams_cap: int
    """The per-token SLO's stream cap; with no such SLO, unbounded (the concurrency cap
    alone limits streams, so a refusal never names a ``decode`` SLO nobody set)."""
    kv_capacity_tokens: int
    per_request_max_tokens: int
    max_wait_s: float
    """The policy's longest deferral; ``inf`` when only the request's SLO slack bounds it."""
    clamp_max_tokens: bool
    classes: Mapping[str, ClassLimits]
    default_class: str
    ttft_margin_floor: float = 1.0
    """The least TTFT margin any class admits against: the calibration's own timing noise at
    the SLO's quantile (``ttft_error.Margin`` never drops below it). ``never_fits`` uses it."""
    batch_output_tokens_per_s: float = math.inf
    """Output tokens/s of all streams at the batch cap B = min(the top class's cap, the decode
    cap): what prices a request's output in server-seconds (``request_cost_s``)."""

    def request_cost_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Server-seconds one request costs a pod: T_prefill(n_in) + n_out / (B · r_decode(B))
        (``service.server_seconds_per_request`` at the batch cap, compiled; ``demand.offered_work_s``
        checks its inputs and calls this)."""
        return self.prefill.seconds(prompt_tokens) + output_tokens / self.batch_output_tokens_per_s

    @classmethod
    def from_thresholds(cls, t: Thresholds) -> GateConfig:
        """Compile validated thresholds."""
        classes = {
            c.name: ClassLimits(c.name, c.ttft_slo_seconds, c.ttft_budget_seconds, c.concurrency_cap) for c in t.classes
        }
        decode = DecodeCurve(t.decode_tokens_per_second)
        decode_cap = t.decode_streams_cap if t.tpot_slo_seconds is not None else sys.maxsize
        batch = min(max(c.concurrency_cap for c in t.classes), decode_cap)
        return cls(
            prefill=t.prefill_curve,
            decode=decode,
            prefill_tokens_per_s=t.prefill_tokens_per_second,
            decode_streams_cap=decode_cap,
            kv_capacity_tokens=t.kv_capacity_tokens,
            per_request_max_tokens=t.per_request_max_tokens,
            max_wait_s=t.max_wait_seconds if t.max_wait_seconds is not None else math.inf,
            clamp_max_tokens=t.clamp_max_tokens,
            classes=MappingProxyType(classes),
            default_class=t.default_class,
            ttft_margin_floor=max(1.0, t.ttft_margin_prior),
            batch_output_tokens_per_s=decode.aggregate_tokens_per_s(batch),
        )

    def limits_for(self, class_name: str | None) -> ClassLimits:
        """The class's limits; an unknown or missing class gets the default class."""
        if class_name is not None:
            limits = self.classes.get(class_name)
            if limits is not None:
                return limits
        return self.classes[self.default_class]


@dataclass(frozen=True, slots=True)
class Request:
    """What the gate knows of an arrival."""

    prompt_tokens: int
    output_tokens: int
    """The conservative n_out to reserve (see output_tokens.estimate_output_tokens)."""
    class_name: str | None = None
    waited_s: float = 0.0
    """Time already spent deferred: it counts against the request's TTFT."""
    tenant: str | None = None
    """Who sent it, for fair shares (``tenant_shares``); None: no tenant named."""
    ttft_slo_s: float | None = None
    """A TTFT SLO of its own (a gateway's ``x-llm-d-slo-ttft-ms``): it may tighten its class's
    SLO and budget, never loosen them; None: its class's."""


@dataclass(frozen=True, slots=True)
class LiveState:
    """The gate's live accounting at the arrival instant (read, never scraped)."""

    queued_prefill_tokens: float = 0.0
    """Prompt tokens admitted whose first token has not come yet."""
    streams: int = 0
    """Admitted requests not yet finished (prefilling or decoding)."""
    reserved_kv_tokens: int = 0
    deferred: int = 0
    """Deferred requests that would be served before this one: for an arrival, those of
    its class or above; for a deferred request being re-judged, those ahead of it."""
    prefill_tokens_per_s: float | None = None
    """Live measured prefill rate; None: the calibrated one."""
    next_release_s: float = 0.0
    """Estimated seconds until the soonest stream finishes (frees a slot and its KV)."""
    slot_wait_s: float = 0.0
    """Estimated seconds until a slot frees for this request: the soonest expected end among
    the streams in service once the ``deferred`` ahead of it took theirs (0: one is free for
    it now; ``inf``: more wait ahead of it than streams are in service)."""
    ttft_margin: float = 1.0
    """How much longer than predicted the SLO's quantile of actual TTFTs runs for this
    request's class (``ttft_error.Margin``; 1: admit on the median prediction)."""


class Decision(NamedTuple):
    """The verdict and the numbers behind it.

    A NamedTuple rather than a frozen dataclass: as immutable, and built about four times
    faster (a frozen dataclass's ``__init__`` sets 18 fields through ``object.__setattr__``,
    which took half of the per-arrival budget of 10 µs measured in docs/benchmarks.md).
    """

    outcome: Outcome
    reasons: tuple[Reason, ...]
    """Every predicate that failed, not only the first."""
    class_name: str
    own_prefill_s: float
    queue_wait_s: float
    predicted_ttft_s: float
    """The median prediction: waited + queue wait + own prefill (what the error is judged on)."""
    predicted_ttft_quantile_s: float
    """The SLO quantile's prediction, admitted against: waited + margin · (queue wait + own)."""
    ttft_budget_s: float
    max_queued_tokens: float
    kv_needed_tokens: int
    kv_free_tokens: int
    streams_after: int
    concurrency_cap: int
    output_tokens: int
    """The n_out reserved; lower than asked when ``clamped``."""
    clamped: bool = False
    never_fits: tuple[Reason, ...] = ()
    """Why an idle gate would refuse it too (``never_fits``); empty: a wait may help."""
    retry_after_s: float | None = None
    """Seconds until capacity should exist; None when admitted or when it never will."""
    max_wait_s: float = 0.0
    """For DEFER: how long the request may wait for capacity."""
    defer_deadline: float | None = None
    """For DEFER: ``now + max_wait_s`` on the caller's clock."""
    cost_quartile: int | None = None
    """Its cost's quartile among recent arrivals, 1 (cheapest) to 4 (``cost_book``), set by the
    gate for an arrival it could serve; None before the book is warm."""
    costly: bool = False
    """The cost order held it back: not among the cheapest requests that fill the pod, so it
    waits behind the cheap ones rather than take the last slots at once."""

    @property
    def fits_ever(self) -> bool:
        """False: no wait helps; the gate answers 400, never a 429 with a Retry-After."""
        return not self.never_fits


def decide(
    config: GateConfig, request: Request, state: LiveState, now: float, cost_quartile: int | None = None
) -> Decision:
    """One O(1) decision. ``now`` is the caller's monotonic clock (only deadlines use it).

    TTFT: queued ≤ max_queued(n_in) = (min(budget, SLO − waited) / m − T_prefill(n_in)) · R
          (ttft.max_queued_tokens for a fresh arrival with m = 1): the class's queue depth
          (a lower class never admits deeper than a higher one), and its own SLO with the
          time already spent deferred: waited + m · (queued / R + T_prefill) ≤ SLO, m the
          class's margin for the SLO's quantile (``ttft_error``).
    KV:   reserved + n_in + n_out ≤ capacity, and n_in + n_out ≤ one slot's context.
    Concurrency: streams + 1 ≤ class cap (the cap minus slots reserved above).
    Decode: streams + 1 ≤ the largest B whose t_decode(B) meets the per-token SLO.
    ``cost_quartile``: the request's, as the gate's cost book ranks it, carried into the
    decision unless it never fits (such a request is not ranked).
    A request that fails a check but whose own SLO still has slack is deferred for
    min(max wait, slack), unless what it waits for is not expected within that time
    (Reason.QUEUE_FULL): the slot it would get (``state.slot_wait_s``: the soonest end
    among the streams in service after those deferred ahead took theirs), and the queue's
    drain to its depth. The bound is the request's own, not the reference request's. A
    predicted TTFT beyond the SLO is rejected at once: waiting cannot make its first token
    earlier. A refused request that an idle gate would refuse
    too (``never_fits``) is rejected with no Retry-After: no wait helps.
    """
    limits = own_limits(config, request)
    rate = state.prefill_tokens_per_s or config.prefill_tokens_per_s
    # The calibrated curve is scaled by how much slower (or faster) the server runs now.
    own = config.prefill.seconds(request.prompt_tokens) * (config.prefill_tokens_per_s / rate)
    queued = state.queued_prefill_tokens
    wait = queue_wait_s(queued, rate)
    predicted = request.waited_s + wait + own
    # What is still to come is predicted with an error: the SLO's quantile of it is m times
    # the median prediction (ttft_error), so the budget and the SLO left are divided by m.
    # The class's depth, and its own SLO less the time already spent deferred: a batch
    # request (budget 1 s, SLO 10 s) that waited 3 s may still enter a 1 s-deep queue.
    m = state.ttft_margin
    predicted_q = request.waited_s + m * (wait + own)
    depth_s = limits.ttft_budget_s / m - own
    slo_left_s = (limits.ttft_slo_s - request.waited_s) / m - own
    max_queued = (depth_s if depth_s < slo_left_s else slo_left_s) * rate

    ttft_short = queued > max_queued

    output_tokens = request.output_tokens
    clamped = False
    kv_free = config.kv_capacity_tokens - state.reserved_kv_tokens
    room = min(kv_free, config.per_request_max_tokens) - request.prompt_tokens
    kv_short = request.prompt_tokens + output_tokens > min(kv_free, config.per_request_max_tokens)
    if kv_short and config.clamp_max_tokens and room >= 1:
        output_tokens, clamped, kv_short = room, True, False
    kv_needed = request.prompt_tokens + output_tokens

    streams_after = state.streams + 1
    slots_short = streams_after > limits.concurrency_cap
    decode_short = streams_after > config.decode_streams_cap

    # Plain booleans, one tuple at the end: this runs per arrival (target: median ≤ 10 µs).
    reasons = _REASONS[ttft_short, kv_short, slots_short, decode_short]
    outcome = Outcome.ADMIT
    never: tuple[Reason, ...] = ()
    retry: float | None = None
    max_wait = 0.0
    deadline: float | None = None
    if reasons:
        outcome = Outcome.REJECT
        never = never_fits(config, request)
    if reasons and not never:
        capacity_short = kv_short or slots_short or decode_short
        retry = max(
            retry_after_s(queued, max_queued, rate) if ttft_short else 0.0,
            max(state.next_release_s, 0.0) if capacity_short else 0.0,
        )
        # Deferral only when the request's own SLO still has slack: a TTFT miss is
        # rejected at once (waiting cannot make its first token earlier). Its own wait
        # bound: the slot it would get, and the queue's drain to its depth, within that
        # slack (a wait that cannot end in time is refused now, not at its deadline). The
        # queue ahead prefills during the wait, so the slack is the SLO less its own prefill.
        slack_wait = wait_slack_s(config, limits, request, m, own)
        if slack_wait > 0 and predicted_q <= limits.ttft_slo_s:
            needed = max(
                state.slot_wait_s if capacity_short else 0.0,
                retry_after_s(queued, max_queued, rate) if ttft_short else 0.0,
            )
            if needed > slack_wait:
                reasons = (*reasons, Reason.QUEUE_FULL)
            else:
                outcome, max_wait, deadline = Outcome.DEFER, slack_wait, now + slack_wait
    return Decision(
        outcome=outcome,
        reasons=reasons,
        class_name=limits.name,
        own_prefill_s=own,
        queue_wait_s=wait,
        predicted_ttft_s=predicted,
        predicted_ttft_quantile_s=predicted_q,
        ttft_budget_s=limits.ttft_budget_s,
        max_queued_tokens=max_queued,
        kv_needed_tokens=kv_needed,
        kv_free_tokens=kv_free,
        streams_after=streams_after,
        concurrency_cap=limits.concurrency_cap,
        output_tokens=output_tokens,
        clamped=clamped,
        never_fits=never,
        retry_after_s=retry,
        max_wait_s=max_wait,
        defer_deadline=deadline,
        cost_quartile=None if never else cost_quartile,
    )


def never_fits(config: GateConfig, request: Request) -> tuple[Reason, ...]:
    """Why an idle gate at the calibration's margin floor would not admit ``request``; () if it would.

    The one definition of "never fits": the sidecar answers such a request 400 with these
    reasons (a 429's Retry-After would only bring it back), what-if reports it, the simulator
    counts it unservable. Idle: nothing queued, no stream, the whole KV cache free, nothing
    waited, the calibrated prefill rate, and the class's margin at its floor (first tokens can
    widen a margin, never narrow it below that). ``decide`` on that state admits exactly when
    this is empty (a property test holds them together); at O(1) it is what ``decide`` computes
    with every live term zero:

    - TTFT: m_floor · T_prefill(n_in) > the class's budget (≤ its SLO). A request of a lower
      class whose prefill alone is deeper than the budget it inherits from a higher class
      can never enter, however long it waits (issue 28: a 360-token ``batch`` prompt under a
      1 s ``interactive`` budget got a 429 "retry after 1 s" for ever).
    - KV: n_in + n_out beyond one slot or the whole cache, unless ``clampMaxTokens`` can
      shorten n_out to fit.
    - Concurrency and decode: a cap below one stream (never, for derived thresholds).
    """
    limits = own_limits(config, request)
    own = config.prefill.seconds(request.prompt_tokens)
    m = config.ttft_margin_floor
    # decide's max_queued with nothing queued or waited, term for term (so the two agree to
    # the last bit): the queue may hold a negative number of tokens.
    ttft = min(limits.ttft_budget_s / m - own, limits.ttft_slo_s / m - own) * config.prefill_tokens_per_s < 0
    room = min(config.kv_capacity_tokens, config.per_request_max_tokens)
    kv = request.prompt_tokens + request.output_tokens > room and not (
        config.clamp_max_tokens and room - request.prompt_tokens >= 1
    )
    return _REASONS[ttft, kv, limits.concurrency_cap < 1, config.decode_streams_cap < 1]


def wait_slack_s(config: GateConfig, limits: ClassLimits, request: Request, margin: float, own_s: float) -> float:
    """How long a request may wait for capacity: min(max wait, SLO − waited − m · T_prefill(n_in)).
    The prompts queued ahead prefill during the wait, so once a slot is its own only its own
    prefill is left. ``decide`` bounds a deferral by it, the cost order a held-back arrival."""
    return min(config.max_wait_s, limits.ttft_slo_s - request.waited_s - margin * own_s)


def own_limits(config: GateConfig, request: Request) -> ClassLimits:
    """The request's class's limits, its SLO and budget tightened to its own TTFT SLO if it
    names a tighter one (a looser one changes nothing: the class's SLO is the operator's promise)."""
    limits = config.limits_for(request.class_name)
    own = request.ttft_slo_s
    if own is None or own >= limits.ttft_slo_s:
        return limits
    return ClassLimits(limits.name, own, min(limits.ttft_budget_s, own), limits.concurrency_cap)


def _reasons_table() -> dict[tuple[bool, bool, bool, bool], tuple[Reason, ...]]:
    """Every combination of failed predicates -> its reasons tuple, built once."""
    order = (Reason.TTFT, Reason.KV, Reason.CONCURRENCY, Reason.DECODE)
    table = {}
    for bits in range(16):
        flags = tuple(bool(bits & (1 << i)) for i in range(4))
        table[flags] = tuple(reason for reason, failed in zip(order, flags, strict=True) if failed)
    return table  # type: ignore[return-value]


_REASONS = _reasons_table()
