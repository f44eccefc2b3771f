"""The end-to-end suite's fixtures: a real cluster on this machine (e2e/kube/cluster.py: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, a real node of containerd, kubelet
and kube-proxy, CoreDNS, and kwok for the fake nodes a test makes), the images built here
imported into the node, the chart installed with the real helm, the SmolLM2 example's
workload running ungated (its Deployment and Service), a client pod beside it, then the
example's AdmissionPolicy. Run with `make e2e` (or `make test`, which runs it last);
docs/testing.md.

Environment:
  SLOGATE_E2E_KEEP=1         keep the cluster running when a test failed (stopped otherwise)
  SLOGATE_E2E_TIMEOUT_SCALE  multiply every wait (default 1; slow machines: 2 or 3)
  SLOGATE_E2E_ARTIFACTS      where diagnostics of a failure go (default: a new /tmp dir)
  SLOGATE_KUBE_CACHE         where `make kube` and `make kube-images` put binaries and images
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

# e2e/ is no package: pytest puts this directory on sys.path before importing conftest.
from cluster_tools import CommandError, Kube, run, wait_until
from preflight import missing_parts
from suite import (
    APP_NAMESPACE,
    CLIENT_POD,
    E2E,
    EXAMPLE,
    NODE_CPU_REQUEST,
    RELEASE,
    RELEASE_NAMESPACE,
    REPO,
    SLOGATE_IMAGE,
    UPSTREAM_LLAMA_IMAGE,
    Example,
    apply_policy,
    seconds,
)

sys.path.insert(0, str(E2E / "kube"))
sys.path.append(str(REPO / "tests"))  # tests/crd_variants.py: the variants the offline CRD test judges too
from cluster import Binaries, Cluster, Kwok, built_images, llama_server_image


def pytest_configure(config: pytest.Config) -> None:  # noqa: ARG001 (pytest's hook signature)
    missing = missing_parts()
    if missing:  # a failure, never a skip: `make e2e` builds every part first
        pytest.exit(f"the real cluster cannot start: {'; '.join(missing)}", returncode=1)
    # Our own kubectl and helm, of the cluster's version, before anything the machine has.
    binaries = Binaries.from_cache()
    os.environ["PATH"] = os.pathsep.join([str(binaries.kubernetes), str(binaries.helm), os.environ["PATH"]])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """In a module of steps (STEPS_DEPEND_ON_EACH_OTHER) the later steps are skipped after a
    failure, with a pointer to it; the cluster's state is dumped once for the first failure."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("setup", "call"):
        item.session.stash.setdefault(FAILED, []).append(item.nodeid)
        kube = item.session.stash.get(KUBE, None)
        if kube is not None and not item.session.stash.get(DUMPED, False):
            item.session.stash[DUMPED] = True
            where = dump_diagnostics(kube)
            report.sections.append(("slogate e2e diagnostics", f"cluster state written to {where}"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not getattr(item.module, "STEPS_DEPEND_ON_EACH_OTHER", False):
        return
    module = item.nodeid.split("::")[0]
    failed = [f for f in item.session.stash.get(FAILED, []) if f.startswith(module + "::")]
    if failed:
        pytest.skip(f"an earlier step failed ({failed[0]}); this one depends on it")


FAILED = pytest.StashKey[list[str]]()
KUBE = pytest.StashKey[Kube]()
DUMPED = pytest.StashKey[bool]()


def dump_diagnostics(kube: Kube) -> Path:
    """Everything one looks at first when a step fails, one file per command."""
    target = Path(os.environ.get("SLOGATE_E2E_ARTIFACTS") or tempfile.mkdtemp(prefix="slogate-e2e-"))
    target.mkdir(parents=True, exist_ok=True)
    commands = {
        "overview.txt": ["get", "nodes,pods,deployments,jobs,services,admissionpolicies", "-A", "-o", "wide"],
        "events.txt": ["get", "events", "-A", "--sort-by=.lastTimestamp"],
        "policies.yaml": ["get", "admissionpolicies", "-A", "-o", "yaml"],
        "describe-app-pods.txt": ["-n", APP_NAMESPACE, "describe", "pods"],
        "describe-jobs.txt": ["-n", APP_NAMESPACE, "describe", "jobs"],
        # Where the Service's named targetPort resolved to (llama-server's port or the gate's).
        "app-objects.yaml": ["-n", APP_NAMESPACE, "get", "deployments,services,endpointslices,networkpolicies",
                             "-o", "yaml"],
        "operator.log": ["-n", RELEASE_NAMESPACE, "logs", "-l", "app.kubernetes.io/component=operator",
                         "--all-containers", "--prefix", "--tail=500"],
        "app-containers.log": ["-n", APP_NAMESPACE, "logs", "-l", "app.kubernetes.io/name=smollm2",
                               "--all-containers", "--prefix", "--tail=200"],
        "calibration-jobs.log": ["-n", APP_NAMESPACE, "logs", "-l", "slogate.dev/policy",
                                 "--all-containers", "--prefix", "--tail=200"],
    }  # fmt: skip
    for name, args in commands.items():
        done = run(["kubectl", f"--kubeconfig={kube.kubeconfig}", *args], hint="", check=False, timeout_s=60)
        (target / name).write_text(done.stdout + ("\n--- stderr ---\n" + done.stderr if done.stderr else ""))
    # The data plane (kube-proxy's rules) and the components' own logs, beside the API's view.
    (target / "iptables-nat.txt").write_text(run(["iptables-save", "-t", "nat"], hint="", check=False).stdout)
    logs = kube.kubeconfig.parent / "logs"  # the cluster's run directory holds the kubeconfig
    if logs.is_dir():
        shutil.copytree(logs, target / "components", dirs_exist_ok=True)
    return target


@pytest.fixture(scope="session")
def example() -> Example:
    """examples/smollm2.yaml with the images built here and a CPU request the node can hold."""
    example = Example([d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d])
    return example.with_images({UPSTREAM_LLAMA_IMAGE: llama_server_image()}).with_cpu_request(NODE_CPU_REQUEST)


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> Iterator[Kube]:
    """The real cluster, started for the session and stopped at its end (kept, when a test
    failed and SLOGATE_E2E_KEEP=1, with the command that stops it)."""
    workdir = Path(tempfile.mkdtemp(prefix="slogate-cluster-"))
    cluster = Cluster(workdir, Binaries.from_cache(), Kwok.from_cache())
    cluster.start(built_images())
    client = Kube(cluster.admin_kubeconfig)
    holes = cluster.network.holes()  # kube-proxy and the kubelet have written their rules by now
    if holes:
        cluster.stop()
        raise AssertionError(f"the cluster's network could reach past this machine: {holes}")
    request.session.stash[KUBE] = client
    try:
        yield client
    finally:
        failed = bool(request.session.stash.get(FAILED, []))
        if failed and os.environ.get("SLOGATE_E2E_KEEP") == "1":
            print(f"\nkept the cluster for inspection: kubectl --kubeconfig {cluster.admin_kubeconfig} get pods -A\n"
                  f"stop it with: python3 e2e/kube/cluster.py down {workdir}")  # fmt: skip
        else:
            cluster.stop()
            left = cluster.leftovers()
            assert not left, f"the cluster's teardown left these on the machine: {left}"
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def images(kube: Kube, example: Example) -> list[str]:
    """Every image the example and the chart run is on the node already (built here by
    `make kube-images`, imported when the node started): pods pull nothing."""
    node = kube.json("get", "node", "-o", "json", hint="kubectl get nodes")["items"][0]
    on_node = {name for image in node["status"].get("images") or () for name in image.get("names") or ()}
    wanted = [SLOGATE_IMAGE, *example.images]
    missing = [i for i in wanted if not any(n == i or n.endswith("/" + i) for n in on_node)]
    if missing:
        raise CommandError(f"not on the node: {missing} (on it: {sorted(on_node)}); `make kube-images` builds them")
    return wanted


@pytest.fixture(scope="session")
def release(kube: Kube, images: list[str]) -> str:  # noqa: ARG001 (needs the images loaded)
    """`helm install` of the chart with e2e/values.yaml, waited for."""
    if not shutil.which("helm"):
        raise CommandError("the helm binary is needed to install the chart (https://helm.sh/docs/intro/install/)")
    chart = str(REPO / "charts" / "slogate")
    run(["helm", "upgrade", "--install", RELEASE, chart, "--kubeconfig", str(kube.kubeconfig),
         "--namespace", RELEASE_NAMESPACE, "--create-namespace", "-f", str(E2E / "values.yaml"),
         "--wait", "--timeout", f"{int(seconds(300))}s"],
        hint=f"kubectl -n {RELEASE_NAMESPACE} describe pods; kubectl -n {RELEASE_NAMESPACE} logs "
             f"-l app.kubernetes.io/component=operator", timeout_s=seconds(420))  # fmt: skip
    rollout = f"--timeout={int(seconds(300))}s"
    kube("-n", RELEASE_NAMESPACE, "rollout", "status", f"deployment/{RELEASE}-operator", rollout,
         hint="the operator's pods: the image (pullPolicy Never: on the node already), crash loops in its logs",
         timeout_s=seconds(360))  # fmt: skip
    return RELEASE


@pytest.fixture(scope="session")
def workload(kube: Kube, release: str, example: Example) -> Example:  # noqa: ARG001 (needs the chart)
    """The example without its policy, as it runs before slogate: the Deployment rolled out
    and its Service; and a client pod in the same namespace.

    Once gated, the operator keeps a NetworkPolicy on the pods (fence.py). The suite's node
    runs the CNI bridge plugin, which does not enforce NetworkPolicy (Calico, Cilium or
    kind's kindnet would); nothing here depends on which: the client pod targets the
    Service (the gate's port, admitted from everyone), the operator's pushes come from the
    release's operator pods (admitted), and `kubectl port-forward` reaches a pod over its
    loopback, which no NetworkPolicy filters.
    """
    if kube.maybe_json("get", "namespace", APP_NAMESPACE) is None:
        kube("create", "namespace", APP_NAMESPACE, hint="kubectl get namespaces")
    # A reused cluster may still hold the policy of an earlier run: its finalizer takes the
    # gate out, so the suite starts from the ungated workload.
    kube("-n", APP_NAMESPACE, "delete", "admissionpolicy", example.policy, "--ignore-not-found",
         f"--timeout={int(seconds(300))}s", hint="the policy's finalizer: the operator's logs",
         timeout_s=seconds(360))  # fmt: skip
    kube.apply(APP_NAMESPACE, example.workload_documents, hint="kubectl apply -f examples/smollm2.yaml by hand")
    kube("-n", APP_NAMESPACE, "rollout", "status", f"deployment/{example.deployment}",
         f"--timeout={int(seconds(600))}s", timeout_s=seconds(660),
         hint=f"kubectl -n {APP_NAMESPACE} describe pods -l {example.selector} (the model init container, "
              f"llama-server's readinessProbe on /health)")  # fmt: skip
    if kube.maybe_json("-n", APP_NAMESPACE, "get", "pod", CLIENT_POD) is None:
        kube("-n", APP_NAMESPACE, "run", CLIENT_POD, f"--image={SLOGATE_IMAGE}", "--image-pull-policy=Never",
             "--restart=Never", f"--labels=app.kubernetes.io/name={CLIENT_POD}",
             "--command", "--", "python", "-c", "import time; time.sleep(86400)",
             hint="the slogate image is imported into the node (the images fixture)")  # fmt: skip
    kube("-n", APP_NAMESPACE, "wait", "--for=condition=Ready", f"pod/{CLIENT_POD}", f"--timeout={int(seconds(180))}s",
         hint=f"kubectl -n {APP_NAMESPACE} describe pod {CLIENT_POD}", timeout_s=seconds(240))  # fmt: skip
    return example


@pytest.fixture(scope="session")
def deployed(kube: Kube, workload: Example) -> Example:
    """The example's AdmissionPolicy applied on top of the running workload, seen by the operator."""
    example = workload
    apply_policy(kube, example)
    wait_until(
        f"AdmissionPolicy {example.policy} seen by the operator (a status)",
        lambda: (kube.maybe_json("-n", APP_NAMESPACE, "get", "admissionpolicy", example.policy) or {}).get("status"),
        timeout_s=seconds(120),
        hint=f"kubectl -n {RELEASE_NAMESPACE} logs -l app.kubernetes.io/component=operator (RBAC errors? peering?)",
    )
    return example
