"""Two replicas of `slogate operator` with kopf peering: one acts, the other waits, and takes
over when the active one dies (here with a 3 s peering lifetime instead of 60 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from api_cluster import DEPLOYMENTS, POLICIES, Cluster
from canned_profiles import smollm2_profile
from manifests import admission_policy, condition, llama_deployment
from polling import eventually
from ports import free_ports
from slogate_calibration.output import compact_json
from slogate_operator import names
from workload_controllers import complete_job, containers_of_a_new_pod, job_names

PEERING = "/apis/kopf.dev/v1/clusterkopfpeerings/slogate"


class Replica:
    """One `slogate operator` process, its output collected line by line."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        (port,) = free_ports()  # each replica serves the injection webhook: the active one's entry names it
        env = dict(
            os.environ, SLOGATE_OPERATOR_KUBE_API=cluster.url, SLOGATE_OPERATOR_RESYNC_SECONDS="0.5",
            SLOGATE_OPERATOR_PEERING_LIFETIME_SECONDS="3", SLOGATE_OPERATOR_METRICS_PORT="0",
            SLOGATE_OPERATOR_LIVENESS_PORT="0", POD_ID=name, SLOGATE_OPERATOR_WEBHOOK_PORT=str(port),
            SLOGATE_OPERATOR_WEBHOOK_URL=f"https://127.0.0.1:{port}", SLOGATE_OPERATOR_WEBHOOK_ADDRESS="127.0.0.1",
        )  # fmt: skip
        self.name = name
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "slogate_cli.main", "operator", "--peering", "slogate", "--log-format", "plain"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def said(self, words: str) -> bool:
        return any(words in line for line in list(self.lines))

    def active(self) -> bool:
        """kopf starts paused; its last peering verdict says whether it acts now."""
        verdicts = [line for line in list(self.lines) if line.startswith(("Resuming operations", "Pausing"))]
        return bool(verdicts) and verdicts[-1].startswith("Resuming")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=60)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    made.request("POST", PEERING.rsplit("/", 1)[0],
                 {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "slogate"}})  # fmt: skip
    yield made
    made.close()


def test_one_replica_acts_the_other_waits_then_takes_over(cluster: Cluster) -> None:
    replicas = [Replica(cluster, "operator-a"), Replica(cluster, "operator-b")]
    try:
        # Random priorities differ: the higher one acts, the lower one waits (never both paused).
        peers = eventually(
            lambda: len(p := cluster.request("GET", PEERING).get("status") or {}) == 2 and p, what="two peers"
        )
        by_name = {r.name: r for r in replicas}
        active = by_name[max(peers, key=lambda name: peers[name]["priority"])]
        standby = next(r for r in replicas if r is not active)
        eventually(lambda: active.active() and not standby.active(), what="one acting, one waiting")
        assert not any(r.said("Pausing all operators") for r in replicas)  # no same-priority deadlock
        cluster.create(DEPLOYMENTS, llama_deployment())
        cluster.create(POLICIES, admission_policy())
        (job,) = eventually(lambda: job_names(cluster), what="a Job from the active replica")
        assert eventually(lambda: active.said("calibration Job"))
        assert not standby.said("calibration Job")
        # The active replica dies without a goodbye; the standby's peer record outlives it by the lifetime.
        active.stop(signal.SIGKILL)
        eventually(lambda: standby.said("Resuming operations"), what="the standby resuming")
        complete_job(cluster, job, compact_json(smollm2_profile()))
        eventually(lambda: condition(cluster.get(POLICIES, "smollm2"), "Ready").get("status") == "True")
        assert standby.said("calibration smollm2-cal-")  # it read the Job the other one started
        assert job_names(cluster) == [job]
        # The replica left serves the injection webhook alone (its CA in the bundle).
        assert containers_of_a_new_pod(cluster, "smollm2") == ["llama", names.SIDECAR_CONTAINER]
    finally:
        for replica in replicas:
            replica.stop()
