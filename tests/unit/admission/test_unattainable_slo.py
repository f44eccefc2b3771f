"""SLOs the calibrated server cannot meet: refused or warned at derivation, and what-if
agreeing with the gate on requests that can never fit."""

import itertools

import pytest

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Outcome, Request, decide
from slogate_admission.derivation import (
    MIN_USEFUL_PROMPT_TOKENS,
    DerivationError,
    derive_thresholds,
    longest_prompt_within,
    prefill_curve,
    reference_prompt_warnings,
)
from slogate_admission.schema import Policy
from slogate_admission.service import PrefillCurve
from slogate_admission.whatif import WhatIfInputs, what_if


def policy(ttft: float, **raw: object) -> Policy:
    return Policy.model_validate({"slo": {"ttftSeconds": ttft}, **raw})


@pytest.mark.parametrize(
    "prefill",
    [
        {"form": "quadratic", "interceptS": 0.02, "linearS": 0.0029, "quadraticS": 1e-7},
        {"form": "affine", "interceptS": 0.0, "linearS": 0.0003},  # ~3,300 tok/s: a faster server
        {"form": "affine", "interceptS": 0.5, "linearS": 0.003},  # a large fixed cost
    ],
)
def test_below_the_smallest_useful_prompt_is_refused_and_the_named_slo_derives(prefill: dict[str, object]) -> None:
    profile = smollm2_profile(prefill=prefill)
    floor = prefill_curve(profile).seconds(MIN_USEFUL_PROMPT_TOKENS)
    with pytest.raises(DerivationError, match="the smallest TTFT SLO this calibration can meet is ") as refused:
        derive_thresholds(policy(floor * 0.99), profile, derived_at=NOW)
    named = float(str(refused.value).rsplit(" is ", 1)[1].removesuffix(" s"))
    assert named >= floor
    assert "fixed prefill cost" in str(refused.value)  # the operator's SLOUnattainable message says why
    derive_thresholds(policy(named), profile, derived_at=NOW)  # the SLO it names is met


def test_a_lower_class_below_the_floor_is_refused_by_name() -> None:
    p = Policy.model_validate(
        {"classes": [{"name": "interactive", "ttftSeconds": 1.0}, {"name": "fast", "ttftSeconds": 0.05}]}
    )
    with pytest.raises(DerivationError, match=r"class 'fast': a TTFT budget of 0\.05 s"):
        derive_thresholds(p, smollm2_profile(), derived_at=NOW)


def test_budgets_short_of_the_reference_prompt_are_warned_with_the_longest_prompt_admitted() -> None:
    p = Policy.model_validate(
        {"classes": [{"name": "interactive", "ttftSeconds": 1.0}, {"name": "batch", "ttftSeconds": 10}]}
    )
    t = derive_thresholds(p, smollm2_profile(), derived_at=NOW)
    # interactive: T_prefill(334) = 0.9998 s ≤ 1 s < T_prefill(335); batch's budget is capped at interactive's.
    assert reference_prompt_warnings(t) == (
        "class 'interactive': prompts over 334 tokens are never admitted within its 1 s TTFT budget "
        "(a 512-token prompt needs 1.53 s on the calibrated server)",
        "class 'batch': prompts over 334 tokens are never admitted within its 1 s TTFT budget "
        "(a 512-token prompt needs 1.53 s on the calibrated server)",
    )
    assert reference_prompt_warnings(derive_thresholds(policy(2.0), smollm2_profile(), derived_at=NOW)) == ()


@pytest.mark.parametrize(
    ("curve", "seconds"),
    [(PrefillCurve(0.02, 0.0029, 1e-7), s) for s in (0.0, 0.02, 0.0229, 0.02290011, 0.5, 1.0, 1.531, 30.0)]
    + [(PrefillCurve(0.0, 0.001), s) for s in (0.001, 0.0999, 0.1, 2.5)],
)
def test_longest_prompt_within_is_exact(curve: PrefillCurve, seconds: float) -> None:
    n = longest_prompt_within(curve, seconds)
    assert n == 0 or curve.seconds(n) <= seconds
    assert curve.seconds(n + 1) > seconds


def test_what_if_agrees_with_the_gate_on_what_never_fits() -> None:
    # Intercept 0, no quadratic: the gate's T_prefill(n) is what-if's n / rate, so they can agree exactly.
    linear = 0.003
    profile = smollm2_profile(prefill={"form": "affine", "interceptS": 0.0, "linearS": linear})
    t = derive_thresholds(policy(1.0), profile, derived_at=NOW)
    config = GateConfig.from_thresholds(t)
    capacity_bytes = t.kv_capacity_tokens * t.kv_bytes_per_token
    for prompt, out in itertools.product((10, 300, 340, 1500, 1900, 2100, 9000), (1, 256, 1000)):
        gate = decide(config, Request(prompt, out), LiveState(), now=0.0)
        report = what_if(
            WhatIfInputs(
                prefill_tps=1 / linear, slo_ttft=1.0, prompt_tokens=prompt, queued_tokens=0, max_tokens=out,
                kv_bytes_per_token=t.kv_bytes_per_token, kv_free_bytes=capacity_bytes,
                kv_capacity_bytes=capacity_bytes, slot_tokens=t.per_request_max_tokens,
            )
        )  # fmt: skip
        case = f"n_in {prompt}, n_out {out}"
        assert report["admit"] is (gate.outcome is Outcome.ADMIT), case
        assert report["fits_ever"] is gate.fits_ever, case
        if not gate.fits_ever:  # the sidecar's 400: no Retry-After, and what-if says the same
            assert gate.retry_after_s is None
            assert report["retry_after_s"] is None, case
            assert "never_fits" in report["reasons"], case  # type: ignore[operator]
