"""Offered demand and sustainable capacity: the two halves of the autoscaling signal.

A fleet needs ρ = λ / μ pods' worth of work, λ the demand its clients bring and μ what one
pod sustains at the SLO. Both come from the gates, never from a constant pasted by hand:

- **Demand in server-seconds** (``offered_work_s``): each first try is priced at what it
  costs one pod, T_prefill(n_in) + n_out / (B · r_decode(B)) at the concurrency cap B
  (``service.server_seconds_per_request``, the cost whose mean defines μ), on the calibrated
  curves of the thresholds the gate enforces, with the n_out the gate books. A pod supplies
  one server-second per second, so the fleet's Σ rate(work) *is* ρ = λ · E[cost] = λ / μ of
  whatever mix arrives. The capacity is in the price: a recalibration (new model,
  quantization or CPU limit) derives new curves and so re-prices every request.
  Why not λ / μ_ref, requests over the reference request's rate: a mix unlike the policy's
  reference request (chat prompts of ~200 tokens against a 512/256 reference) is mis-sized
  by their cost ratio; the fleet simulator measured 3.8x the pods needed
  (docs/autoscaling.md). The reference capacity is still exported, as a number to read.
- **Capacity** (``Capacity``, ``reference_capacity``): what one pod sustains for the
  policy's reference request, μ_ref = ``throughputRps`` and μ_ref · n_ref prompt tokens/s:
  the dashboard's "one pod serves this much", and 1 / ``offered_work_s`` of that request.
- **Demand** counts every arrival's first try, admitted or not. A refused client that retries
  would otherwise be counted again: the spec's retry amplification, λ_eff = λ / (1 − p)
  ("Retry amplification: pricing the rejection itself", ``retry.retry_amplification``),
  which would make the autoscaler chase load its own shedding manufactured.
  ``RetryMemory.is_retry`` keeps retries out (below). The operator's PromQL
  (``slogate_operator.demand_query``) sums the work over the fleet.

How a try is known as a retry, without any state shared between pods:

1. it says so: ``x-stainless-retry-count`` ≥ 1 (the OpenAI and Anthropic SDKs, which
   honour Retry-After, number their retries there), ``x-envoy-attempt-count`` ≥ 2 (Envoy,
   with ``include_request_attempt_count``), or slogate's own ``x-slogate-retry-count`` ≥ 1;
2. or it carries a key (``Idempotency-Key``, else ``X-Request-Id``) that this gate refused
   within the Retry-After it gave, plus ``RETRY_GRACE_S`` for the client's backoff jitter.

What neither catches is counted as new demand: a retry with no marker that lands on another
pod, and a balancer's own retry over pods (nginx's ``proxy_next_upstream`` re-sends the same
bytes, so no per-try marker is possible there). Both exist only while pods refuse, and
at most once per pod tried; docs/autoscaling.md measures what they cost.

``DemandBook`` is the one meter of all this, sans-I/O: the sidecar drives it from HTTP
(``slogate_sidecar.offered_demand``) and the simulated fleet from virtual time
(``slogate_sim.fleet``), so the autoscaling bench measures the signal the sidecar exports.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from slogate_admission._checks import require_non_negative, require_positive
from slogate_admission.decision import GateConfig, Request
from slogate_admission.schema import Thresholds

__all__ = [
    "RETRY_GRACE_S",
    "Attempt",
    "Capacity",
    "Counted",
    "DemandBook",
    "RetryMemory",
    "offered_work_s",
    "reference_capacity",
]

RETRY_GRACE_S = 30.0
"""How long past its Retry-After a refused key is still known: SDKs add jittered backoff
(the OpenAI SDK's is at most 8 s) and some wait longer than told."""
MEMORY_KEYS = 100_000
"""The most refused keys one gate remembers (about 10 MB); past it the soonest to expire
are forgotten first, so an unbounded key stream costs memory, never correctness of admission."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one pod sustains at the SLO for the policy's reference request."""

    requests_per_second: float
    """μ: completions/s of the reference request at the concurrency cap."""
    prompt_tokens_per_second: float
    """μ · n_ref: the same rate in prompt tokens."""


def reference_capacity(thresholds: Thresholds) -> Capacity:
    """The capacity the enforced thresholds imply: μ = ``throughputRps``, and μ · n_ref."""
    mu = thresholds.throughput_rps
    return Capacity(mu, mu * thresholds.reference_prompt_tokens)


def offered_work_s(config: GateConfig, prompt_tokens: int, output_tokens: int) -> float:
    """Server-seconds one request costs a pod: T_prefill(n_in) + n_out / (B · r_decode(B)).

    B is the concurrency cap (the top class's cap: the most streams the gate lets decode at
    once), so the reference request costs exactly 1 / ``throughputRps``. ``output_tokens`` is
    the n_out the gate books (conservative: max_tokens by default, a learned quantile with
    ``outputTokens.estimate: quantile``), so a fleet whose clients ask far more tokens than
    they use is sized on the safe side.
    """
    require_non_negative("prompt_tokens", prompt_tokens)
    require_non_negative("output_tokens", output_tokens)
    return config.request_cost_s(prompt_tokens, output_tokens)


@dataclass(frozen=True, slots=True)
class Attempt:
    """What an arrival says of itself: the key it carries and the retry count it declares."""

    key: str | None = None
    """An idempotency key or request id, the same on every try of one request."""
    retry_count: int | None = None
    """Tries before this one, as the client or a proxy numbers them (0: the first); None: not said."""


class RetryMemory:
    """One gate's memory of the keys it refused, each until its Retry-After (plus grace) ends.

    Pure and clock-free: callers pass ``now`` (monotonic seconds), as to the gate machine.
    """

    def __init__(self, grace_s: float = RETRY_GRACE_S, max_keys: int = MEMORY_KEYS) -> None:
        require_non_negative("grace_s", grace_s)
        require_positive("max_keys", max_keys)
        self._grace_s = grace_s
        self._max_keys = max_keys
        self._until: dict[str, float] = {}
        self._expiries: list[tuple[float, str]] = []  # a lazy heap: stale entries skipped on pop

    def __len__(self) -> int:
        return len(self._until)

    def is_retry(self, attempt: Attempt, now: float) -> bool:
        """Whether this try repeats one already counted: it says so, or its key was refused here lately."""
        if attempt.retry_count is not None and attempt.retry_count >= 1:
            return True
        if attempt.key is None:
            return False
        self._forget_expired(now)
        return attempt.key in self._until

    def refused(self, attempt: Attempt, retry_after_s: float, now: float) -> None:
        """Remember a refused try's key until now + Retry-After + grace (a keyless try leaves nothing)."""
        require_non_negative("retry_after_s", retry_after_s)
        if attempt.key is None:
            return
        self._forget_expired(now)
        until = max(now + retry_after_s + self._grace_s, self._until.get(attempt.key, now))
        self._until[attempt.key] = until
        heapq.heappush(self._expiries, (until, attempt.key))
        while len(self._until) > self._max_keys:
            self._pop_soonest()

    def _forget_expired(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] <= now:
            self._pop_soonest()

    def _pop_soonest(self) -> None:
        until, key = heapq.heappop(self._expiries)
        if self._until.get(key) == until:  # else a later refusal extended it: a stale entry
            del self._until[key]


@dataclass(frozen=True, slots=True)
class Counted:
    """What one arrival added to a gate's book."""

    retry: bool
    """A retry: counted apart (``slogate_retried_requests_total``), not as demand."""
    prompt_tokens: int
    """Its prompt tokens (never negative)."""
    work_s: float
    """Its price, ``offered_work_s`` (0 when the book was given no config to price on). A
    retry is priced too, for what counting every try would read, though the book adds only
    first tries to ``offered_work_s``."""


class DemandBook:
    """One gate's offered demand: each arrival judged a first try or a retry (``is_retry``, on
    arrival), counted once the gate has decided on it (``count``), and the keys it refused
    remembered for the retries they will bring (``refused``). Pure and clock-free."""

    def __init__(self, memory: RetryMemory | None = None) -> None:
        self.memory = memory if memory is not None else RetryMemory()
        """Keys refused lately: one per gate, nothing shared between pods."""
        self.offered_requests = 0
        """First tries counted."""
        self.offered_prompt_tokens = 0
        """Their prompt tokens."""
        self.offered_work_s = 0.0
        """Their server-seconds: ρ's numerator."""
        self.retried_requests = 0
        """Retries counted apart."""

    def is_retry(self, attempt: Attempt, now: float) -> bool:
        """Whether an arrival repeats a request already counted (judged when it arrives, before
        its own refusal could be remembered)."""
        return self.memory.is_retry(attempt, now)

    def count(self, *, retry: bool, request: Request, config: GateConfig | None) -> Counted:
        """The gate decided on an arrival: a first try adds to offered demand, a retry apart.

        ``request``: as the gate knew it when it decided (its prompt tokens and the n_out the
        gate books); priced on ``config``, the thresholds in force (None: not priced)."""
        tokens = max(request.prompt_tokens, 0)
        work = offered_work_s(config, tokens, max(request.output_tokens, 0)) if config is not None else 0.0
        if retry:
            self.retried_requests += 1
        else:
            self.offered_requests += 1
            self.offered_prompt_tokens += tokens
            self.offered_work_s += work
        return Counted(retry, tokens, work)

    def refused(self, attempt: Attempt, retry_after_s: float, now: float) -> None:
        """The gate refused a try and told it to come back in ``retry_after_s``: its key is
        known as a retry until then, plus grace."""
        self.memory.refused(attempt, retry_after_s, now)
