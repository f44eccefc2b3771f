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


def end_group(pid_file: Path) -> None:
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.1)
        if not alive(pid):
            break
    pid_file.unlink()


def alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def kill_shims(containerd_root: Path) -> None:
    """containerd's shims (and the containers under them) outlive containerd: end them by
    their command line, which names this run's containerd."""
    marker = str(containerd_root)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim" in cmdline and marker in cmdline:
            try:
                os.killpg(int(proc.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)


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
