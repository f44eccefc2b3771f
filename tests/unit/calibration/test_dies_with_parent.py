"""A llama-server the CLI starts never outlives the process that started it, however that ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from process_table import gone
from slogate_calibration.runtime import dies_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")


def wait_until(check: object, attempts: int = 600) -> bool:
    for _ in range(attempts):
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def start_parent(arm: bool) -> tuple[subprocess.Popen[str], int]:
    """A Python parent that starts ``sleep 600`` as LlamaServer starts llama-server (its own
    session, with or without ``dies_with_parent``) and prints the child's pid."""
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        from slogate_calibration.runtime import dies_with_parent
        child = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                 preexec_fn=dies_with_parent(os.getpid()) if {arm} else None)
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def test_a_child_armed_dies_when_its_parent_is_killed_and_one_unarmed_does_not() -> None:
    armed_parent, armed = start_parent(arm=True)
    bare_parent, bare = start_parent(arm=False)
    try:
        for parent in (armed_parent, bare_parent):
            parent.send_signal(signal.SIGKILL)
            parent.wait()
        assert wait_until(lambda: gone(armed))
        assert not gone(bare)  # the check can fail: without it, the child lives on
    finally:
        for pid in (armed, bare):
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_armed_child_of_a_parent_already_gone_exits_at_once() -> None:
    """Armed for a parent that is not its parent (as if it died between fork and prctl)."""
    arm = dies_with_parent(os.getpid() + 10**6)
    assert arm is not None
    child = subprocess.run(["sleep", "600"], preexec_fn=arm, check=False, timeout=60)
    assert child.returncode == 1
