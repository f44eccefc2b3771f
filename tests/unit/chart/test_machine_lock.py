"""e2e/kube/machine_lock.py: one slogate cluster per machine, a second run waits for the first
(two at once would share one bridge, one set of KUBE-* chains and one kubepods cgroup), and a
run killed outright frees the machine. The holder here is another process, as it is for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from chart_tools import E2E, load_e2e

SOURCE = E2E / "kube" / "machine_lock.py"
HOLDER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from machine_lock import MachineLock
lock = MachineLock(Path(sys.argv[2]))
lock.acquire(Path("/tmp/slogate-cluster-other"), wait_s=0)
print("held", flush=True)
sys.stdin.readline()
lock.release()
print("released", flush=True)
sys.stdin.readline()
"""


machine_lock = load_e2e("kube/machine_lock")


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock file tmp_path/lock; a line on its stdin releases it."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(SOURCE.parent), str(tmp_path / "lock")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def test_a_second_run_that_cannot_wait_is_told_who_holds_the_machine(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    lock = machine_lock.MachineLock(tmp_path / "lock", poll_s=0.05)
    with pytest.raises(machine_lock.MachineBusyError) as refused:
        lock.acquire(tmp_path / "mine", wait_s=0)
    message = str(refused.value)
    assert f"pid {holder.pid}, run directory /tmp/slogate-cluster-other" in message
    assert "cluster.py down" in message
    assert machine_lock.WAIT_ENV in message
    assert not lock.held


def test_a_second_run_waits_and_takes_the_machine_when_the_first_lets_go(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    lock = machine_lock.MachineLock(tmp_path / "lock", poll_s=0.05)
    said: list[str] = []
    waiting = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        waiting.set()

    def let_go() -> None:
        waiting.wait()
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()

    releaser = threading.Thread(target=let_go)
    releaser.start()
    lock.acquire(tmp_path / "mine", wait_s=600, say=say)
    releaser.join()
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "released"  # it let go before this run took it
    assert lock.held
    assert len(said) == 1, said  # told once, not at every poll
    assert f"pid {holder.pid}, run directory /tmp/slogate-cluster-other" in said[0]
    assert lock.holder() == f"pid {os.getpid()}, run directory {tmp_path / 'mine'}"
    lock.release()
    lock.release()  # idempotent
    assert not lock.held


def test_a_run_killed_outright_frees_the_machine(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = machine_lock.MachineLock(tmp_path / "lock")
    lock.acquire(tmp_path / "mine", wait_s=0)
    assert lock.held
    lock.release()


def test_the_wait_comes_from_the_environment_and_a_wrong_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(machine_lock.WAIT_ENV, raising=False)
    assert machine_lock.wait_from_environment() == machine_lock.DEFAULT_WAIT_S
    monkeypatch.setenv(machine_lock.WAIT_ENV, "90")
    assert machine_lock.wait_from_environment() == 90.0
    monkeypatch.setenv(machine_lock.WAIT_ENV, "an hour")
    with pytest.raises(ValueError, match=f"{machine_lock.WAIT_ENV}='an hour'"):
        machine_lock.wait_from_environment()
