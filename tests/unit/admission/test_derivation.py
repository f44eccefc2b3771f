"""Threshold derivation: SLO + measured profile -> thresholds, and its refusals."""

import pytest
from pydantic import ValidationError

from canned_profiles import NOW, smollm2_profile
from slogate_admission.derivation import DerivationError, derive_thresholds
from slogate_admission.schema import CalibrationProfile, Policy, Thresholds
from slogate_admission.service import PrefillCurve


def policy(**raw: object) -> Policy:
    return Policy.model_validate({"slo": {"ttftSeconds": 2.0}, **raw})


def test_single_class_defaults(profile: CalibrationProfile) -> None:
    t = derive_thresholds(policy(), profile, derived_at=NOW)
    rate = PrefillCurve(0.02, 0.0029, 1e-7).tokens_per_second(512)
    assert t.prefill_tokens_per_second == pytest.approx(rate)
    assert [c.name for c in t.classes] == ["default"]
    assert t.default_class == "default"
    assert t.classes[0].token_budget == pytest.approx(2.0 * rate)
    assert t.concurrency_cap == 4  # no TPOT SLO: the slots
    assert t.kv_capacity_tokens == 8192
    assert t.per_request_max_tokens == 2048
    assert t.calibration_id == "cal-test"


def test_tpot_slo_caps_concurrency(profile: CalibrationProfile) -> None:
    # 1/60 s per token: 69 tok/s at B=2 passes, 57 at B=3 misses.
    t = derive_thresholds(policy(slo={"ttftSeconds": 2, "timePerOutputTokenSeconds": 1 / 60}), profile, derived_at=NOW)
    assert t.decode_streams_cap == 2
    assert t.concurrency_cap == 2


def test_policy_max_and_slots_cap(profile: CalibrationProfile) -> None:
    assert derive_thresholds(policy(concurrency={"max": 3}), profile, derived_at=NOW).concurrency_cap == 3
    assert derive_thresholds(policy(concurrency={"max": 16}), profile, derived_at=NOW).concurrency_cap == 4


def test_classes_are_monotone(two_class_policy: Policy, profile: CalibrationProfile) -> None:
    t = derive_thresholds(two_class_policy, profile, derived_at=NOW)
    interactive, batch = t.classes
    assert interactive.ttft_budget_seconds == 1.0
    # batch's own SLO is 10 s but it may not admit deeper than interactive would.
    assert batch.ttft_slo_seconds == 10
    assert batch.ttft_budget_seconds == 1.0
    assert interactive.concurrency_cap == 4
    assert batch.concurrency_cap == 3  # one slot reserved for interactive
    assert t.default_class == "batch"  # unnamed traffic gets the lowest class


def test_littles_law_cap(profile: CalibrationProfile) -> None:
    t = derive_thresholds(policy(), profile, derived_at=NOW)
    assert t.w_max_seconds == pytest.approx(2.0 + 256 / 45)
    prefill = PrefillCurve(0.02, 0.0029, 1e-7)
    assert t.throughput_rps == pytest.approx(1 / (prefill.seconds(512) + 256 / (4 * 45)))
    # The deprecated lMax carries the cap for earlier sidecars; the gate reads it nowhere.
    assert t.l_max == t.concurrency_cap == max(c.l_max for c in t.classes)
    assert all(c.deferral_wait_seconds == 0.0 for c in t.classes)


def test_unattainable_tpot_is_refused(profile: CalibrationProfile) -> None:
    with pytest.raises(DerivationError, match="per-token SLO"):
        derive_thresholds(
            policy(slo={"ttftSeconds": 2, "timePerOutputTokenSeconds": 0.001}),
            profile,
            derived_at=NOW,
        )


def test_ttft_below_fixed_cost_is_refused() -> None:
    slow = smollm2_profile(prefill={"form": "affine", "interceptS": 0.5, "linearS": 0.003})
    with pytest.raises(DerivationError, match="fixed prefill cost"):
        derive_thresholds(policy(slo={"ttftSeconds": 0.4}), slow, derived_at=NOW)


def test_reserved_slots_leave_no_room() -> None:
    one_slot = smollm2_profile(server={"slots": 1, "ctxPerSlot": 2048}, decode=[{"streams": 1, "tokensPerSecond": 98}])
    p = policy(classes=[{"name": "a", "reservedSlots": 1}, {"name": "b"}])
    with pytest.raises(DerivationError, match="no concurrency slot"):
        derive_thresholds(p, one_slot, derived_at=NOW)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"slo": {"ttftSeconds": 0}}, "greater than 0"),
        ({"slo": {"ttftSeconds": 1, "quantile": 1.0}}, "less than 1"),
        ({"slo": {"ttftSeconds": 1}, "classes": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"slo": {"ttftSeconds": 1}, "classes": [{"name": "Bad_Name"}]}, "pattern"),
        (
            {"slo": {"ttftSeconds": 1}, "defaultClass": "x", "classes": [{"name": "a"}]},
            "not one of",
        ),
        (
            {
                "slo": {"ttftSeconds": 1},
                "concurrency": {"max": 2},
                "classes": [{"name": "a", "reservedSlots": 2}, {"name": "b"}],
            },
            "no slot",
        ),
        ({"slo": {"ttftSeconds": 1}, "sloo": 3}, "Extra inputs"),
    ],
)
def test_policy_validation(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Policy.model_validate(raw)


def test_profile_decode_points_must_be_one_to_n() -> None:
    with pytest.raises(ValidationError, match=r"B = 1\.\.N"):
        smollm2_profile(decode=[{"streams": 2, "tokensPerSecond": 69}])


def test_thresholds_round_trip_and_refuse_nonsense(profile: CalibrationProfile, two_class_policy: Policy) -> None:
    t = derive_thresholds(two_class_policy, profile, derived_at=NOW)
    wire = t.model_dump_json(by_alias=True)
    assert '"tokenBudget"' in wire
    assert Thresholds.model_validate_json(wire) == t
    raw = t.model_dump(by_alias=True, mode="json")
    raw["classes"][0]["tokenBudget"] = -5
    with pytest.raises(ValidationError, match="greater than 0"):
        Thresholds.model_validate(raw)
    raw = t.model_dump(by_alias=True, mode="json")
    raw["classes"][1]["ttftBudgetSeconds"] = 5  # lower class looser than the higher one
    with pytest.raises(ValidationError, match="larger TTFT budget"):
        Thresholds.model_validate(raw)
