"""Writing a profile: whole or not at all, and small enough for a termination message.

A Job's result travels in the pod's termination message, which Kubernetes caps at
4 KiB: the compact form drops the raw prefill points and the fingerprint inputs
(the fit and the fingerprint stay) and is checked against that cap.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from slogate_admission.schema import CalibrationProfile

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
