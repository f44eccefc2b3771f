"""One "never fits": an idle gate at the calibration's margin floor (``decision.never_fits``).

The gate rejects such a request with no Retry-After (the sidecar's 400), what-if says the
same, and the simulator counts it unservable; a request an idle gate would admit is never
one, however loaded the gate is now.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Outcome, Reason, Request, decide, never_fits
from slogate_admission.derivation import derive_thresholds, longest_admitted_prompt, reference_prompt_warnings
from slogate_admission.schema import CalibrationProfile, Policy, PrefillPoint, Thresholds
from slogate_admission.whatif import WhatIfInputs, what_if


def noisy_profile(spread: float) -> CalibrationProfile:
    """The canned SmolLM2 profile with a measured timing spread, so the margin floor is above 1."""
    profile = smollm2_profile()
    points = (PrefillPoint(prompt_tokens=512, seconds=1.53, timings=6, spread=spread),)
    return profile.model_copy(update={"prefill": profile.prefill.model_copy(update={"points": points})})


def walkthrough_thresholds(spread: float = 0.2) -> Thresholds:
    """The README walkthrough's classes: `--slo-ttft 10 --classes interactive:1:1,batch`."""
    policy = Policy.model_validate(
        {
            "slo": {"ttftSeconds": 10.0},
            "classes": [{"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1}, {"name": "batch"}],
        }
    )
    return derive_thresholds(policy, noisy_profile(spread), derived_at=NOW)


def idle(config: GateConfig) -> LiveState:
    return LiveState(ttft_margin=config.ttft_margin_floor)


def test_the_floor_is_the_calibrations_margin_prior() -> None:
    t = walkthrough_thresholds()
    assert t.ttft_margin_prior > 1.5  # exp(z_0.99 · 0.2) = 1.59
    assert GateConfig.from_thresholds(t).ttft_margin_floor == t.ttft_margin_prior


def test_a_batch_prompt_deeper_than_the_budget_it_inherits_is_rejected_for_good() -> None:
    # The walkthrough's miss: batch inherits interactive's 1 s budget; a 360-token prompt needs
    # ~1.1 s of prefill alone (1.7 s at the margin), so an idle gate never admits it. It was a
    # 429 "retry after 1 s" for ever; now it never fits, with no Retry-After.
    config = GateConfig.from_thresholds(walkthrough_thresholds())
    batch = Request(360, 16, class_name="batch")
    assert config.limits_for("batch").ttft_budget_s == 1.0
    assert never_fits(config, batch) == (Reason.TTFT,)
    verdict = decide(config, batch, idle(config), now=0.0)
    assert verdict.outcome is Outcome.REJECT
    assert not verdict.fits_ever
    assert verdict.retry_after_s is None
    assert verdict.never_fits == (Reason.TTFT,)
    # A short one of the same class fits an idle gate, so when refused under load it is a 429.
    short = Request(40, 16, class_name="batch")
    assert never_fits(config, short) == ()
    busy = decide(config, short, LiveState(queued_prefill_tokens=5000, ttft_margin=config.ttft_margin_floor), 0.0)
    assert busy.outcome is Outcome.REJECT
    assert busy.fits_ever
    assert busy.retry_after_s is not None
    assert busy.retry_after_s > 0


def test_a_prompt_within_the_median_but_not_the_margin_never_fits() -> None:
    # Before, "never fits" compared the prefill with the SLO without the margin: this request
    # got a 429 for ever on an idle server.
    config = GateConfig.from_thresholds(walkthrough_thresholds())
    interactive = config.limits_for("interactive")
    n = next(
        n for n in range(1, 2048) if config.prefill.seconds(n) * config.ttft_margin_floor > interactive.ttft_budget_s
    )
    assert config.prefill.seconds(n) < interactive.ttft_slo_s  # within the SLO at the median
    assert never_fits(config, Request(n, 1, class_name="interactive")) == (Reason.TTFT,)
    assert never_fits(config, Request(n - 1, 1, class_name="interactive")) == ()


def test_kv_never_fits_beyond_a_slot_unless_max_tokens_can_be_clamped() -> None:
    t = walkthrough_thresholds()
    config = GateConfig.from_thresholds(t)
    beyond = Request(100, t.per_request_max_tokens, class_name="batch")
    assert never_fits(config, beyond) == (Reason.KV,)
    clamping = dataclasses.replace(config, clamp_max_tokens=True)
    assert never_fits(clamping, beyond) == ()
    assert never_fits(clamping, Request(t.per_request_max_tokens, 1, class_name="batch")) == (Reason.TTFT, Reason.KV)


@settings(max_examples=400, deadline=None)
@given(
    spread=st.floats(0.0, 0.6),
    slo=st.floats(0.3, 20.0),
    interactive=st.floats(0.2, 5.0),
    prompt=st.integers(0, 2100),
    output=st.integers(0, 2100),
    class_name=st.sampled_from(["interactive", "batch", None]),
    clamp=st.booleans(),
)
def test_never_fits_is_what_an_idle_gate_at_the_floor_refuses(
    *, spread: float, slo: float, interactive: float, prompt: int, output: int, class_name: str | None, clamp: bool
) -> None:
    policy = Policy.model_validate(
        {
            "slo": {"ttftSeconds": max(slo, interactive)},
            "classes": [{"name": "interactive", "ttftSeconds": interactive, "reservedSlots": 1}, {"name": "batch"}],
            "degradation": {"clampMaxTokens": clamp},
        }
    )
    try:
        t = derive_thresholds(policy, noisy_profile(spread), derived_at=NOW)
    except ValueError:
        return  # an SLO this server cannot meet at all: refused at derivation, never decided on
    config = GateConfig.from_thresholds(t)
    request = Request(prompt, output, class_name=class_name)
    verdict = decide(config, request, idle(config), now=0.0)
    assert (verdict.outcome is Outcome.ADMIT) is (never_fits(config, request) == ())
    # Refused for good or not, the verdict says so the same way on any load.
    loaded = LiveState(queued_prefill_tokens=3000, streams=2, reserved_kv_tokens=4000, ttft_margin=2.5)
    refused = decide(config, request, loaded, now=0.0)
    if refused.outcome is not Outcome.ADMIT:
        assert refused.never_fits == never_fits(config, request)
        assert (refused.retry_after_s is None) is (not refused.fits_ever) or refused.outcome is Outcome.DEFER


def test_what_if_at_the_floor_agrees_with_the_gate() -> None:
    # Intercept 0, no quadratic: the gate's T_prefill(n) is what-if's n / rate.
    linear = 0.003
    profile = noisy_profile(0.2)
    profile = profile.model_copy(
        update={
            "prefill": profile.prefill.model_copy(
                update={"form": "affine", "intercept_s": 0.0, "linear_s": linear, "quadratic_s": 0.0}
            )
        }
    )
    t = derive_thresholds(Policy.model_validate({"slo": {"ttftSeconds": 1.0}}), profile, derived_at=NOW)
    config = GateConfig.from_thresholds(t)
    for prompt in range(150, 340, 3):
        gate = never_fits(config, Request(prompt, 1))
        report = what_if(
            WhatIfInputs(
                prefill_tps=1 / linear,
                slo_ttft=1.0,
                prompt_tokens=prompt,
                queued_tokens=0,
                ttft_margin=t.ttft_margin_prior,
            )
        )
        assert report["fits_ever"] is (gate == ()), prompt
        assert ("never_fits" in report["reasons"]) is (gate != ()), prompt  # type: ignore[operator]


def test_derive_warns_of_the_prompts_that_never_fit_at_the_margin() -> None:
    t = walkthrough_thresholds()
    config = GateConfig.from_thresholds(t)
    warnings = reference_prompt_warnings(t)
    assert len(warnings) == 2  # interactive's 1 s budget binds both classes
    longest = int(warnings[1].split("prompts over ")[1].split(" tokens")[0])
    assert warnings[1].startswith("class 'batch'")
    assert f"at its timing margin {t.ttft_margin_prior:.2f}" in warnings[1]
    assert never_fits(config, Request(longest, 1, class_name="batch")) == ()
    assert never_fits(config, Request(longest + 1, 1, class_name="batch")) == (Reason.TTFT,)


def test_the_longest_admitted_prompt_is_the_never_fits_boundary_at_a_share_of_the_budget() -> None:
    t = walkthrough_thresholds()
    config = GateConfig.from_thresholds(t)
    for class_name in ("interactive", "batch", None):
        longest = longest_admitted_prompt(t, class_name)
        assert never_fits(config, Request(longest, 1, class_name=class_name)) == ()
        assert never_fits(config, Request(longest + 1, 1, class_name=class_name)) == (Reason.TTFT,)
    third = longest_admitted_prompt(t, "interactive", share=1 / 3)
    assert 0 < third < longest_admitted_prompt(t, "interactive")
    assert config.prefill.seconds(third) * config.ttft_margin_floor <= 1.0 / 3
