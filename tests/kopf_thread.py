"""The real operator (``kopf run --standalone -A -m slogate_operator.handlers``) in kopf's
KopfRunner thread, pointed at an emulated cluster, and what the tests read of it in-process.

A test that runs it is marked ``kopf_thread`` (registered in pyproject.toml), so that
``pytest -m "not kopf_thread"`` runs the rest; the operator tests' conftest makes
``running_operator`` refuse to start in a test that is not marked.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from kopf.testing import KopfRunner

from api_cluster import NS, Cluster
from polling import eventually
from ports import free_ports
from slogate_operator import metrics

MARKER = "kopf_thread"
TEST_SETTINGS = {
    "STANDALONE": "true",
    "RESYNC_SECONDS": "0.5",
    "ERROR_BACKOFF_SECONDS": "0.2",
    "CALIBRATION_RETRY_SECONDS": "1",
    "PUSH_ATTEMPTS": "2",
    "PUSH_BACKOFF_SECONDS": "0.05",
    "PUSH_TIMEOUT_SECONDS": "2",
    "API_BACKOFF_SECONDS": "0.05",
    "METRICS_PORT": "0",
    "LIVENESS_PORT": "0",
    "IMAGE": "slogate:test",
    "STARTUP_JITTER_SECONDS": "0",
    "COALESCE_SECONDS": "0.05",
    "WEBHOOK_ADDRESS": "127.0.0.1",
    "WEBHOOK_SETTLE_SECONDS": "0.3",
}
_unmarked: list[str] = []
"""The test under way, if it is not marked ``kopf_thread`` (set by ``only_when_marked``)."""


@contextlib.contextmanager
def only_when_marked(test: str, marked: bool) -> Iterator[None]:
    """While ``test`` runs, ``running_operator`` fails unless the test is marked ``kopf_thread``."""
    _unmarked[:] = [] if marked else [test]
    try:
        yield
    finally:
        _unmarked.clear()


@contextlib.contextmanager
def running_operator(cluster: Cluster, **settings: str) -> Iterator[KopfRunner]:
    """The real operator, in kopf's test runner thread, against the cluster."""
    if _unmarked:
        raise AssertionError(f"{_unmarked[0]} runs kopf in a thread: mark it with pytest.mark.{MARKER}")
    (port,) = free_ports()
    # The API server calls the operator's injection webhook here, on loopback.
    webhook = {"WEBHOOK_PORT": str(port), "WEBHOOK_URL": f"https://127.0.0.1:{port}"}
    env = {f"SLOGATE_OPERATOR_{k}": v for k, v in {**TEST_SETTINGS, **webhook, **settings}.items()}
    env["SLOGATE_OPERATOR_KUBE_API"] = cluster.url
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        with KopfRunner(["run", "--standalone", "-A", "-m", "slogate_operator.handlers"], timeout=30) as runner:
            yield runner
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def passes(name: str, ns: str = NS) -> float:
    """Completed reconcile passes of a policy (the operator runs in this process)."""
    value = metrics.REGISTRY.get_sample_value(
        "slogate_operator_reconciles_total", {"namespace": ns, "policy": name, "result": "ok"}
    )
    return value or 0.0


def settle(name: str, ns: str = NS, more: int = 2) -> None:
    """Wait until the operator has run ``more`` further passes over the policy."""
    target = passes(name, ns) + more
    eventually(lambda: passes(name, ns) >= target, what=f"{more} more reconcile passes of {ns}/{name}")
