"""What the kernel's process table says of a process (Linux's /proc), for tests that kill parents."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces): state, ppid, ..."""
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def gone(pid: int) -> bool:
    """No such process, or only its zombie (killed, not yet reaped by whoever adopted it)."""
    try:
        return _stat_fields(pid)[0] == "Z"
    except FileNotFoundError:
        return True


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat_fields(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found
