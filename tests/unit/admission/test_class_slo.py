"""One meaning of ``slo.ttftSeconds``: the TTFT SLO of every class that sets none of its own.

Required only when some class (or the implicit single class ``default``) has no
``ttftSeconds``; refused when every class sets its own, since it would then apply to none.
"""

import pytest
from pydantic import ValidationError

from canned_profiles import NOW, smollm2_profile
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy


def slos(raw: dict[str, object]) -> dict[str, float]:
    t = derive_thresholds(Policy.model_validate(raw), smollm2_profile(), derived_at=NOW)
    return {c.name: c.ttft_slo_seconds for c in t.classes}


def test_the_policy_slo_is_that_of_every_class_without_its_own() -> None:
    classes = [{"name": "interactive", "ttftSeconds": 1.0}, {"name": "batch"}]
    assert slos({"slo": {"ttftSeconds": 20}, "classes": classes}) == {"interactive": 1.0, "batch": 20.0}
    assert slos({"slo": {"ttftSeconds": 50}, "classes": classes}) == {"interactive": 1.0, "batch": 50.0}
    assert slos({"slo": {"ttftSeconds": 3}}) == {"default": 3.0}


def test_classes_that_all_set_their_own_need_no_policy_slo_nor_an_slo_object() -> None:
    classes = [{"name": "interactive", "ttftSeconds": 1.0}, {"name": "batch", "ttftSeconds": 10}]
    assert slos({"classes": classes}) == {"interactive": 1.0, "batch": 10.0}
    assert slos({"slo": {"timePerOutputTokenSeconds": 0.05}, "classes": classes}) == {"interactive": 1.0, "batch": 10.0}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {
                "slo": {"ttftSeconds": 2},
                "classes": [{"name": "interactive", "ttftSeconds": 1}, {"name": "batch", "ttftSeconds": 10}],
            },
            "slo.ttftSeconds applies to no class: every class (interactive, batch) sets its own ttftSeconds; "
            "remove slo.ttftSeconds",
        ),
        (
            {"classes": [{"name": "interactive", "ttftSeconds": 1}, {"name": "batch"}, {"name": "bulk"}]},
            "slo.ttftSeconds is required: it is the TTFT SLO of the classes without their own ttftSeconds "
            "(batch, bulk)",
        ),
        (
            {"slo": {"quantile": 0.5}},
            "slo.ttftSeconds is required: it is the TTFT SLO of the one class, default, when no classes are listed",
        ),
        ({}, "slo.ttftSeconds is required"),
    ],
)
def test_a_policy_slo_that_applies_to_no_class_or_is_missing_is_refused(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Policy.model_validate(raw)
    assert message in str(refused.value)
