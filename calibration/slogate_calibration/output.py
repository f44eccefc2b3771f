"""Writing a profile: whole or not at all, small enough for a termination message, and in one line for people.

A Job's result travels in the pod's termination message, which Kubernetes caps at
4 KiB: the compact form drops the raw prefill points and the fingerprint inputs
(the fit, the fingerprint and the stated confidence stay) and is checked against that cap.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from slogate_admission.schema import CalibrationProfile
from slogate_calibration.measure import DECODE_MIN_ROUNDS, prefill_min_timings

TERMINATION_MESSAGE_LIMIT = 4096


def full_json(profile: CalibrationProfile) -> str:
    """The profile as indented JSON (camelCase), for files."""
    return profile.model_dump_json(by_alias=True, indent=2) + "\n"


def compact_json(profile: CalibrationProfile) -> str:
    """One JSON line under 4 KiB: the profile without raw points and fingerprint inputs."""
    slim = profile.model_copy(
        update={
            "prefill": profile.prefill.model_copy(update={"points": ()}),
            "fingerprint_inputs": {},
        }
    )
    text = slim.model_dump_json(by_alias=True)
    if len(text.encode()) > TERMINATION_MESSAGE_LIMIT:
        raise ValueError(f"compact profile is {len(text.encode())} bytes, over the 4 KiB message cap")
    return text


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it.

    A run that fails or is killed leaves either the old file or none: never half a profile.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def summary_line(profile: CalibrationProfile) -> str:
    """What was measured and how well, for people: id, duration, then the stated confidence.

    E.g. ``q4_1-13b4aa9d-... in 52 s: prefill 470 tok/s ± 1.2% at 512-token prompts, decode
    60 tok/s per stream ± 0.8% at B = 4 (± one standard error; every point within the 3%
    tolerance)``. A profile without a confidence (older versions) says so."""
    head = f"{profile.id} in {profile.duration_s:.0f} s"
    c = profile.confidence
    if c is None:
        return f"{head}: no stated confidence (a profile from an older version)"
    prefill = next((p for p in profile.prefill.points if p.prompt_tokens == c.prefill_reference_tokens), None)
    prefill_rate = f"{prefill.prompt_tokens / prefill.seconds:.0f} tok/s " if prefill is not None else ""
    decode = profile.decode[c.decode_streams - 1].tokens_per_second
    unsettled = [f"{n}-token prompts" for n in c.unsettled_prefill_tokens]
    unsettled += [f"B = {b}" for b in c.unsettled_decode_streams]
    verdict = (
        f"every point within the {c.tolerance:.0%} tolerance"
        if not unsettled
        else f"above the {c.tolerance:.0%} tolerance when repetitions ran out: {', '.join(unsettled)}"
    )
    # None: a profile from a version that did not count (it ran every planned timing).
    short = [
        f"{p.prompt_tokens}-token prompts {p.timings} of {prefill_min_timings(p.prompt_tokens)}"
        for p in profile.prefill.points
        if p.timings is not None and p.timings < prefill_min_timings(p.prompt_tokens)
    ]
    short += [
        f"B = {d.streams} {d.timings} of {DECODE_MIN_ROUNDS}"
        for d in profile.decode
        if d.timings is not None and d.timings < DECODE_MIN_ROUNDS
    ]
    if short:
        verdict += f"; the budget ended before every planned timing (a busy machine): {', '.join(short)}"
    return (
        f"{head}: prefill {prefill_rate}± {c.prefill_uncertainty:.1%} at {c.prefill_reference_tokens}-token prompts, "
        f"decode {decode:.0f} tok/s per stream ± {c.decode_uncertainty:.1%} at B = {c.decode_streams} "
        f"(± one standard error; {verdict})"
    )
