"""What the end-to-end suite reads of the workload and the operator on the real cluster: the
Deployment's pods and its rollouts, the Service's endpoints and answers, the port hand-over,
the sidecars' state and metrics, the policy's conditions, what the policy owns, and the
operator's calls in the API server's audit log. test_lifecycle.py's steps are built of these."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cluster import AUDIT_LOG
from cluster_tools import (
    Kube,
    Reply,
    burst,
    conditions_line,
    header,
    http,
    in_cluster_command,
    is_true,
    parse_in_cluster_reply,
    port_forward,
    wait_until,
)
from network import service_destinations
from suite import APP_NAMESPACE, CLIENT_POD, RELEASE_NAMESPACE, Example, seconds

T = TypeVar("T")
SIDECAR = "slogate-sidecar"
CLAIM = "slogate.dev/policy"
"""The annotation on a claimed Deployment's metadata; the label on an injected pod template."""
INJECTION_RECORD = "slogate.dev/injection"
GATE = "slogate.dev/gate"
"""The pod template's annotation that rolls the pods onto the gate (slogate_operator.names.ANNOTATION_GATE)."""
GATE_HEADER = "X-Slogate-Class"
"""On every answer the gate admitted; llama-server never sends it."""
COMPLETION = {"prompt": "The capital of France is", "n_predict": 8}
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
OPERATOR_LOGS = f"kubectl -n {RELEASE_NAMESPACE} logs -l app.kubernetes.io/component=operator"


def policy_of(kube: Kube, example: Example) -> dict[str, Any] | None:
    return kube.maybe_json("-n", APP_NAMESPACE, "get", "admissionpolicy", example.policy)


def deployment_of(kube: Kube, example: Example) -> dict[str, Any]:
    return kube.json("-n", APP_NAMESPACE, "get", "deployment", example.deployment, hint="kubectl get deploy")


def running_pods(kube: Kube, example: Example) -> list[dict[str, Any]]:
    """The Deployment's pods that are not on their way out."""
    pods = kube.json("-n", APP_NAMESPACE, "get", "pods", "-l", example.selector, hint="kubectl get pods")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def replica_sets(kube: Kube, example: Example) -> set[str]:
    """Names of the Deployment's ReplicaSets: a rollout adds one."""
    found = kube.json("-n", APP_NAMESPACE, "get", "replicasets", "-l", example.selector, hint="kubectl get rs")
    return {r["metadata"]["name"] for r in found["items"]}


def container_names(pod: dict[str, Any]) -> list[str]:
    """Of a pod or a pod template."""
    return [c["name"] for c in pod["spec"]["containers"]]


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """The container of that name in a pod or a pod template."""
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return dict(found)


def all_ready(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all(s.get("ready") for s in statuses)


def rolled_out(kube: Kube, example: Example, *, with_sidecar: bool) -> list[dict[str, Any]] | None:
    """The pods, once the Deployment's rollout finished with (or without) the sidecar."""
    deployment = deployment_of(kube, example)
    status, spec = deployment.get("status", {}), deployment["spec"]
    done = (
        status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
        and status.get("updatedReplicas") == spec["replicas"] == status.get("readyReplicas")
        and status.get("replicas") == spec["replicas"]
    )
    pods = running_pods(kube, example)
    if not done or len(pods) != spec["replicas"] or not all(all_ready(p) for p in pods):
        return None
    if any((SIDECAR in container_names(p)) != with_sidecar for p in pods):
        return None
    return pods


# ------------------------------------------------------------------------------ the Service


def through_service(kube: Kube, example: Example, method: str, path: str, body: object | None = None) -> Reply:
    """One request to the Service's DNS name from the client pod in the app namespace."""
    url = f"http://{example.service}.{APP_NAMESPACE}.svc:{example.service_port}{path}"
    command = in_cluster_command(method, url, body, timeout_s=seconds(120))
    out = kube("-n", APP_NAMESPACE, "exec", CLIENT_POD, "--", *command, timeout_s=seconds(180),
               hint=f"kubectl -n {APP_NAMESPACE} get endpointslices -l kubernetes.io/service-name={example.service} "
                    f"-o yaml; kubectl -n {APP_NAMESPACE} get networkpolicies")  # fmt: skip
    return parse_in_cluster_reply(out)


def served_by_llama_server(kube: Kube, example: Example, when: str) -> None:
    """A completion through the Service answered 200 by llama-server itself, not by the gate."""
    reply = through_service(kube, example, "POST", "/completion", COMPLETION)
    assert reply.status == 200, (
        f"{when}: the Service answered {reply.status} (0: no HTTP answer at all): {reply.body[:300]!r}. "
        f"Look at: its EndpointSlices (the port its targetPort {example.target_port!r} resolved to)"
    )
    assert header(reply, GATE_HEADER) is None, f"{when}: the answer came through the gate: {reply.headers}"
    assert "content" in reply.json(), f"{when}: not llama-server's /completion answer: {reply.body[:300]!r}"


def served_by_the_gate(kube: Kube, example: Example, calibration: str) -> None:
    """A completion through the Service admitted by the gate, and the gate's /readyz on that calibration."""
    reply = through_service(kube, example, "POST", "/completion", COMPLETION)
    assert reply.status == 200, f"the Service answered {reply.status}: {reply.body[:300]!r}"
    assert header(reply, GATE_HEADER) is not None, (
        f"the answer came from llama-server directly ({GATE_HEADER} missing): the Service bypasses the gate"
    )
    ready = through_service(kube, example, "GET", "/readyz")
    assert ready.status == 200, f"/readyz through the Service answered {ready.status}: {ready.body[:300]!r}"
    assert ready.json().get("calibrationId") == calibration, ready.json()


def service_endpoints(kube: Kube, example: Example) -> dict[int, set[str]]:
    """The Service's ready endpoints (pod names), by the container port its named targetPort resolved to."""
    slices = kube.json("-n", APP_NAMESPACE, "get", "endpointslices", "-l",
                       f"kubernetes.io/service-name={example.service}", hint="kubectl get endpointslices")  # fmt: skip
    found: dict[int, set[str]] = {}
    for piece in slices["items"]:
        ready = {
            str((e.get("targetRef") or {}).get("name"))
            for e in piece.get("endpoints") or ()
            if (e.get("conditions") or {}).get("ready") is not False  # unset means ready
        }
        for port in piece.get("ports") or ():
            if ready and port.get("port") is not None:
                found.setdefault(int(port["port"]), set()).update(ready)
    return found


def endpoints_on(kube: Kube, example: Example, port: int, pods: list[dict[str, Any]]) -> dict[int, set[str]] | None:
    """The Service's ready endpoints once they are exactly these pods, on container port `port`."""
    found = service_endpoints(kube, example)
    return found if found == {port: {p["metadata"]["name"] for p in pods}} else None


def destinations(pods: list[dict[str, Any]], port: int) -> set[str]:
    return {f"{p['status']['podIP']}:{port}" for p in pods}


def wait_for_endpoints(kube: Kube, example: Example, port: int, pods: list[dict[str, Any]], what: str) -> None:
    """The Service's EndpointSlices name exactly these pods on `port`, and then kube-proxy's
    rules send its traffic there and nowhere else (the control plane first, the data plane a
    moment later: a request sent in between can go to a pod that is gone)."""
    wait_until(
        f"Service {example.service}'s endpoints: {what} (port {port}) on every pod",
        lambda: endpoints_on(kube, example, port, pods),
        timeout_s=seconds(120),
        hint=f"kubectl -n {APP_NAMESPACE} get endpointslices -l kubernetes.io/service-name={example.service} -o yaml",
        describe=lambda: f"ready endpoints by port: {service_endpoints(kube, example)}",
    )
    wanted = destinations(pods, port)
    wait_until(
        f"kube-proxy's rules for Service {example.service}: {what} on every pod ({sorted(wanted)})",
        lambda: service_destinations(APP_NAMESPACE, example.service) == wanted or None,
        timeout_s=seconds(120),
        hint="iptables-save -t nat | grep KUBE-SEP; the kube-proxy log in the cluster's logs/",
        describe=lambda: f"kube-proxy sends it to {sorted(service_destinations(APP_NAMESPACE, example.service))}",
    )


class Availability:
    """The Service's ready endpoints, counted at every poll of a wait: a rollout that adds or
    removes the gate must never leave the Service without one."""

    def __init__(self, kube: Kube, example: Example) -> None:
        self.kube, self.example = kube, example
        self.samples: list[int] = []

    def sample(self) -> None:
        self.samples.append(len(set().union(*service_endpoints(self.kube, self.example).values())))

    def watching(self, probe: Callable[[], T | None]) -> Callable[[], T | None]:
        def sampled() -> T | None:
            self.sample()
            return probe()

        return sampled

    def check(self, what: str) -> None:
        assert self.samples, f"{what}: the Service's endpoints were never read"
        assert min(self.samples) >= 1, (
            f"{what}: the Service had no ready endpoint at {self.samples.count(0)} of {len(self.samples)} polls "
            f"(ready endpoints per poll: {self.samples})"
        )


# ------------------------------------------------------------------------------ the port handover


def probe_port(container_spec: dict[str, Any], probe: str) -> object:
    return ((container_spec.get(probe) or {}).get("httpGet") or {}).get("port")


def assert_llama_port_as_in_the_example(llama: dict[str, Any], example: Example, where: str) -> None:
    """llama-server's port and probes as the example declares them: the name the Service targets is its own."""
    ports = [(p.get("name"), p["containerPort"]) for p in llama.get("ports") or ()]
    assert ports == [(p.get("name"), p["containerPort"]) for p in example.llama_spec["ports"]], f"{where}: {ports}"
    for probe in PROBES:
        assert probe_port(llama, probe) == probe_port(example.llama_spec, probe), f"{where}: {probe}"


def assert_handed_over(pod: dict[str, Any], example: Example) -> None:
    """The gate's client port carries the name the Service targets; llama-server's keeps its number only."""
    name = pod["metadata"]["name"]
    gate = [p for p in container(pod, SIDECAR).get("ports") or () if p["containerPort"] == example.sidecar_port("port")]
    assert [p.get("name") for p in gate] == [example.target_port], f"{name}: the gate's client port is {gate}"
    llama = container(pod, example.llama_container)
    own = [p for p in llama.get("ports") or () if p["containerPort"] == example.llama_port]
    assert own, f"{name}: llama-server's port {example.llama_port} is no longer declared"
    assert all(not p.get("name") for p in own), f"{name}: llama-server's port kept its name: {own}"
    for probe in PROBES:  # a probe that named the port names its number while the gate has the name
        if probe_port(example.llama_spec, probe) == example.target_port:
            assert probe_port(llama, probe) == example.llama_port, f"{name}: {probe} {llama.get(probe)}"


# ------------------------------------------------------------------------------ the sidecars


def sidecar_state(kube: Kube, example: Example, pod: str) -> dict[str, Any]:
    """GET /slogate/v1/state from one pod's sidecar admin port."""
    hint = f"kubectl -n {APP_NAMESPACE} logs {pod} -c {SIDECAR}"
    with port_forward(kube, APP_NAMESPACE, f"pod/{pod}", example.sidecar_port("adminPort"), hint=hint) as url:
        reply = http("GET", url + "/slogate/v1/state", timeout_s=30)
    assert reply.status == 200, f"{pod}: state answered {reply.status}: {reply.body[:300]!r}. Look at: {hint}"
    state: dict[str, Any] = reply.json()
    return state


def enforcing(kube: Kube, example: Example, pod: str, calibration: str) -> dict[str, Any] | None:
    """The sidecar's state once it enforces that calibration."""
    state = sidecar_state(kube, example, pod)
    return state if state["calibrationId"] == calibration else None


def sidecar_metrics(kube: Kube, example: Example, pod: str) -> str:
    hint = f"kubectl -n {APP_NAMESPACE} logs {pod} -c {SIDECAR}"
    with port_forward(kube, APP_NAMESPACE, f"pod/{pod}", example.sidecar_port("adminPort"), hint=hint) as url:
        reply = http("GET", url + "/metrics", timeout_s=30)
    assert reply.status == 200, f"{pod}: /metrics answered {reply.status}. Look at: {hint}"
    return reply.body.decode()


# ------------------------------------------------------------------------------ the policy


def ready_policy(kube: Kube, example: Example, *, other_than: str | None = None) -> dict[str, Any] | None:
    """The policy once Ready with every replica acknowledged (and a calibration other than `other_than`)."""
    policy = policy_of(kube, example)
    if policy is None or not is_true(policy, "Ready") or not is_true(policy, "Calibrated"):
        return None
    status = policy["status"]
    if status.get("pushed") != f"{example.replicas}/{example.replicas}":
        return None
    calibration = (status.get("calibration") or {}).get("id")
    if calibration is None or calibration == other_than:
        return None
    return policy


def claimed_and_calibrating(kube: Kube, example: Example) -> dict[str, Any] | None:
    """The policy once the operator claimed the Deployment and its first calibration is under way."""
    annotations = deployment_of(kube, example)["metadata"].get("annotations") or {}
    if annotations.get(CLAIM) != example.policy:
        return None
    policy = policy_of(kube, example)
    status = (policy or {}).get("status") or {}
    if policy is None or not (status.get("calibrating") or is_true(policy, "Calibrated")):
        return None
    return policy


def describe_policy(kube: Kube, example: Example) -> str:
    policy = policy_of(kube, example)
    pushed = (policy or {}).get("status", {}).get("pushed")
    return f"{conditions_line(policy)}; pushed {pushed}"


def assert_fenced(kube: Kube, example: Example, pods: list[dict[str, Any]]) -> None:
    """The operator's NetworkPolicy `<policy>-gate` as the real API server stored it: owned by
    the policy, selecting every gated pod, the gate's port open, the admin port for the
    release's operator pods and Prometheus only, llama-server's port in no rule. (The node's
    CNI does not enforce it: what it blocks is evaluated in tests/unit/chart/test_network_policy.py.)"""
    fence = kube.json("-n", APP_NAMESPACE, "get", "networkpolicy", f"{example.policy}-gate",
                      hint=f"the operator keeps it (fence.py): {OPERATOR_LOGS}")  # fmt: skip
    (owner,) = fence["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("AdmissionPolicy", example.policy)
    selector = fence["spec"]["podSelector"]["matchLabels"]
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        assert all(labels.get(k) == v for k, v in selector.items()), f"{pod['metadata']['name']} is not fenced"
    client, admin = fence["spec"]["ingress"]
    assert client["ports"][0] == {"port": example.sidecar_port("port"), "protocol": "TCP"}
    assert "from" not in client
    assert admin["ports"] == [{"port": example.sidecar_port("adminPort"), "protocol": "TCP"}]
    operator, prometheus = admin["from"]
    assert operator["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": RELEASE_NAMESPACE}
    assert operator["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert prometheus["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    opened = [p["port"] for rule in fence["spec"]["ingress"] for p in rule["ports"]]
    assert example.llama_port not in opened, "llama-server's own port is open: a way past the gate"


OWNED_KINDS = "jobs,pods,configmaps,secrets,horizontalpodautoscalers,networkpolicies"


def owned_by_the_policy(kube: Kube, example: Example) -> set[str]:
    """`kind/name` of every object in the app namespace that an AdmissionPolicy of that name owns
    (directly, or through a Job it owns: the calibration pods)."""
    items = kube.json("-n", APP_NAMESPACE, "get", OWNED_KINDS, hint="kubectl get")["items"]
    owned: set[str] = set()
    for _ in range(2):  # a pod owned by a Job the policy owns
        for item in items:
            for ref in item["metadata"].get("ownerReferences") or ():
                if (ref["kind"] == "AdmissionPolicy" and ref["name"] == example.policy) or \
                        f"{ref['kind']}/{ref['name']}" in owned:  # fmt: skip
                    owned.add(f"{item['kind']}/{item['metadata']['name']}")
    return owned


RESYNC_SECONDS = 30.0
"""The operator's resync period (OperatorSettings.resync_seconds' default, which the chart keeps)."""
WRITES = ("create", "update", "patch", "delete", "deletecollection")
PEERING = ("clusterkopfpeerings", "kopfpeerings")
"""kopf's keepalive of its peering object: its liveness, not a pass's work."""


def audit_log(kube: Kube) -> Path:
    """The API server's audit log of this run (e2e/kube/cluster.py writes it beside the kubeconfig)."""
    return kube.kubeconfig.parent / AUDIT_LOG


def audit_mark(kube: Kube) -> int:
    """Where the audit log ends now (a byte offset)."""
    return audit_log(kube).stat().st_size


def operator_calls(kube: Kube, *, since: int) -> list[dict[str, str]]:
    """The operator's calls after `since` (its ServiceAccount's), as verb, resource, namespace,
    name and the source address (which operator pod)."""
    prefix = f"system:serviceaccount:{RELEASE_NAMESPACE}:"
    with audit_log(kube).open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    calls = []
    for line in lines:
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or not event["user"]["username"].startswith(prefix):
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        calls.append({"verb": event["verb"], "resource": resource, "namespace": ref.get("namespace", ""),
                      "name": ref.get("name", ""), "source": (event.get("sourceIPs") or ["?"])[0]})  # fmt: skip
    return calls


def burst_with_class(url: str, bodies: list[dict[str, Any]], klass: str) -> list[Reply]:
    """A burst whose requests name their class (the sidecar's X-Slogate-Class header)."""
    return burst(url + "/completion", bodies, headers={"X-Slogate-Class": klass})


def with_threads(args: list[str], threads: int) -> list[str]:
    """llama-server arguments with `-t`/`--threads` set to `threads` (added if absent)."""
    out = list(args)
    for flag in ("-t", "--threads"):
        if flag in out:
            out[out.index(flag) + 1] = str(threads)
            return out
    return [*out, "-t", str(threads)]
