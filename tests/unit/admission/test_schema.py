"""Schema boundaries the derivation cannot exercise: documents arriving from outside (a push, a file)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from canned_profiles import NOW, smollm2_profile
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy, Thresholds


def test_thresholds_need_at_least_one_decode_point() -> None:
    document = derive_thresholds(Policy.model_validate({"slo": {"ttftSeconds": 2}}), smollm2_profile(),
                                 derived_at=NOW).model_dump(mode="json", by_alias=True)  # fmt: skip
    assert Thresholds.model_validate(document).decode_tokens_per_second  # the derived document is valid
    document["decodeTokensPerSecond"] = []
    with pytest.raises(ValidationError, match="decodeTokensPerSecond"):
        Thresholds.model_validate(document)
