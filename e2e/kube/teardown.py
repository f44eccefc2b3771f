"""Ending what a cluster run started and removing what it made on the machine: process
groups (containerd's shims, which outlive containerd, included), the kubelet's mounts, the
node's cgroups. Each step is idempotent, so a crashed run is cleaned by running it again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def end_processes(marker: str, order: tuple[str, ...], *, grace_s: float = 15.0) -> None:
    """End the processes whose executable is order[0], then order[1], ..., of those whose command
    line names `marker` (the run's directory: each component is started with a path in it, and
    so are containerd's shims). SIGTERM, then SIGKILL after `grace_s`. Found by their command
    lines, not remembered pids, so it also cleans a run that crashed; a shell or a wrapper that
    happens to name the directory is not in `order`, and is left alone."""
    found = processes_naming(marker)
    for name in order:
        _end([pid for pid, exe in found.items() if exe == name], grace_s)


def processes_naming(marker: str) -> dict[int, str]:
    """pid -> executable name of every process whose command line contains `marker`."""
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and any(marker.encode() in arg for arg in argv):
            found[int(proc.name)] = os.path.basename(argv[0].decode(errors="replace"))
    return found


def _end(pids: list[int], grace_s: float) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.1)
        pids = [pid for pid in pids if _alive(pid)]
        if not pids:
            return


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)  # our own children are reaped here
        if done == pid:
            return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def unmount_below(directory: Path) -> None:
    prefix = str(directory.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def remove_cgroups(name: str) -> None:
    """The node's cgroups, deepest first (a cgroup with no process left can be removed)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def kill_cgroup_processes(name: str, *, wait_s: float = 10.0) -> None:
    """SIGKILL every process left in the node's cgroups (its containers: a killed shim leaves
    them running, reparented to init), until none is left or `wait_s` passes."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = cgroup_processes(name)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def cgroup_processes(name: str) -> set[int]:
    """The pids in any cgroup under `name`, in every hierarchy."""
    found: set[int] = set()
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                found.update(int(p) for p in procs.read_text().split())
    return found


NETNS_DIR = Path("/var/run/netns")
"""Where the CNI plugins pin each pod sandbox's network namespace (`cni-<uuid>`)."""


def network_namespaces() -> set[str]:
    """The names of the pod network namespaces on the machine (the `cni-*` under NETNS_DIR)."""
    return {p.name for p in NETNS_DIR.glob("cni-*")} if NETNS_DIR.is_dir() else set()


def remove_network_namespaces(names: set[str]) -> None:
    """Unpin and delete these namespaces, each only when no process is left in it. A runtime
    killed before it tore its sandboxes down leaves them pinned (a bind mount of nsfs)."""
    for name in sorted(names):
        inside = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
        if inside.returncode == 0 and not inside.stdout.strip():
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
