"""Shared fixtures: the real llama-server, started once per session.

Integration tests run against the genuine binary and model that `make llama` installs.
When they are missing the fixtures *fail* rather than skip: CI runs `make llama` first,
so a missing runtime is a broken build, and a skip would let it pass silently.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from slogate_admission.schema import CalibrationProfile
from slogate_calibration.runtime import (
    LlamaRuntime,
    LlamaServer,
    LlamaServerError,
    RuntimeNotFound,
    locate,
)
from slogate_llama.counters import LlamaCounters

_INTEGRATION_DIR = Path(__file__).parent / "integration"

# The configuration the project is calibrated for: 2 threads, 4 slots, 8,192 KV cells
# split into 2,048 per slot.
SERVER_THREADS = 2
SERVER_PARALLEL = 4
SERVER_CTX = 8192


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark everything under tests/integration/ as `integration`.

    tryfirst: the marks must be in place before pytest's own `-m` deselection runs in this
    same hook, or `-m "not integration"` would still start the server.
    """
    for item in items:
        if item.path.is_relative_to(_INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def nginx_binary() -> str:
    """Debian's nginx, the real balancer of the fleet tests (``make test`` installs it); fails,
    never skips, if absent."""
    found = shutil.which("nginx")
    if found is None:
        pytest.fail("nginx not found: `make test` installs Debian's nginx-light (apt)", pytrace=False)
    return found


@pytest.fixture(scope="session")
def llama_runtime() -> LlamaRuntime:
    """The installed llama-server and bundled model; fails (never skips) if absent."""
    try:
        return locate()
    except RuntimeNotFound as exc:
        message = str(exc)
    # Outside the except block, so the report is the message alone, not a chained traceback.
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def llama_server(llama_runtime: LlamaRuntime, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One real llama-server (-t 2 -np 4 -c 8192, --metrics) shared by the session.

    Session scope because every test would otherwise pay the model load; tests must
    therefore compare counter deltas, never absolute counter values.
    """
    log_path = tmp_path_factory.mktemp("llama-server") / "llama-server.log"
    server = LlamaServer(
        llama_runtime,
        threads=SERVER_THREADS,
        parallel=SERVER_PARALLEL,
        ctx=SERVER_CTX,
        log_path=log_path,
    )
    try:
        server.start(timeout=180.0)
    except LlamaServerError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        pytest.fail(message, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


def wait_until_idle(server: LlamaServer, limit_s: float = 300.0) -> None:
    """Block (bounded) until llama-server reports nothing processing or deferred."""
    for _ in range(int(limit_s / 0.25)):
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
            counters = LlamaCounters.from_text(response.read().decode())
        if counters.requests_processing == 0 and counters.requests_deferred == 0:
            return
        time.sleep(0.25)


@pytest.fixture(scope="session")
def calibrated_profile_path(llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real profile of the session's llama-server, made once by the real `slogate calibrate`.

    Later tests (derivation, the sidecar, the operator) start from it, so they run on
    numbers measured on this machine, never on invented ones.
    """
    out = tmp_path_factory.mktemp("calibration") / "profile.json"
    wait_until_idle(llama_server)  # earlier tests may have left abandoned work running
    done = subprocess.run(
        [
            sys.executable, "-m", "slogate_cli.main", "calibrate",
            "--upstream", llama_server.url,
            "--server-args", shlex.join(llama_server.args[1:]),
            "--out", str(out),
            "--budget-seconds", "300",  # a slow CI machine must not fail a behaviour test
            "--no-progress",
        ],
        capture_output=True, text=True, check=False, timeout=400,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"slogate calibrate failed ({done.returncode}): {done.stderr}", pytrace=False)
    return out


@pytest.fixture(scope="session")
def calibrated_profile(calibrated_profile_path: Path) -> CalibrationProfile:
    """The session's measured profile, validated by the core's schema."""
    return CalibrationProfile.model_validate_json(calibrated_profile_path.read_text())
