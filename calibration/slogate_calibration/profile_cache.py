"""The profile cache, ``<state>/profiles/<fingerprint>.json``, or else a fresh calibration.

`slogate up`, `slogate demo`, the benchmarks and the soak all go through
``cached_or_calibrated``: a cached file is used only if it is a valid CalibrationProfile
stating the fingerprint of the server asked about; anything else (absent, unreadable,
another schema, another server's) is measured again, and the new profile replaces it.

It needs nothing of slogate_bench: it belongs with slogate_calibration and can move there
as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from pydantic import ValidationError

from slogate_admission.schema import CalibrationProfile
from slogate_calibration.calibrate import CalibrationSettings, Progress, calibrate, identify_server
from slogate_calibration.output import full_json, write_atomic

Say = Callable[[str], None]
"""Where the lines for people go (one call per line)."""


@contextmanager
def no_progress() -> Iterator[Progress]:
    """Calibration hooks that show nothing."""
    yield Progress()


def profile_path(state_dir: Path, fingerprint: str) -> Path:
    """Where the profile of the server with this fingerprint is cached."""
    return state_dir / "profiles" / f"{fingerprint}.json"


async def cached_or_calibrated(
    settings: CalibrationSettings,
    state_dir: Path,
    say: Say,
    progress: Callable[[], AbstractContextManager[Progress]] = no_progress,
) -> CalibrationProfile:
    """The cached profile for the server ``settings`` names, else a new calibration (then cached).

    Identifying the server is cheap (no inference); CalibrationError if it cannot be
    identified or measured. ``progress`` gives the hooks a calibration reports to.
    """
    identity = await identify_server(settings)
    cache = profile_path(state_dir, identity.fingerprint)
    cached = read_cached(cache, identity.fingerprint, say)
    if cached is not None:
        say(f"using cached profile {cached.id} (fingerprint {identity.fingerprint})")
        return cached
    # Said with the absolute path: a relative state dir is relative to where the command runs,
    # and a run from another directory finds no cache and measures again.
    say(
        f"calibrating (fingerprint {identity.fingerprint}, budget {settings.budget_s:g} s): "
        f"no usable profile for it in {cache.parent.resolve()}"
    )
    with progress() as hooks:
        profile = await calibrate(settings, hooks)
    write_atomic(cache, full_json(profile))
    say(f"calibrated {profile.id} in {profile.duration_s:.0f} s, cached at {cache}")
    return profile


def read_cached(cache: Path, fingerprint: str, say: Say) -> CalibrationProfile | None:
    """The profile in ``cache`` if it is one, for ``fingerprint``; None otherwise (said if unreadable)."""
    if not cache.exists():
        return None
    try:
        profile = CalibrationProfile.model_validate_json(cache.read_text())
    except (OSError, ValidationError):
        say(f"cached profile {cache} is unreadable: calibrating again")
        return None
    # A file renamed or copied under another server's name is never trusted.
    return profile if profile.fingerprint == fingerprint else None
