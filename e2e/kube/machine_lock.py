"""One slogate cluster per machine at a time, and a second run waits for the first.

A cluster owns things the machine has only one of: the bridge `slogate0` and its addresses,
kube-proxy's `KUBE-*` iptables chains, the cgroups `kubepods` and `k8s.io`, the API server's
port. Two runs at once (a developer's `make test` beside CI's on one machine) would each break
the other. So the run that starts a cluster holds an exclusive flock(2) on one file of the
machine until its cluster is stopped, and a second run waits for it instead of failing at once.

flock suits this: the kernel drops the lock with the last descriptor of its holder, so a run
killed with SIGKILL frees it too (its cluster's leftovers are then the network's concern:
`link slogate0 exists`, with the command that removes it). The descriptor is not inherited
(Python opens files close-on-exec and subprocess closes the rest), so a component left running
by a crashed run never holds the machine.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

DEFAULT_PATH = Path("/run/lock/slogate-cluster.lock")
WAIT_ENV = "SLOGATE_CLUSTER_WAIT_S"
DEFAULT_WAIT_S = 2700.0
"""45 minutes: longer than a whole e2e suite here (about 17), within CI's 90 with room for ours."""


class MachineBusyError(RuntimeError):
    """Another run's cluster held the machine for the whole wait."""


def wait_from_environment() -> float:
    raw = os.environ.get(WAIT_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_WAIT_S
    except ValueError:
        raise ValueError(f"{WAIT_ENV}={raw!r}: seconds to wait for another cluster, a number") from None


@dataclass
class MachineLock:
    """Held from `acquire()` to `release()` (both idempotent) by the process that runs a cluster."""

    path: Path = DEFAULT_PATH
    poll_s: float = 2.0
    """How often a waiting run tries again."""
    _file: IO[str] | None = field(default=None, init=False, repr=False)

    @property
    def held(self) -> bool:
        return self._file is not None

    def holder(self) -> str:
        """What the holder wrote: its pid and its run's directory (empty if nobody ever held it)."""
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    def acquire(self, workdir: Path, *, wait_s: float, say: Callable[[str], None] = print) -> None:
        """Take the machine for the cluster in `workdir`, waiting up to `wait_s` for another run's.

        Raises MachineBusyError, naming the holder, when the wait runs out."""
        if self.held:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.close()
                    raise MachineBusyError(
                        f"another slogate cluster held this machine for all of {wait_s:g} s ({self.holder()}); "
                        f"wait for it, stop it (`python3 e2e/kube/cluster.py down DIR`), or set {WAIT_ENV}"
                    ) from None
                if not told:
                    say(f"waiting up to {wait_s:g} s for another slogate cluster to stop ({self.holder()})")
                    told = True
                time.sleep(self.poll_s)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, run directory {workdir}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is None:
            return
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
        self._file = None
