"""Fixtures for the core's tests."""

import pytest

from canned_profiles import smollm2_profile
from slogate_admission.schema import CalibrationProfile, Policy


@pytest.fixture
def profile() -> CalibrationProfile:
    return smollm2_profile()


@pytest.fixture
def two_class_policy() -> Policy:
    return Policy.model_validate(
        {
            "slo": {"timePerOutputTokenSeconds": 0.05},  # both classes set their own TTFT SLO
            "concurrency": {"max": 4},
            "classes": [
                {"name": "interactive", "ttftSeconds": 1.0, "reservedSlots": 1},
                {"name": "batch", "ttftSeconds": 10},
            ],
        }
    )
