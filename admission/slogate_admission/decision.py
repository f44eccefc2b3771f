"""The per-arrival decision: admit, defer or reject, with every reason and number.

Spec: "admit(r) ⇔ TTFT(r) ≤ TTFT_SLO and free_KV ≥ KV_reserved(r)", plus the
concurrency cap with reserved slots and the resident-stream decode check. The gate
config is compiled once from Thresholds; ``decide`` is O(1): a handful of
arithmetic operations and dictionary look-ups, no loops over requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

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
    """Deferral would exceed Little's-law L_max of requests inside."""


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
    kv_capacity_tokens: int
    per_request_max_tokens: int
    max_wait_s: float
    clamp_max_tokens: bool
    l_max: int
    classes: Mapping[str, ClassLimits]
    default_class: str

    @classmethod
    def from_thresholds(cls, t: Thresholds) -> GateConfig:
        """Compile validated thresholds."""
        classes = {
            c.name: ClassLimits(c.name, c.ttft_slo_seconds, c.ttft_budget_seconds, c.concurrency_cap) for c in t.classes
        }
        return cls(
            prefill=PrefillCurve(t.prefill_intercept_s, t.prefill_linear_s, t.prefill_quadratic_s),
            decode=DecodeCurve(t.decode_tokens_per_second),
            prefill_tokens_per_s=t.prefill_tokens_per_second,
            decode_streams_cap=t.decode_streams_cap,
            kv_capacity_tokens=t.kv_capacity_tokens,
            per_request_max_tokens=t.per_request_max_tokens,
            max_wait_s=t.max_wait_seconds,
            clamp_max_tokens=t.clamp_max_tokens,
            l_max=t.l_max,
            classes=MappingProxyType(classes),
            default_class=t.default_class,
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


@dataclass(frozen=True, slots=True)
class LiveState:
    """The gate's live accounting at the arrival instant (read, never scraped)."""

    queued_prefill_tokens: float = 0.0
    """Prompt tokens admitted whose first token has not come yet."""
    streams: int = 0
    """Admitted requests not yet finished (prefilling or decoding)."""
    reserved_kv_tokens: int = 0
    deferred: int = 0
    """Requests waiting in the deferral queue."""
    prefill_tokens_per_s: float | None = None
    """Live measured prefill rate; None: the calibrated one."""
    next_release_s: float = 0.0
    """Estimated seconds until the soonest stream finishes (frees a slot and its KV)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict and the numbers behind it."""

    outcome: Outcome
    reasons: tuple[Reason, ...]
    """Every predicate that failed, not only the first."""
    class_name: str
    own_prefill_s: float
    queue_wait_s: float
    predicted_ttft_s: float
    ttft_budget_s: float
    max_queued_tokens: float
    kv_needed_tokens: int
    kv_free_tokens: int
    streams_after: int
    concurrency_cap: int
    output_tokens: int
    """The n_out reserved; lower than asked when ``clamped``."""
    clamped: bool = False
    fits_ever: bool = True
    """False: no waiting helps (prompt + output beyond a slot, or own prefill beyond the SLO)."""
    retry_after_s: float | None = None
    """Seconds until capacity should exist; None when admitted or when it never will."""
    max_wait_s: float = 0.0
    """For DEFER: how long the request may wait for capacity."""
    defer_deadline: float | None = None
    """For DEFER: ``now + max_wait_s`` on the caller's clock."""


def decide(config: GateConfig, request: Request, state: LiveState, now: float) -> Decision:
    """One O(1) decision. ``now`` is the caller's monotonic clock (only deadlines use it).

    TTFT: waited + queued / R + T_prefill(n_in) ≤ class budget  ⇔  queued ≤ max_queued(n_in)
          with max_queued = (budget − waited − T_prefill(n_in)) · R (ttft.max_queued_tokens
          for a fresh arrival).
    KV:   reserved + n_in + n_out ≤ capacity, and n_in + n_out ≤ one slot's context.
    Concurrency: streams + 1 ≤ class cap (the cap minus slots reserved above).
    Decode: streams + 1 ≤ the largest B whose t_decode(B) meets the per-token SLO.
    If only capacity (KV, slots, decode) is short and the request's own SLO still has
    slack, it is deferred for min(max wait, slack); a TTFT miss is rejected at once,
    because waiting cannot make its first token earlier.
    """
    limits = config.limits_for(request.class_name)
    rate = state.prefill_tokens_per_s or config.prefill_tokens_per_s
    # The calibrated curve is scaled by how much slower (or faster) the server runs now.
    own = config.prefill.seconds(request.prompt_tokens) * (config.prefill_tokens_per_s / rate)
    queued = state.queued_prefill_tokens
    wait = queue_wait_s(queued, rate)
    predicted = request.waited_s + wait + own
    # (budget − waited − own) · R: time already spent deferred is spent from the budget.
    max_queued = (limits.ttft_budget_s - request.waited_s - own) * rate

    reasons: list[Reason] = []
    if queued > max_queued:
        reasons.append(Reason.TTFT)

    output_tokens = request.output_tokens
    clamped = False
    kv_free = config.kv_capacity_tokens - state.reserved_kv_tokens
    room = min(kv_free, config.per_request_max_tokens) - request.prompt_tokens
    if request.prompt_tokens + output_tokens > min(kv_free, config.per_request_max_tokens):
        if config.clamp_max_tokens and room >= 1:
            output_tokens, clamped = room, True
        else:
            reasons.append(Reason.KV)
    kv_needed = request.prompt_tokens + output_tokens

    streams_after = state.streams + 1
    if streams_after > limits.concurrency_cap:
        reasons.append(Reason.CONCURRENCY)
    if streams_after > config.decode_streams_cap:
        reasons.append(Reason.DECODE)

    def verdict(outcome: Outcome, **extra: object) -> Decision:
        return Decision(
            outcome=outcome,
            reasons=tuple(reasons),
            class_name=limits.name,
            own_prefill_s=own,
            queue_wait_s=wait,
            predicted_ttft_s=predicted,
            ttft_budget_s=limits.ttft_budget_s,
            max_queued_tokens=max_queued,
            kv_needed_tokens=kv_needed,
            kv_free_tokens=kv_free,
            streams_after=streams_after,
            concurrency_cap=limits.concurrency_cap,
            output_tokens=output_tokens,
            clamped=clamped,
            **extra,  # type: ignore[arg-type]
        )

    if not reasons:
        return verdict(Outcome.ADMIT)

    never_fits = (
        own > limits.ttft_slo_s
        or request.prompt_tokens + output_tokens > config.per_request_max_tokens
        or kv_needed > config.kv_capacity_tokens
    )
    if never_fits:
        return verdict(Outcome.REJECT, fits_ever=False)

    capacity_short = Reason.KV in reasons or Reason.CONCURRENCY in reasons or Reason.DECODE in reasons
    retry = max(
        retry_after_s(queued, max_queued, rate) if Reason.TTFT in reasons else 0.0,
        max(state.next_release_s, 0.0) if capacity_short else 0.0,
    )
    slack = limits.ttft_slo_s - predicted
    max_wait = min(config.max_wait_s, slack)
    if max_wait > 0 and predicted <= limits.ttft_slo_s:
        if state.streams + state.deferred + 1 > config.l_max:
            reasons.append(Reason.QUEUE_FULL)
            return verdict(Outcome.REJECT, retry_after_s=retry)
        return verdict(Outcome.DEFER, retry_after_s=retry, max_wait_s=max_wait, defer_deadline=now + max_wait)
    return verdict(Outcome.REJECT, retry_after_s=retry)
