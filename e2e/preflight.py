#!/usr/bin/env python3
"""Can the kind end-to-end suite run here? `make e2e` asks this first.

Exit 0: docker (with a running engine), kind, kubectl and helm are all there.
Exit 3: something is missing; one line says what, and `make e2e` then exits 0 (skipped).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable

SKIPPED = 3
TOOLS = ("docker", "kind", "kubectl", "helm")
NEEDS = "docker (with a running engine), kind, kubectl and helm"


def docker_engine_answers(docker: str) -> bool:
    """`docker info` reaches an engine (the client alone cannot build or run kind)."""
    try:
        done = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def missing_tools(
    which: Callable[[str], str | None] = shutil.which,
    engine_answers: Callable[[str], bool] = docker_engine_answers,
) -> list[str]:
    """What is missing, in the order of TOOLS (empty: ready)."""
    missing: list[str] = []
    for tool in TOOLS:
        path = which(tool)
        if path is None:
            missing.append(tool)
        elif tool == "docker" and not engine_answers(path):
            missing.append("a Docker engine (`docker info` failed)")
    return missing


def skip_line(missing: list[str]) -> str:
    return f"e2e skipped: needs {NEEDS} (missing: {', '.join(missing)})"


def main() -> int:
    missing = missing_tools()
    if missing:
        print(skip_line(missing), flush=True)
        return SKIPPED
    return 0


if __name__ == "__main__":
    sys.exit(main())
