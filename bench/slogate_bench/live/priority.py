"""CPU priority of the benchmark's processes: the nice of every thread, and the session's autogroup.

Linux keeps a nice value per thread, so renicing a running process means renicing each of
its threads (and its children's). And where autogroup is on (``kernel.sched_autogroup_enabled``
= 1, processes in the root cpu cgroup, as on this machine), the scheduler first shares the
CPU between *sessions*, equally unless a session's group has its own nice
(``/proc/PID/autogroup``); a thread's nice only weighs against threads of its own session.
llama-server is started in a session of its own (``LlamaServer`` uses ``start_new_session``),
so its ``nice -n 10`` weighs only against its own threads: the lever that does lower it
against the gate is its group's nice. The reject-latency benchmark measures both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

AUTOGROUP = re.compile(r"^/autogroup-(\d+) nice (-?\d+)$")
AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")


def parse_autogroup(text: str) -> tuple[int, int]:
    """``/autogroup-262 nice 0`` (a /proc/PID/autogroup) -> (262, 0)."""
    found = AUTOGROUP.match(text.strip())
    if found is None:
        raise ValueError(f"not an autogroup line: {text!r}")
    return int(found.group(1)), int(found.group(2))


def autogroup_enabled() -> bool:
    """Whether the kernel groups the CPU by session (False where it cannot say)."""
    try:
        return AUTOGROUP_SWITCH.read_text().strip() == "1"
    except OSError:
        return False


def autogroup(pid: int) -> tuple[int, int]:
    """(group id, group nice) of ``pid``'s session."""
    return parse_autogroup(Path(f"/proc/{pid}/autogroup").read_text())


def set_autogroup_nice(pid: int, nice: int) -> None:
    """Give ``pid``'s session group this nice. Refused (ValueError) for the benchmark's own
    session: that would reprioritize everything started from the same terminal."""
    if autogroup(pid)[0] == autogroup(os.getpid())[0]:
        raise ValueError(f"pid {pid} shares the benchmark's own autogroup: not changing it")
    Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def descendants(parents: Mapping[int, int], root: int) -> list[int]:
    """``root`` and every process below it, given each process's parent (pid -> ppid)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(sorted(children.get(pid, ())))
    return found


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # The command may hold spaces and parentheses: the fields follow the last ")".
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            parents[int(entry.name)] = int(fields[1])
    return parents


def threads(pids: Iterable[int]) -> list[int]:
    """Every thread id of these processes."""
    found: list[int] = []
    for pid in pids:
        try:
            found.extend(int(task.name) for task in Path(f"/proc/{pid}/task").iterdir())
        except OSError:  # gone meanwhile
            continue
    return found


def renice_tree(root: int, nice: int) -> int:
    """Set the nice of every thread of ``root`` and its descendants; how many threads were set."""
    done = 0
    for tid in threads(descendants(_parents(), root)):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue
        done += 1
    return done


def nice_of(pid: int) -> int:
    """The nice of ``pid`` (its main thread)."""
    return os.getpriority(os.PRIO_PROCESS, pid)
