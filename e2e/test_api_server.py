"""What the real API server of the whole cluster says about slogate's objects, beside what
slogate's own models say.

The offline CRD test (tests/unit/operator/test_operator_crd.py) checks the models against the
CRD's schema and CEL rules; here the real kube-apiserver judges the same variants
(tests/crd_variants.py), one by one, with the CRD the chart installed. And the chart's RBAC,
as the real authorizer evaluates it for the operator's ServiceAccount: every permission
slogate_operator.rbac lists is granted, and nothing past it is. And the injected Deployment,
defaulted by the real server: a second injection pass over what the server stored must want
no patch (the property that keeps a steady operator from writing).
"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
import yaml
from cluster_tools import Kube
from suite import RELEASE_NAMESPACE

from crd_variants import EXAMPLE_POLICIES, EXAMPLES, INVALID, VALID, base_policy, model_errors
from slogate_operator.injection import SidecarConfig, injected_template, template_patch
from slogate_operator.rbac import PERMISSIONS
from slogate_operator.settings import OperatorSettings

DRY_RUN_NAMESPACE = "default"
pytestmark = pytest.mark.usefixtures("release")  # the chart installs the CRD and the RBAC judged here


def server_errors(kube: Kube, policy: dict[str, Any]) -> list[str]:
    """The real API server's verdict on creating the policy (a server-side dry run: admission,
    schema, defaulting and CEL all run; nothing is stored). Empty: accepted."""
    body = copy.deepcopy(policy)
    body["metadata"] = {"name": body["metadata"]["name"], "namespace": DRY_RUN_NAMESPACE}
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={kube.kubeconfig}", "create", "--dry-run=server", "-o", "name", "-f", "-"],
        input=json.dumps(body), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode == 0:
        return []
    assert "is invalid" in done.stderr or "Invalid value" in done.stderr, f"not a validation error: {done.stderr}"
    return [done.stderr.strip()]


@pytest.mark.parametrize(("name", "policy"), EXAMPLE_POLICIES, ids=[n for n, _ in EXAMPLE_POLICIES])
def test_every_example_policy_is_accepted_by_the_server_and_the_models(
    kube: Kube, name: str, policy: dict[str, Any]
) -> None:
    assert server_errors(kube, policy) == [], name
    assert model_errors(policy) == [], name


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_variants_are_refused_by_the_server_and_the_models(kube: Kube, case: str) -> None:
    policy = base_policy()
    INVALID[case](policy)
    assert server_errors(kube, policy), f"the real API server accepts: {case}"
    assert model_errors(policy), f"the models accept: {case}"


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_variants_are_accepted_by_the_server_and_the_models(kube: Kube, case: str) -> None:
    policy = base_policy()
    VALID[case](policy)
    assert server_errors(kube, policy) == [], case
    assert model_errors(policy) == [], case


def operator_account(kube: Kube, release: str) -> str:
    deployment = kube.json("-n", RELEASE_NAMESPACE, "get", "deployment", f"{release}-operator", hint="helm status")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    return f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}"


Access = tuple[str, ...] | tuple[str, str, str, str | None]
"""(verb, group, resource, namespace or None[, name])."""
"""verb, API group, resource, namespace (None: cluster-wide)."""


def allowed(kube: Kube, who: str, access: Access) -> bool:
    """The real authorizer's answer (a SubjectAccessReview, as the API server asks itself)."""
    verb, group, resource, namespace, *name = access
    attributes = {"verb": verb, "group": group, "resource": resource, **({"namespace": namespace} if namespace else {}),
                  **({"name": name[0]} if name else {})}  # fmt: skip
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": who, "groups": ["system:serviceaccounts", "system:authenticated"],
                       "resourceAttributes": attributes}}  # fmt: skip
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={kube.kubeconfig}", "create", "-o", "json", "-f", "-"],
        input=json.dumps(review), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return bool(json.loads(done.stdout)["status"].get("allowed"))


NOT_WHEN_SERVING_ALL = {"kopfpeerings", "namespaces"}
"""The chart serves every namespace here: peering is cluster-wide (ClusterKopfPeering), and the
`namespaces` rule is only for namespace globs, which the chart's schema refuses."""


def test_the_charts_rbac_grants_the_operator_exactly_what_it_calls(kube: Kube, release: str) -> None:
    who = operator_account(kube, release)
    defaults = OperatorSettings()  # the chart's values name the same objects by default
    wanted: list[Access] = [
        (verb, p.group, p.resource, None if p.scope == "cluster" else "llm",
         *((getattr(defaults, p.named_by),) if p.named_by else ()))
        for p in PERMISSIONS if p.resource not in NOT_WHEN_SERVING_ALL for verb in p.verbs
    ]  # fmt: skip
    refused = [w for w in wanted if not allowed(kube, who, w)]
    assert refused == [], f"listed in slogate_operator.rbac but refused by the chart's RBAC: {refused}"
    beyond = [w for w in (
        ("create", "", "pods", "llm"), ("delete", "apps", "deployments", "llm"),
        ("update", "apps", "deployments", "llm"),
        ("delete", "", "secrets", "llm"), ("list", "", "secrets", "llm"), ("patch", "", "nodes", None),
        ("get", "", "secrets", "llm", "a-users-secret"), ("patch", "", "secrets", "llm", "a-users-secret"),
        ("create", "events.k8s.io", "events", "llm"),
        ("create", "rbac.authorization.k8s.io", "clusterroles", None), ("create", "", "pods/exec", "llm"),
        ("delete", "slogate.dev", "admissionpolicies", "llm"), ("list", "kopf.dev", "kopfpeerings", "llm"),
        ("list", "", "namespaces", None),
    ) if allowed(kube, who, w)]  # fmt: skip
    assert beyond == [], f"the chart grants the operator more than it calls: {beyond}"


# ------------------------------------------------------------------ the real server's defaults

SIDECAR = SidecarConfig(policy="smollm2", image="slogate:e2e", port=8081, admin_port=8082, upstream_port=8080,
                        prompt_counting="tokenize", token_secret="slogate-admin-token")  # fmt: skip


def stored(kube: Kube, obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the real server would store it (a server-side dry run of its create)."""
    body = copy.deepcopy(obj)
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k not in ("namespace", "ownerReferences")}
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={kube.kubeconfig}", "create", "--dry-run=server", "-n", DRY_RUN_NAMESPACE,
         "-o", "json", "-f", "-"],
        input=json.dumps(body), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def example_deployment() -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all((EXAMPLES / "smollm2.yaml").read_text()) if d]
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    return dict(deployment)


def injected(deployment: dict[str, Any]) -> dict[str, Any]:
    made = copy.deepcopy(deployment)
    made["spec"]["template"] = injected_template(deployment["spec"]["template"], SIDECAR)
    return made


def test_injection_wants_no_patch_on_what_the_real_server_stored(kube: Kube) -> None:
    """The operator's next pass compares the stored Deployment with the template it wants: on the
    real server's defaults, it finds nothing to write (else every pass would patch, and roll)."""
    kept = stored(kube, injected(example_deployment()))
    assert template_patch(kept, injected_template(kept["spec"]["template"], SIDECAR)) == []
