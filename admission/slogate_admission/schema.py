"""The shared schema: policy (from the user), calibration profile (measured), thresholds (derived).

External schema -> defaults -> validated, immutable values. Operator and sidecar
exchange these as JSON (camelCase, like the CRD); Python code uses snake_case.
Every model is frozen and rejects unknown fields, so a typo never becomes a default.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, model_validator

from slogate_admission.output_tokens import OutputTokenEstimate
from slogate_admission.service import PrefillCurve
from slogate_admission.tenant_schema import TenantsPolicy, TenantThresholds
from slogate_admission.wire import ClassName, Model, NonNegativeSeconds, PositiveSeconds, Quantile, SloQuantile

# --------------------------------------------------------------------------- policy

DEFAULT_CLASS_NAME = "default"
"""The one class of a policy that lists none."""


class SLO(Model):
    """The service-level objective the gate protects."""

    ttft_seconds: PositiveSeconds | None = None
    """Time-to-first-token target, seconds, of every class that sets none of its own
    (``ClassPolicy.ttft_seconds`` overrides it for that class). Required when some class,
    or the one implicit class ``default``, has none; refused when every class has its own."""
    quantile: SloQuantile = 0.99
    """The share of admitted requests whose TTFT is to be within the target: the gate holds
    this quantile of the actual TTFT under it, not the median it predicts (ttft_error)."""
    time_per_output_token_seconds: PositiveSeconds | None = None
    """Per-token decode target; bounds how many streams may decode at once."""


class ClassPolicy(Model):
    """A priority class. Classes are listed highest priority first."""

    name: ClassName
    """Matched against the X-Slogate-Class header or an API key's class."""
    ttft_seconds: PositiveSeconds | None = None
    """This class's own TTFT target; unset: the policy's ``slo.ttftSeconds``."""
    reserved_slots: Annotated[int, Field(ge=0)] = 0
    """Concurrency slots only this class and those above it may use."""


class OutputTokensPolicy(Model):
    """How n_out is bounded for KV reservation and service-time estimates."""

    estimate: OutputTokenEstimate = OutputTokenEstimate.MAX_TOKENS
    """MaxTokens (worst case), RouteQuantile (learned), or Default."""
    quantile: Quantile = 0.95
    """The learned quantile for RouteQuantile: conservative, never the mean."""
    default: Annotated[int, Field(ge=1)] = 256
    """Used when a request names no max_tokens, and by the Default estimate."""


class ConcurrencyPolicy(Model):
    """The hard cap on streams decoding at once."""

    max: Annotated[int, Field(ge=1)] | None = None
    """At most this many; never more than the server's slots. Unset: the slots."""


class DeferralPolicy(Model):
    """Deferral: wait briefly for capacity instead of rejecting at once."""

    max_wait_seconds: NonNegativeSeconds | None = None
    """Longest wait for capacity. Unset: as long as the request's own TTFT SLO leaves
    slack (a 10 s batch request may wait for a slot; a 1 s interactive one hardly).
    0 disables deferral: a request that finds no capacity is refused at once."""


class DegradationPolicy(Model):
    """Degradation: admit a smaller request instead of rejecting."""

    clamp_max_tokens: bool = False
    """When KV is short, lower max_tokens to what fits (a response header says so)."""


ShedOrder = Literal["arrival", "cost"]
"""Whom the gate refuses first when it must refuse (``Policy.shedding.order``)."""


class SheddingPolicy(Model):
    """Whom to refuse first under overload (docs/admission-math.md, "Cost order")."""

    order: ShedOrder = "arrival"
    """``arrival``: whatever fits now gets in, in arrival order. ``cost``: when more work
    arrives than the pod can do, a request that is not among the cheapest (server-seconds,
    ``cost_book``) may not take the last slots at once: it waits, behind the cheap ones, for
    at most its deferral, then takes a slot that is still free. Each cost quartile keeps at
    least half the share arrival order gives it. Default ``arrival`` until the published
    benchmark on the real server measures ``cost`` (the simulator already does)."""


class Policy(Model):
    """Everything the user says about admission; derivation combines it with a profile."""

    slo: SLO = SLO()
    """Unset: no per-token SLO, and every class must set its own ttftSeconds."""
    output_tokens: OutputTokensPolicy = OutputTokensPolicy()
    concurrency: ConcurrencyPolicy = ConcurrencyPolicy()
    classes: tuple[ClassPolicy, ...] = ()
    """Highest priority first. Empty: one class named ``default`` with ``slo.ttftSeconds``."""
    default_class: ClassName | None = None
    """The class of requests that name none (or an unknown one). Unset: the lowest class."""
    deferral: DeferralPolicy = DeferralPolicy()
    degradation: DegradationPolicy = DegradationPolicy()
    shedding: SheddingPolicy = SheddingPolicy()
    tenants: TenantsPolicy | None = None
    """Fair shares between tenants within a class. Unset: tenants are not told apart."""

    @model_validator(mode="after")
    def _classes_are_consistent(self) -> Policy:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be unique, got {names}")
        if self.default_class is not None and self.default_class not in names:
            raise ValueError(f"defaultClass {self.default_class!r} is not one of the classes {names}")
        self._check_policy_ttft(names)
        reserved = sum(c.reserved_slots for c in self.classes)
        if self.concurrency.max is not None and reserved >= self.concurrency.max and len(names) > 1:
            raise ValueError(
                f"classes reserve {reserved} slots but concurrency.max is {self.concurrency.max}: "
                "the lowest class would have no slot at all"
            )
        return self

    def _check_policy_ttft(self, names: list[str]) -> None:
        """slo.ttftSeconds is there exactly when some class would take it."""
        inheriting = [c.name for c in self.classes if c.ttft_seconds is None]
        if self.slo.ttft_seconds is None:
            if not self.classes:
                raise ValueError(
                    "slo.ttftSeconds is required: it is the TTFT SLO of the one class, default, "
                    "when no classes are listed"
                )
            if inheriting:
                raise ValueError(
                    "slo.ttftSeconds is required: it is the TTFT SLO of the classes without their own "
                    f"ttftSeconds ({', '.join(inheriting)})"
                )
        elif self.classes and not inheriting:
            raise ValueError(
                f"slo.ttftSeconds applies to no class: every class ({', '.join(names)}) sets its own "
                "ttftSeconds; remove slo.ttftSeconds"
            )

    def ttft_slo_of(self, cls: ClassPolicy) -> float:
        """The class's TTFT SLO: its own ttftSeconds, else the policy's slo.ttftSeconds."""
        own = cls.ttft_seconds if cls.ttft_seconds is not None else self.slo.ttft_seconds
        if own is None:  # the validator refuses such a policy
            raise ValueError(f"class {cls.name!r} has no TTFT SLO")
        return own

    @property
    def class_policies(self) -> tuple[ClassPolicy, ...]:
        """The classes, highest first: those listed, or the one class ``default``."""
        return self.classes or (ClassPolicy(name=DEFAULT_CLASS_NAME),)

    def ttft_budget_of(self, class_name: str) -> float:
        """The class's admit-now budget: the least TTFT SLO of it and every class above it (a
        lower class never admits deeper into the queue than a higher one). KeyError if no such class."""
        budget = math.inf
        for cls in self.class_policies:
            budget = min(budget, self.ttft_slo_of(cls))
            if cls.name == class_name:
                return budget
        raise KeyError(class_name)


# --------------------------------------------------------------------------- profile


Spread = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A relative spread or uncertainty: 0.03 is 3% of the value it belongs to."""


class PrefillPoint(Model):
    """One prefill measurement: the median of ``timings`` timings of one prompt length."""

    prompt_tokens: Annotated[int, Field(ge=1)]
    seconds: PositiveSeconds
    timings: Annotated[int, Field(ge=1)] | None = None
    """How many timings ``seconds`` is the median of; None in profiles that did not record it."""
    spread: Spread | None = None
    """Relative spread of one timing: a robust standard deviation (scaled MAD) over the median."""


class PrefillFit(Model):
    """T_prefill(n) = intercept + linear·n + quadratic·n², fitted to measured points."""

    form: Literal["affine", "quadratic"]
    intercept_s: NonNegativeSeconds
    linear_s: PositiveSeconds
    quadratic_s: NonNegativeSeconds = 0.0
    rms_relative_error: Annotated[float, Field(ge=0)] = 0.0
    """Root-mean-square of (fit − measured) / measured over the points."""
    points: tuple[PrefillPoint, ...] = ()


class DecodePoint(Model):
    """Per-stream decode speed with ``streams`` streams decoding together."""

    streams: Annotated[int, Field(ge=1)]
    tokens_per_second: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    timings: Annotated[int, Field(ge=1)] | None = None
    """How many rounds of ``streams`` concurrent streams the median is over; None: not recorded."""
    spread: Spread | None = None
    """Relative spread of one round's rate: a robust standard deviation (scaled MAD) over the median."""


class ModelInfo(Model):
    """What model was measured (from GGUF metadata)."""

    name: str
    quantization: str
    n_layers: Annotated[int, Field(ge=1)]
    n_kv_heads: Annotated[int, Field(ge=1)]
    head_dim: Annotated[int, Field(ge=1)]
    file_bytes: Annotated[int, Field(ge=0)] = 0


class ServerInfo(Model):
    """The server settings that change speed and capacity."""

    slots: Annotated[int, Field(ge=1)]
    ctx_per_slot: Annotated[int, Field(ge=1)]
    threads: int | None = None
    batch_size: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"


class KVInfo(Model):
    """KV cache geometry: the memory predicate's numbers."""

    bytes_per_token: Annotated[float, Field(gt=0)]
    capacity_tokens: Annotated[int, Field(ge=1)]
    """All cells the server has (slots x per-slot context when not unified)."""
    per_request_max_tokens: Annotated[int, Field(ge=1)]
    """n_in + n_out may not exceed one slot's context."""


class TokensPerChar(Model):
    """Tokens per character of the model's tokenizer, over a varied sample."""

    mean: Annotated[float, Field(gt=0)]
    p95: Annotated[float, Field(gt=0)]
    max: Annotated[float, Field(gt=0)]
    samples: Annotated[int, Field(ge=1)]


class CalibrationConfidence(Model):
    """How far a profile's medians can be trusted, from the agreement of their own timings.

    An uncertainty is the relative standard error of a median (one standard error: about
    two times in three the median of many more timings would lie within it). It covers the
    noise within one run, not a machine that is faster or slower on another day."""

    tolerance: Spread
    """The uncertainty at which a point stopped being repeated."""
    prefill_reference_tokens: Annotated[int, Field(ge=1)]
    """The measured prompt length ``prefill_uncertainty`` is of: the one nearest the
    derivation's reference prompt."""
    prefill_uncertainty: Spread
    """Of the prefill time (and rate) at ``prefill_reference_tokens``."""
    decode_streams: Annotated[int, Field(ge=1)]
    """The B ``decode_uncertainty`` is of: the largest, every slot decoding."""
    decode_uncertainty: Spread
    """Of the per-stream decode rate at ``decode_streams``."""
    unsettled_prefill_tokens: tuple[int, ...] = ()
    """Prompt lengths still above the tolerance when their repetitions ran out (count or budget)."""
    unsettled_decode_streams: tuple[int, ...] = ()
    """Stream counts still above the tolerance when their repetitions ran out."""


class CalibrationProfile(Model):
    """A measurement of one model + quantization + server settings + hardware."""

    schema_version: Literal[1] = 1
    id: str
    fingerprint: str
    """Same fingerprint = the profile is still valid for that server."""
    measured_at: datetime
    model: ModelInfo
    server: ServerInfo
    prefill: PrefillFit
    decode: tuple[DecodePoint, ...]
    kv: KVInfo
    tokens_per_char: TokensPerChar | None = None
    fingerprint_inputs: dict[str, str] = Field(default_factory=dict)
    duration_s: NonNegativeSeconds = 0.0
    confidence: CalibrationConfidence | None = None
    """How well the timings agreed; None in profiles from before it was recorded."""

    @model_validator(mode="after")
    def _decode_covers_one_to_b(self) -> CalibrationProfile:
        streams = [p.streams for p in self.decode]
        if streams != list(range(1, len(streams) + 1)):
            raise ValueError(f"decode points must cover B = 1..N in order, got {streams}")
        return self


# --------------------------------------------------------------------------- thresholds


class ClassThresholds(Model):
    """One class's derived limits."""

    name: ClassName
    ttft_slo_seconds: PositiveSeconds
    """The class's own target: a deferred request may wait only within it."""
    ttft_budget_seconds: PositiveSeconds
    """Admit-now budget: min(own target, budgets of every class above)."""
    token_budget: Annotated[float, Field(gt=0)]
    """ttft_budget_seconds x prefill rate: queued tokens an empty request may wait behind."""
    concurrency_cap: Annotated[int, Field(ge=1)]
    """Streams this class may fill: the cap minus slots reserved for classes above."""
    deferral_wait_seconds: NonNegativeSeconds
    """Deprecated, ignored by the gate: 0. Sidecars of earlier releases require it (the
    reference request's wait for a slot); dropped once none runs."""
    l_max: Annotated[int, Field(ge=1)]
    """Deprecated, ignored by the gate: the class's concurrency cap, so a sidecar of an
    earlier release (which refused an arrival finding this many ahead) refuses rather than
    defers while an upgrade rolls. Today's gate bounds each wait by the request's own
    slack and the slot it would get (``decision.decide``)."""


class Thresholds(Model):
    """What a gate enforces: derived from a Policy and a CalibrationProfile, never guessed."""

    schema_version: Literal[1] = 1
    calibration_id: str
    fingerprint: str
    model: str
    quantization: str
    derived_at: datetime
    prefill_intercept_s: NonNegativeSeconds
    prefill_linear_s: PositiveSeconds
    prefill_quadratic_s: NonNegativeSeconds = 0.0
    prefill_tokens_per_second: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    """Queue drain rate: the calibrated rate at the reference prompt length."""
    decode_tokens_per_second: Annotated[tuple[Annotated[float, Field(gt=0)], ...], Field(min_length=1)]
    """Per-stream tokens/s at B = 1..N (the f(B) curve)."""
    tpot_slo_seconds: PositiveSeconds | None = None
    concurrency_cap: Annotated[int, Field(ge=1)]
    """min(policy max, slots, decode cap)."""
    decode_streams_cap: Annotated[int, Field(ge=0)]
    """Largest B with t_decode(B) within the per-token SLO (slots if no such SLO)."""
    kv_bytes_per_token: Annotated[float, Field(gt=0)]
    kv_capacity_tokens: Annotated[int, Field(ge=1)]
    per_request_max_tokens: Annotated[int, Field(ge=1)]
    throughput_rps: Annotated[float, Field(gt=0)]
    """μ: sustainable completions/s for the reference request at the concurrency cap."""
    w_max_seconds: PositiveSeconds
    """Time in system of the reference request in the default class: its TTFT SLO plus
    n_out_ref · t_decode(cap). Reported; the deferral bound uses each class's own W."""
    l_max: Annotated[int, Field(ge=1)]
    """Deprecated, ignored by the gate: the largest class's ``l_max`` (for earlier sidecars)."""
    classes: tuple[ClassThresholds, ...]
    default_class: ClassName
    output_tokens: OutputTokensPolicy
    max_wait_seconds: NonNegativeSeconds | None = None
    """The policy's cap on a deferral; None: only the request's SLO slack bounds it."""
    clamp_max_tokens: bool
    tokens_per_char: Annotated[float, Field(gt=0)] | None = None
    """Conservative (p95) tokens per character, to estimate n_in without tokenizing."""
    reference_prompt_tokens: Annotated[int, Field(ge=1)]
    reference_output_tokens: Annotated[int, Field(ge=1)]
    ttft_quantile: SloQuantile = 0.99
    """The SLO's quantile: the gate admits against this quantile of its TTFT error."""
    ttft_margin_prior: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 1.0
    """The TTFT margin before the gate has judged enough first tokens: the calibration's own
    timing noise at ``ttft_quantile`` (derivation.ttft_margin_prior)."""
    tenants: TenantThresholds | None = None
    """Fair shares between tenants (``tenant_shares``); None: tenants are not told apart."""
    shedding_order: ShedOrder = "arrival"
    """The policy's ``shedding.order``."""
    cost_reserve_slots: Annotated[int, Field(ge=0)] = 0
    """Under ``cost``: the last slots a costly arrival may not take at once,
    max(1, round(√cap) − 1) and below the cap (derivation.cost_reserve_slots)."""

    @property
    def prefill_curve(self) -> PrefillCurve:
        """The calibration's T_prefill(n), as these thresholds carry it."""
        return PrefillCurve(self.prefill_intercept_s, self.prefill_linear_s, self.prefill_quadratic_s)

    @property
    def default_class_thresholds(self) -> ClassThresholds:
        """The class of requests that name none."""
        return next(c for c in self.classes if c.name == self.default_class)

    @model_validator(mode="after")
    def _consistent(self) -> Thresholds:
        names = [c.name for c in self.classes]
        if not names:
            raise ValueError("thresholds need at least one class")
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be unique, got {names}")
        if self.default_class not in names:
            raise ValueError(f"defaultClass {self.default_class!r} is not one of {names}")
        if any(c.concurrency_cap > self.concurrency_cap for c in self.classes):
            raise ValueError("a class cap exceeds the concurrency cap")
        for above, below in zip(self.classes, self.classes[1:], strict=False):
            # A higher class must be admitted whenever a lower one would be.
            if below.ttft_budget_seconds > above.ttft_budget_seconds:
                raise ValueError(f"class {below.name!r} has a larger TTFT budget than {above.name!r}")
            if below.concurrency_cap > above.concurrency_cap:
                raise ValueError(f"class {below.name!r} has a larger cap than {above.name!r}")
        if any(c.l_max < c.concurrency_cap for c in self.classes):
            raise ValueError("a class's L_max is below its concurrency cap")
        if self.l_max < max(c.l_max for c in self.classes):
            raise ValueError("lMax is below a class's L_max")
        if any(c.ttft_budget_seconds > c.ttft_slo_seconds for c in self.classes):
            raise ValueError("a class's TTFT budget exceeds its own TTFT SLO")
        if self.per_request_max_tokens > self.kv_capacity_tokens:
            raise ValueError("perRequestMaxTokens exceeds kvCapacityTokens")
        return self
