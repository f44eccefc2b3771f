"""The end-to-end suite's parts that run without a cluster: its preflight (which fails, never
skips), what it deploys, its parsers and checks."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from chart_tools import E2E, REPO, load_e2e, load_values, one, render

from canned_profiles import NOW, smollm2_profile
from slogate_admission.decision import GateConfig, LiveState, Request, decide
from slogate_admission.derivation import derive_thresholds
from slogate_admission.schema import Policy
from slogate_sidecar.metrics import SidecarMetrics

tools = load_e2e("cluster_tools")
suite = load_e2e("suite")
state = load_e2e("workload_state")


# ---------------------------------------------------------------- preflight: fail, never skip


def test_preflight_names_what_is_missing_and_fails(tmp_path: Path) -> None:
    """With nothing built, the suite's preflight fails (exit 1) with one line naming the make
    targets that build the parts: `make test` must never pass by skipping the real cluster."""
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "SLOGATE_KUBE_CACHE": str(tmp_path / "empty")}
    ran = subprocess.run([sys.executable, str(E2E / "preflight.py")], env=env, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert ran.returncode == 1
    (line,) = ran.stdout.splitlines()
    assert line.startswith("the real cluster cannot start: ")
    assert "`make kube` builds them" in line
    assert "`make kube-images` builds them" in line
    suite_run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "e2e/pytest.ini", "e2e", "--collect-only", "-q"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert suite_run.returncode == 1
    assert "the real cluster cannot start" in suite_run.stdout + suite_run.stderr


def test_make_test_does_not_collect_the_e2e_suite() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'testpaths = ["tests"]' in pyproject


# ---------------------------------------------------------------- what the suite deploys


def test_the_suite_follows_the_example_and_installs_the_image_it_builds() -> None:
    example = suite.Example([d for d in __import__("yaml").safe_load_all(suite.EXAMPLE.read_text()) if d])
    assert (example.deployment, example.policy, example.service) == ("smollm2", "smollm2", "smollm2")
    assert example.llama_container in [c["name"] for c in example.pod_spec["containers"]]
    assert any("gguf" in image for image in example.images), "the model image e2e/model.Dockerfile builds"
    assert example.replicas >= 2, "'every sidecar' needs more than one"
    assert "-t" in next(c for c in example.pod_spec["containers"] if c["name"] == example.llama_container)["args"]
    operator = one(render(load_values(E2E / "values.yaml")), "Deployment", "-operator").obj
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == suite.SLOGATE_IMAGE
    assert container["imagePullPolicy"] == "Never"  # the image built and imported on the node, nothing pulled
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SLOGATE_OPERATOR_IMAGE"] == suite.SLOGATE_IMAGE  # sidecars and calibration Jobs too


def example() -> Any:
    return suite.Example([d for d in __import__("yaml").safe_load_all(suite.EXAMPLE.read_text()) if d])


def test_the_example_serves_through_the_port_name_the_gate_takes_over() -> None:
    """What the suite's steps rely on: the Service targets llama-server's port by name (so it
    reaches llama-server before the first calibration and after removal, the gate between),
    and llama-server listens beyond loopback (else nothing answers without the gate). The
    example has no NetworkPolicy of its own: the operator keeps one on the gated pods."""
    found = example()
    assert found.target_port == "http"
    assert found.llama_port == 8080
    assert found.service_port == 80
    assert (found.sidecar_port("port"), found.sidecar_port("adminPort")) == (8081, 8082)
    assert found.llama_port not in (found.sidecar_port("port"), found.sidecar_port("adminPort"))
    args = found.llama_spec["args"]
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--port") + 1] == str(found.llama_port)
    assert [d["kind"] for d in found.workload_documents] == ["Deployment", "Service"]


def test_model_image_puts_the_gguf_where_the_example_copies_it_from() -> None:
    example = suite.Example([d for d in __import__("yaml").safe_load_all(suite.EXAMPLE.read_text()) if d])
    (init,) = example.pod_spec["initContainers"]
    source = next(arg for arg in init["command"] if arg.endswith(".gguf"))
    dockerfile = (E2E / "model.Dockerfile").read_text()
    assert f" {source}\n" in dockerfile
    assert "\nUSER 65532:65532\n" in dockerfile


def test_with_threads_changes_only_the_thread_count() -> None:
    args = ["-m", "/model/x.gguf", "-t", "2", "-np", "4"]
    assert state.with_threads(args, 1) == ["-m", "/model/x.gguf", "-t", "1", "-np", "4"]
    assert state.with_threads(["--threads", "4"], 1) == ["--threads", "1"]
    assert state.with_threads(["-m", "x"], 3) == ["-m", "x", "-t", "3"]
    assert args == ["-m", "/model/x.gguf", "-t", "2", "-np", "4"]  # not mutated


# ---------------------------------------------------------------- helpers


def test_port_forward_announcements_are_parsed() -> None:
    assert tools.parse_forwarding("Forwarding from 127.0.0.1:43127 -> 8082\n") == 43127
    assert tools.parse_forwarding("Forwarding from [::1]:43127 -> 8082") is None
    assert tools.parse_forwarding("Handling connection for 43127") is None


def test_failed_commands_and_waits_say_where_to_look() -> None:
    with pytest.raises(tools.CommandError, match=r"(?s)exit code 3.*boom.*Look at: the logs"):
        tools.run(["sh", "-c", "echo boom >&2; exit 3"], hint="the logs")
    with pytest.raises(tools.CommandError, match="is not installed"):
        tools.run(["slogate-no-such-binary"], hint="PATH")
    seen: list[int] = []

    def never() -> None:
        seen.append(1)

    with pytest.raises(tools.WaitTimeoutError, match=r"(?s)the thing: not within 0 s.*Look at: kubectl get things"):
        tools.wait_until("the thing", never, timeout_s=0, interval_s=0, hint="kubectl get things")
    assert len(seen) == 1
    answers = iter([None, None, "ready"])
    assert tools.wait_until("soon", lambda: next(answers), timeout_s=60, interval_s=0, hint="") == "ready"


def test_conditions_are_read_from_a_policy_status() -> None:
    policy: dict[str, Any] = {"status": {"conditions": [
        {"type": "Calibrated", "status": "True", "reason": "Calibrated", "message": "cal-1"},
        {"type": "Ready", "status": "False", "reason": "PushPending", "message": "1/2 acknowledged"},
    ]}}  # fmt: skip
    assert tools.is_true(policy, "Calibrated")
    assert not tools.is_true(policy, "Ready")
    assert not tools.is_true(policy, "Degraded")
    assert not tools.is_true(None, "Ready")
    assert "Ready=False (PushPending: 1/2 acknowledged)" in tools.conditions_line(policy)
    assert tools.conditions_line(None) == "(object not found)"


def test_metric_sum_reads_the_sidecars_exposition() -> None:
    metrics = SidecarMetrics()
    policy = Policy.model_validate({"slo": {"ttftSeconds": 2.0}})
    thresholds = derive_thresholds(policy, smollm2_profile(), derived_at=NOW)
    metrics.set_thresholds(thresholds)
    gate = GateConfig.from_thresholds(thresholds)
    overloaded = LiveState(queued_prefill_tokens=10 * gate.prefill_tokens_per_s)
    for state in (LiveState(), overloaded, overloaded):
        metrics.record_decision(decide(gate, Request(200, 64, None), state, now=0), 1e-6)
    text = metrics.exposition()[0].decode()
    assert tools.metric_sum(text, "slogate_requests_total", outcome="reject") == 2
    assert tools.metric_sum(text, "slogate_requests_total", outcome="admit") == 1
    assert tools.metric_sum(text, "slogate_requests_total") == 3
    assert tools.metric_sum(text, "slogate_retry_after_seconds_count") == 2
    assert tools.metric_sum(text, "slogate_no_such_metric") == 0


class _Gate(BaseHTTPRequestHandler):
    """Refuses every second request like the sidecar does: 429, Retry-After, a JSON body."""

    count = 0
    classes: list[str | None] = []  # noqa: RUF012

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).classes.append(self.headers.get("X-Slogate-Class"))
        type(self).count += 1
        refused = type(self).count % 2 == 0
        body = b'{"error": {"code": "slogate_rejected"}}' if refused else b'{"content": "ok"}'
        self.send_response(429 if refused else 200)
        if refused:
            self.send_header("Retry-After", "2")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_gate() -> Iterator[str]:
    _Gate.count, _Gate.classes = 0, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gate)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


def test_the_in_cluster_request_reports_status_headers_and_body(fake_gate: str) -> None:
    """The script the suite runs in its client pod (here with this Python, not through kubectl)."""

    def exchange(url: str) -> Any:
        command = tools.in_cluster_command("POST", url, {"prompt": "x"}, headers={"X-Slogate-Class": "batch"},
                                           timeout_s=10, python=sys.executable)  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        return tools.parse_in_cluster_reply(done.stdout)

    admitted, refused = exchange(fake_gate + "/completion"), exchange(fake_gate + "/completion")
    assert (admitted.status, admitted.json()) == (200, {"content": "ok"})
    assert refused.status == 429
    assert tools.retry_after_seconds(refused) == 2
    assert refused.json()["error"]["code"] == "slogate_rejected"
    assert _Gate.classes == ["batch", "batch"]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    nobody = exchange(f"http://127.0.0.1:{port}/completion")
    assert nobody.status == 0
    assert b"Connection refused" in nobody.body or b"URLError" in nobody.body
    with pytest.raises(tools.CommandError, match="printed nothing"):
        tools.parse_in_cluster_reply("\n")


def test_headers_are_found_whatever_their_case() -> None:
    reply = tools.Reply(200, {"x-slogate-class": "interactive"}, b"{}")
    assert tools.header(reply, "X-Slogate-Class") == "interactive"
    assert tools.header(reply, "Retry-After") is None


class _Slices:
    """kubectl's answer for the Service's EndpointSlices: one per port the name resolved to."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def json(self, *_args: str, hint: str) -> dict[str, Any]:  # noqa: ARG002 (Kube's signature)
        return {"items": self.items}


def endpoint(pod: str, **conditions: bool) -> dict[str, Any]:
    return {"addresses": ["10.244.0.9"], "conditions": conditions, "targetRef": {"kind": "Pod", "name": pod}}


def test_service_endpoints_are_the_ready_pods_by_resolved_port() -> None:
    """Mid-rollout a named targetPort resolves to two numbers: a slice each; terminating
    endpoints do not count, and a slice with no ready endpoint names no port."""
    found = example()
    slices = _Slices([
        {"ports": [{"name": "http", "port": 8081, "protocol": "TCP"}],
         "endpoints": [endpoint("gated-a", ready=True), endpoint("gated-b", ready=False, terminating=True)]},
        {"ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": [endpoint("plain-a")]},
        {"ports": [{"name": "http", "port": 9999, "protocol": "TCP"}], "endpoints": [endpoint("gone", ready=False)]},
        {"ports": None, "endpoints": None},
    ])  # fmt: skip
    assert state.service_endpoints(slices, found) == {8081: {"gated-a"}, 8080: {"plain-a"}}
    pods = [{"metadata": {"name": "gated-a"}}]
    assert state.endpoints_on(slices, found, 8081, pods) is None  # plain-a still takes traffic on 8080
    settled = _Slices(slices.items[:1])
    assert state.endpoints_on(settled, found, 8081, pods) == {8081: {"gated-a"}}
    assert state.endpoints_on(settled, found, 8080, pods) is None
    availability = state.Availability(settled, found)
    availability.sample()
    availability.check("a rollout")
    availability.kube = _Slices([])
    availability.sample()
    with pytest.raises(AssertionError, match="no ready endpoint at 1 of 2 polls"):
        availability.check("a rollout")


def test_burst_returns_every_reply_with_headers_and_errors_as_replies(fake_gate: str) -> None:
    replies = state.burst_with_class(fake_gate, [{"prompt": [1, 2, 3]}] * 6, "interactive")
    assert sorted(r.status for r in replies) == [200, 200, 200, 429, 429, 429]
    assert _Gate.classes == ["interactive"] * 6
    for reply in replies:
        if reply.status == 429:
            assert tools.retry_after_seconds(reply) == 2
            assert reply.json()["error"]["code"] == "slogate_rejected"
    # No answer at all is a reply with status 0 and the reason, not an exception mid-burst.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    nobody = tools.http("POST", f"http://127.0.0.1:{port}/completion", {"prompt": "x"}, timeout_s=10)
    assert nobody.status == 0
    assert b"Connection refused" in nobody.body or b"URLError" in nobody.body
    bad = tools.Reply(429, {"Retry-After": "0.5"}, b"{}")
    with pytest.raises(AssertionError, match="not whole seconds"):
        tools.retry_after_seconds(bad)
    with pytest.raises(AssertionError, match="without Retry-After"):
        tools.retry_after_seconds(tools.Reply(429, {}, b"{}"))
