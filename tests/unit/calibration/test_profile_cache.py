"""The profile cache: used only when valid and for the server's own fingerprint, else measured again."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from canned_profiles import smollm2_profile
from slogate_admission.schema import CalibrationProfile
from slogate_calibration import profile_cache
from slogate_calibration.calibrate import CalibrationSettings, Progress
from slogate_calibration.profile_cache import cached_or_calibrated, profile_path

FINGERPRINT = "f" * 16  # the canned profile's


@dataclass
class FakeServer:
    """identify_server and calibrate, for a server with ``fingerprint``; counts calibrations."""

    fingerprint: str = FINGERPRINT
    calibrations: list[Progress | None] = field(default_factory=list)

    async def identify_server(self, _settings: CalibrationSettings) -> FakeServer:
        return self

    async def calibrate(self, _settings: CalibrationSettings, hooks: Progress | None = None) -> CalibrationProfile:
        self.calibrations.append(hooks)
        return smollm2_profile(id="cal-fresh", fingerprint=self.fingerprint, durationS=52.4)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    fake = FakeServer()
    monkeypatch.setattr(profile_cache, "identify_server", fake.identify_server)
    monkeypatch.setattr(profile_cache, "calibrate", fake.calibrate)
    return fake


async def profile_for(state: Path) -> tuple[CalibrationProfile, list[str]]:
    said: list[str] = []
    settings = CalibrationSettings(upstream="http://127.0.0.1:9", budget_s=120)
    profile = await cached_or_calibrated(settings, state, said.append)
    return profile, said


async def test_a_cached_profile_for_the_same_fingerprint_is_used(server: FakeServer, tmp_path: Path) -> None:
    cached = smollm2_profile(id="cal-cached")
    profile_path(tmp_path, FINGERPRINT).parent.mkdir(parents=True)
    profile_path(tmp_path, FINGERPRINT).write_text(cached.model_dump_json(by_alias=True))
    profile, said = await profile_for(tmp_path)
    assert profile == cached
    assert server.calibrations == []
    assert said == [f"using cached profile cal-cached (fingerprint {FINGERPRINT})"]


@pytest.mark.parametrize(
    ("cached", "unreadable"),
    [
        (None, False),  # nothing cached
        (smollm2_profile(id="other", fingerprint="0" * 16).model_dump_json(by_alias=True), False),  # another server's
        ('{"id": "half a profi', True),  # not JSON
        ('{"id": "x"}', True),  # JSON, not a profile
    ],
)
async def test_anything_else_is_measured_again_and_replaces_it(
    server: FakeServer, tmp_path: Path, cached: str | None, unreadable: bool
) -> None:
    cache = profile_path(tmp_path, FINGERPRINT)
    if cached is not None:
        cache.parent.mkdir(parents=True)
        cache.write_text(cached)
    profile, said = await profile_for(tmp_path)
    assert profile.id == "cal-fresh"
    assert len(server.calibrations) == 1
    assert CalibrationProfile.model_validate_json(cache.read_text()) == profile  # the cache now holds it
    assert said == [
        *([f"cached profile {cache} is unreadable: calibrating again"] if unreadable else []),
        f"calibrating (fingerprint {FINGERPRINT}, budget 120 s): no usable profile for it in {cache.parent.resolve()}",
        f"calibrated cal-fresh in 52 s, cached at {cache}",
    ]
    again, said = await profile_for(tmp_path)
    assert (again, len(server.calibrations)) == (profile, 1)  # the next run uses it
