"""`slogate operator` as the chart runs it: a process, settings from the environment and
flags, liveness and metrics endpoints, a clean exit on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

from api_cluster import DEPLOYMENTS, POLICIES, Cluster
from manifests import admission_policy, llama_deployment
from polling import eventually
from workload_controllers import job_names


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def test_slogate_operator_runs_serves_health_and_metrics_and_stops_on_sigterm(cluster: Cluster) -> None:
    liveness, metrics = free_port(), free_port()
    env = dict(os.environ, SLOGATE_OPERATOR_KUBE_API=cluster.url, SLOGATE_OPERATOR_RESYNC_SECONDS="0.5",
               SLOGATE_OPERATOR_IMAGE="registry.example/slogate:from-env")  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "slogate_cli.main", "operator", "--standalone", "--all-namespaces",
         "--liveness-port", str(liveness), "--metrics-port", str(metrics), "--image", "registry.example/slogate:flag"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        cluster.create(DEPLOYMENTS, llama_deployment())
        cluster.create(POLICIES, admission_policy())
        (job,) = eventually(lambda: job_names(cluster), what="a Job from the operator process")
        calibrator = cluster.get("/apis/batch/v1/namespaces/{ns}/jobs", job)["spec"]["template"]["spec"]["containers"][
            0
        ]
        assert calibrator["image"] == "registry.example/slogate:flag"  # the flag beats the environment
        assert eventually(lambda: fetch(f"http://127.0.0.1:{liveness}/healthz"))[0] == 200
        text = eventually(
            lambda: (t := fetch(f"http://127.0.0.1:{metrics}/metrics")[1]) and 'type="Calibrated"' in t and t
        )
        assert 'slogate_operator_policy_condition{namespace="llm",policy="smollm2",type="Calibrated"} 0.0' in text
        assert (
            'slogate_operator_alerting_rejection_ratio{namespace="llm",policy="smollm2",severity="warning"} 0.05'
            in text
        )
        assert 'slogate_operator_calibrations_total{namespace="llm",outcome="started",policy="smollm2"} 1.0' in text
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output[-2000:]


def test_a_bad_setting_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", "operator", "--standalone"],
        env=dict(os.environ, SLOGATE_OPERATOR_RESYNC_SECONDS="soon"), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "slogate operator: error: SLOGATE_OPERATOR_RESYNC_SECONDS='soon': could not convert string to float: 'soon'"
    ]
