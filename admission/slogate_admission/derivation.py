"""From an SLO and a calibration profile to the thresholds a gate enforces.

Spec: "Deriving the admission threshold from the SLO", "Little's law", "Degrees of
no" (priority classes) and "CPU SLM serving". Nothing here is a guess: every
number is the SLO combined with a measurement, and the inputs travel with it.
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime

from slogate_admission.schema import (
    CalibrationProfile,
    ClassThresholds,
    Policy,
    Thresholds,
)
from slogate_admission.service import DecodeCurve, PrefillCurve, server_seconds_per_request
from slogate_admission.tenant_schema import TenantsPolicy, TenantThresholds
from slogate_admission.ttft import token_budget

DEFAULT_REFERENCE_PROMPT_TOKENS = 512
"""Prompt length at which the queue-drain rate is taken. Queued prompts are of many
lengths; the rate at a mid-size prompt is conservative for short ones and honest
for typical chat turns. The sidecar replaces it with the live measured rate."""

MIN_USEFUL_PROMPT_TOKENS = 32
"""The smallest prompt worth serving: a one-line question inside a chat template
(ChatML's markers alone are about 10 tokens, SmolLM2's default system prompt about 20
more). A class whose TTFT budget an idle server cannot meet for it would admit
nothing useful, so derivation refuses it, naming T_prefill(32) as the smallest SLO the
calibration can meet. Budgets above that but below the reference prompt's prefill
derive, with a warning (``reference_prompt_warnings``): longer prompts are then never
admitted."""


class DerivationError(ValueError):
    """The SLO cannot be met by the measured server at all, or the inputs contradict."""


def prefill_curve(profile: CalibrationProfile) -> PrefillCurve:
    """The measured T_prefill(n) of a profile."""
    fit = profile.prefill
    return PrefillCurve(fit.intercept_s, fit.linear_s, fit.quadratic_s)


def decode_curve(profile: CalibrationProfile) -> DecodeCurve:
    """The measured per-stream decode speeds of a profile, B = 1..N."""
    return DecodeCurve(tuple(p.tokens_per_second for p in profile.decode))


def derive_thresholds(
    policy: Policy,
    profile: CalibrationProfile,
    *,
    derived_at: datetime,
    reference_prompt_tokens: int = DEFAULT_REFERENCE_PROMPT_TOKENS,
) -> Thresholds:
    """Derive every threshold; raise DerivationError if the SLO is unattainable.

    Unattainable: a class's TTFT budget is below T_prefill(MIN_USEFUL_PROMPT_TOKENS) (the
    message names that smallest attainable SLO), the per-token SLO is beyond a lone
    stream, or reserved slots leave a class none.

    - Queue rate R = n_ref / T_prefill(n_ref) (tokens/s).
    - Decode cap = largest B ≤ slots with t_1 · f(B) ≤ TPOT SLO.
    - Concurrency cap = min(policy max, slots, decode cap).
    - Per class, highest first: budget_i = min(own TTFT SLO, budget_{i-1}), so a lower
      class never admits deeper into the queue than a higher one (it would fill the
      queue the higher class needs); its looser SLO buys it deferral time instead.
      token_budget_i = budget_i · R. Cap_i = cap − slots reserved by classes above.
    - μ = λ_srv = 1 / (T_prefill(n_ref) + n_out_ref · t_decode(cap) / cap), the server's
      work-conserving completion rate (see server_seconds_per_request), and W_max (reported)
      = default class's TTFT SLO + n_out_ref · t_decode(cap).
    - No deferral bound is derived from the reference request: ``decide`` bounds each wait
      by the request's own slack and the slot it would get (the ledger's expected ends).
      The wire's deprecated ``lMax`` fields carry the class caps (``legacy_l_max``).
    """
    slots = profile.server.slots
    prefill = prefill_curve(profile)
    decode = decode_curve(profile)
    per_request_max = min(profile.kv.per_request_max_tokens, profile.kv.capacity_tokens)
    n_ref = max(1, min(reference_prompt_tokens, per_request_max // 2))
    rate = prefill.tokens_per_second(n_ref)
    n_min = max(1, min(MIN_USEFUL_PROMPT_TOKENS, per_request_max))
    floor_s = prefill.seconds(n_min)

    tpot = policy.slo.time_per_output_token_seconds
    decode_cap = slots if tpot is None else decode.max_streams_within(tpot, slots)
    if decode_cap == 0:
        raise DerivationError(
            f"the per-token SLO of {tpot} s cannot be met: a lone stream decodes at "
            f"{decode.t1_s:.4f} s/token on the measured server"
        )
    policy_max = policy.concurrency.max if policy.concurrency.max is not None else slots
    cap = min(policy_max, slots, decode_cap)

    n_out_ref = policy.output_tokens.default
    throughput = 1.0 / server_seconds_per_request(prefill, decode, n_ref, n_out_ref, cap)

    classes: list[ClassThresholds] = []
    reserved_above = 0
    for cls in policy.class_policies:
        own_slo = policy.ttft_slo_of(cls)
        budget = policy.ttft_budget_of(cls.name)
        if budget < floor_s:
            raise DerivationError(
                f"class {cls.name!r}: a TTFT budget of {budget:g} s is below the {floor_s:.3f} s an idle "
                f"server takes to prefill a {n_min}-token prompt, the smallest useful one (fixed prefill "
                f"cost {prefill.intercept_s:.3f} s plus {n_min} tokens): the smallest TTFT SLO this "
                f"calibration can meet is {_ceil_ms(floor_s):g} s"
            )
        class_cap = cap - reserved_above
        if class_cap < 1:
            raise DerivationError(
                f"class {cls.name!r} has no concurrency slot: cap {cap} minus "
                f"{reserved_above} reserved by classes above"
            )
        classes.append(
            ClassThresholds(
                name=cls.name,
                ttft_slo_seconds=own_slo,
                ttft_budget_seconds=budget,
                token_budget=token_budget(budget, rate),
                concurrency_cap=class_cap,
                deferral_wait_seconds=0.0,
                l_max=class_cap,
            )
        )
        reserved_above += cls.reserved_slots

    default_class = policy.default_class or classes[-1].name
    default_slo = next(c.ttft_slo_seconds for c in classes if c.name == default_class)
    w_max = default_slo + n_out_ref * decode.seconds_per_token(cap)

    return Thresholds(
        calibration_id=profile.id,
        fingerprint=profile.fingerprint,
        model=profile.model.name,
        quantization=profile.model.quantization,
        derived_at=derived_at,
        prefill_intercept_s=prefill.intercept_s,
        prefill_linear_s=prefill.linear_s,
        prefill_quadratic_s=prefill.quadratic_s,
        prefill_tokens_per_second=rate,
        decode_tokens_per_second=decode.per_stream_tokens_per_s,
        tpot_slo_seconds=tpot,
        concurrency_cap=cap,
        decode_streams_cap=decode_cap,
        kv_bytes_per_token=profile.kv.bytes_per_token,
        kv_capacity_tokens=profile.kv.capacity_tokens,
        per_request_max_tokens=per_request_max,
        throughput_rps=throughput,
        w_max_seconds=w_max,
        l_max=legacy_l_max(classes),
        classes=tuple(classes),
        default_class=default_class,
        output_tokens=policy.output_tokens,
        max_wait_seconds=policy.deferral.max_wait_seconds,
        clamp_max_tokens=policy.degradation.clamp_max_tokens,
        tokens_per_char=profile.tokens_per_char.p95 if profile.tokens_per_char else None,
        reference_prompt_tokens=n_ref,
        reference_output_tokens=n_out_ref,
        ttft_quantile=policy.slo.quantile,
        ttft_margin_prior=ttft_margin_prior(profile, n_ref, policy.slo.quantile),
        tenants=tenant_thresholds(policy.tenants, rate / decode.aggregate_tokens_per_s(cap)),
        shedding_order=policy.shedding.order,
        cost_reserve_slots=cost_reserve_slots(cap) if policy.shedding.order == "cost" else 0,
    )


def cost_reserve_slots(cap: int) -> int:
    """The slots a costly arrival may not take at once under the cost order: max(1, round(√cap) − 1),
    at most cap − 1. In a loss system whose requests differ in value per second of holding a
    server, the optimal admission reserves servers for the valuable ones (trunk reservation),
    and the reservation grows as √N (docs/admission-math.md): 1 of 4 slots, 3 of 16, 7 of 64."""
    return min(cap - 1, max(1, round(math.sqrt(cap)) - 1))


def tenant_thresholds(tenants: TenantsPolicy | None, measured_output_weight: float) -> TenantThresholds | None:
    """The tenant policy a gate enforces, its output weight resolved.

    Unset by the user, an output token weighs what it costs the server against a prompt
    token, both in server-seconds at the concurrency cap B: (1 / (B · r_decode(B))) / (1 / R)
    = R / (B · r_decode(B)) (``service.server_seconds_per_request``'s two terms per token).
    The served-token counters then count server time, the resource tenants share.
    """
    if tenants is None:
        return None
    measured = tenants.output_weight is None
    return TenantThresholds(
        header=tenants.header,
        weights=dict(tenants.weights),
        max_tracked=tenants.max_tracked,
        output_weight=measured_output_weight if measured else tenants.output_weight,
        output_weight_measured=measured,
        half_life_seconds=tenants.half_life_seconds,
    )


def ttft_margin_prior(profile: CalibrationProfile, n_ref: int, quantile: float) -> float:
    """The TTFT margin a gate starts with (``ttft_error``): exp(z_q · σ), σ the measured
    relative spread of one prefill timing at the prompt length nearest n_ref.

    The least error any prediction has is the server's own timing noise, which the
    calibration measured; the gate widens it from what first tokens show (load, HTTP,
    batching) as soon as it has seen a few. A profile that recorded no spread gives 1.
    """
    points = [p for p in profile.prefill.points if p.spread is not None]
    if not points:
        return 1.0
    nearest = min(points, key=lambda p: (abs(p.prompt_tokens - n_ref), p.prompt_tokens))
    assert nearest.spread is not None
    return math.exp(statistics.NormalDist().inv_cdf(quantile) * nearest.spread)


def legacy_l_max(classes: list[ClassThresholds]) -> int:
    """The deprecated wire field ``lMax`` (and each class's): the cap, so that a sidecar of an
    earlier release, which bounded the deferral queue by it, refuses rather than defers
    while an upgrade rolls. Today's gate reads neither it nor ``deferralWaitSeconds``."""
    return max(c.concurrency_cap for c in classes)


def _ceil_ms(seconds: float) -> float:
    """Rounded up to the millisecond: a suggested SLO rounded down would still be refused."""
    return math.ceil(seconds * 1000 - 1e-9) / 1000


def longest_prompt_within(curve: PrefillCurve, seconds: float) -> int:
    """The longest prompt an idle server prefills within ``seconds``: the largest n with
    T_prefill(n) ≤ seconds (0 if none), the positive root of q·n² + l·n + (i − s) = 0."""
    slack = seconds - curve.intercept_s
    if slack <= 0:
        return 0
    q, lin = curve.quadratic_s, curve.linear_s
    root = slack / lin if q == 0 else (-lin + math.sqrt(lin * lin + 4 * q * slack)) / (2 * q)
    n = math.floor(root)
    # Float error at the boundary: step to the exact answer (at most a step or two).
    while n > 0 and curve.seconds(n) > seconds:
        n -= 1
    while curve.seconds(n + 1) <= seconds:
        n += 1
    return n


def longest_admitted_prompt(t: Thresholds, class_name: str | None = None, share: float = 1.0) -> int:
    """The longest prompt an idle gate admits in the class with ``share`` of its TTFT budget:
    the largest n with m_floor · T_prefill(n) ≤ share · budget. With share 1, every longer
    prompt never fits (``decision.never_fits``); tests and benchmarks that must overload a
    server of unknown speed size their prompts with a smaller share."""
    classes = {c.name: c for c in t.classes}
    budget_s = classes.get(class_name or t.default_class, classes[t.default_class]).ttft_budget_seconds
    return longest_prompt_within(t.prefill_curve, share * budget_s / max(1.0, t.ttft_margin_prior))


def reference_prompt_warnings(t: Thresholds) -> tuple[str, ...]:
    """One line per class whose budget an idle server cannot meet for the reference prompt.

    Such thresholds derive (short prompts are admitted) but every prompt whose prefill at the
    margin floor is longer than the budget never fits (``decision.never_fits``: a 400,
    however idle the server): worth saying before the first 400s do."""
    curve = t.prefill_curve
    m = max(1.0, t.ttft_margin_prior)
    needed = curve.seconds(t.reference_prompt_tokens)
    at_margin = "" if m == 1.0 else f", {needed * m:.2f} s at its timing margin {m:.2f}"
    warnings: list[str] = []
    for c in t.classes:
        if c.ttft_budget_seconds < needed * m:
            longest = longest_admitted_prompt(t, c.name)
            warnings.append(
                f"class {c.name!r}: prompts over {longest} tokens are never admitted within its "
                f"{c.ttft_budget_seconds:g} s TTFT budget (a {t.reference_prompt_tokens}-token prompt "
                f"needs {needed:.2f} s on the calibrated server{at_margin})"
            )
    return tuple(warnings)
