"""The pure builders: what they build is valid Kubernetes (kubernetes-validate, strict) and
does what the operator relies on (native sidecar, termination message, idempotent injection)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from manifests import llama_deployment
from slogate_cli.main import build_parser
from slogate_operator import builders, names
from slogate_operator.fingerprint import container_fingerprint, llama_container
from slogate_operator.injection import TargetClaimedError, injected_template, removed_template, template_patch
from slogate_operator.sidecar import SidecarConfig

K8S = "1.33.0"  # native sidecars (restartPolicy on init containers) are GA from 1.33
POLICY = builders.PolicyRef(name="smollm2", namespace="llm", uid="0f0e0d0c-0000-4000-8000-000000000001")


def valid(obj: dict[str, Any]) -> None:
    """kubernetes-validate, strict: unknown fields are errors."""
    try:
        kubernetes_validate.validate(obj, K8S, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {error.message} at {list(error.path)}")


def deployment(**kwargs: Any) -> dict[str, Any]:
    made = llama_deployment(**kwargs)
    made["metadata"] |= {"namespace": "llm", "resourceVersion": "7"}
    return made


def job_for(dep: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    llama = llama_container(dep["spec"]["template"]["spec"], None)
    request = builders.CalibrationRequest(
        policy=POLICY, deployment=dep["metadata"]["name"], llama=llama,
        container_fingerprint=container_fingerprint(llama), image="slogate:0.1.0",
        timeout_seconds=300, budget_seconds=90, ttl_seconds=3600,
    )  # fmt: skip
    for key, value in overrides.items():
        object.__setattr__(request, key, value)
    return builders.calibration_job(request)


def config(**overrides: Any) -> SidecarConfig:
    values: dict[str, Any] = {
        "policy": "smollm2", "image": "slogate:0.1.0", "port": 8081, "admin_port": 8082,
        "upstream_port": 8080, "prompt_counting": "tokenize", "token_secret": "slogate-admin-token",
    }  # fmt: skip
    return SidecarConfig(**(values | overrides))


# ------------------------------------------------------------------------------ Job


def test_calibration_job_is_valid_kubernetes() -> None:
    valid(job_for(deployment()))


def test_job_runs_the_target_container_as_native_sidecar_and_the_calibrator_as_main() -> None:
    dep = deployment()
    job = job_for(dep)
    pod = job["spec"]["template"]["spec"]
    original = dep["spec"]["template"]["spec"]["containers"][0]
    server = pod["initContainers"][-1]
    assert server["restartPolicy"] == "Always"  # native sidecar: stopped when the main container exits
    for field in ("image", "args", "resources", "volumeMounts"):
        assert server[field] == original[field], field  # the real thing is measured
    # No probe: the kubelet probes the pod IP, and llama-server may listen on loopback only;
    # the calibrator waits for /health over loopback, within what the deadline leaves.
    assert not any(probe in server for probe in ("startupProbe", "readinessProbe", "livenessProbe"))
    # The model-copying init container runs first, so the model is there when the server starts.
    assert [c["name"] for c in pod["initContainers"]] == ["model", "llama"]
    (calibrator,) = pod["containers"]
    assert calibrator["name"] == names.CALIBRATOR_CONTAINER
    args = calibrator["args"]
    assert args[:3] == ["calibrate", "--upstream", "http://127.0.0.1:8080"]
    assert args[args.index("--model") + 1] == "/model/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert args[args.index("--budget-seconds") + 1] == "90"
    assert args[args.index("--wait-seconds") + 1] == "210"  # timeoutSeconds 300 - budget 90
    (server_args,) = [a for a in args if a.startswith("--server-args=")]
    assert "-t 2 -np 4 -c 8192" in server_args
    assert calibrator["terminationMessagePolicy"] == "FallbackToLogsOnError"
    *model_mounts, tmp = calibrator["volumeMounts"]
    assert all(m["readOnly"] for m in model_mounts)
    assert tmp == {"name": names.TMP_VOLUME, "mountPath": "/tmp"}
    assert pod["volumes"][:-1] == dep["spec"]["template"]["spec"]["volumes"]
    assert pod["volumes"][-1]["name"] == names.TMP_VOLUME  # the calibrator's only writable path
    assert pod["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 300
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600
    assert job["metadata"]["ownerReferences"][0]["uid"] == POLICY.uid


def test_the_calibrators_arguments_parse_even_when_the_servers_look_like_one_flag() -> None:
    """``--server-args --metrics`` would make argparse take ``--metrics`` for a flag of its own."""
    dep = deployment(args=["--metrics"])
    calibrator = job_for(dep)["spec"]["template"]["spec"]["containers"][0]
    parsed = build_parser().parse_args(calibrator["args"])
    assert tuple(parsed.server_args) == ("--metrics",)  # the shell words of the one string
    assert parsed.upstream == "http://127.0.0.1:8080"


def test_job_name_is_deterministic_short_and_per_fingerprint() -> None:
    first = job_for(deployment())["metadata"]["name"]
    assert first == job_for(deployment())["metadata"]["name"]
    other = job_for(deployment(args=["-m", "/model/x.gguf", "-t", "1", "--metrics"]))["metadata"]["name"]
    assert other != first
    long_policy = builders.PolicyRef(name="a." * 120 + "b", namespace="llm", uid="u")
    name = names.calibration_job_name(long_policy.name, "0123456789abcdef")
    assert len(name) <= 63
    assert name == name.lower()
    assert "." not in name
    assert name[0].isalnum()
    assert name[-1].isalnum()
    assert name != names.calibration_job_name("a." * 120 + "c", "0123456789abcdef")


def test_job_enables_metrics_only_when_the_target_lacks_them() -> None:
    without = deployment(args=["-m", "/model/m.gguf", "-t", "2"])
    env = job_for(without)["spec"]["template"]["spec"]["initContainers"][-1].get("env", [])
    assert {"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "1"} in env
    assert "env" not in job_for(deployment())["spec"]["template"]["spec"]["initContainers"][-1]


def test_job_copies_scheduling_and_drops_the_targets_probes() -> None:
    dep = deployment()
    spec = dep["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"node.kubernetes.io/instance-type": "c7i.large"}
    spec["tolerations"] = [{"key": "llm", "operator": "Exists", "effect": "NoSchedule"}]
    spec["containers"][0]["livenessProbe"] = {"httpGet": {"path": "/health", "port": 8080}}
    job = job_for(dep)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == spec["nodeSelector"]
    assert pod["tolerations"] == spec["tolerations"]
    assert "livenessProbe" not in pod["initContainers"][-1]
    valid(job)


def test_job_declares_every_volume_its_copied_containers_mount() -> None:
    """A feeding init container's own Secret (an HF token) comes along: else the API server says 422."""
    dep = deployment()
    spec = dep["spec"]["template"]["spec"]
    spec["initContainers"][0]["volumeMounts"].append({"name": "hf-token", "mountPath": "/secrets", "readOnly": True})
    spec["volumes"].append({"name": "hf-token", "secret": {"secretName": "hf"}})
    spec["volumes"].append({"name": "unrelated", "emptyDir": {}})
    pod = job_for(dep)["spec"]["template"]["spec"]
    declared = {v["name"] for v in pod["volumes"]}
    mounted = {m["name"] for c in [*pod["initContainers"], *pod["containers"]] for m in c.get("volumeMounts", [])}
    assert mounted <= declared
    assert "hf-token" in declared
    assert "unrelated" not in declared


def test_job_keeps_node_affinity_and_drops_the_apps_pod_anti_affinity() -> None:
    dep = deployment()
    node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "cpu", "operator": "In", "values": ["avx512"]}]}]}}  # fmt: skip
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "smollm2"}}, "topologyKey": "kubernetes.io/hostname"}]}  # fmt: skip
    dep["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": node_affinity, "podAntiAffinity": anti}
    pod = job_for(dep)["spec"]["template"]["spec"]
    assert pod["affinity"] == {"nodeAffinity": node_affinity}
    valid(job_for(dep))


# ------------------------------------------------------------------------------ injection


def patched(dep: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    ops = template_patch(dep, desired)
    return jsonpatch.apply_patch(dep, ops) if ops else dep


def test_injected_deployment_is_valid_and_carries_the_sidecar() -> None:
    dep = deployment()
    after = patched(dep, injected_template(dep["spec"]["template"], config()))
    valid(after)
    spec = after["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["llama", names.SIDECAR_CONTAINER]
    sidecar = spec["containers"][1]
    assert sidecar["args"][:3] == ["sidecar", "--upstream", "http://127.0.0.1:8080"]
    # The llama.cpp port's name goes to the gate (the Service targets it); the number stays.
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {"http": 8081, "slogate-admin": 8082}
    assert spec["containers"][0]["ports"] == [{"containerPort": 8080}]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8081}
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[names.THRESHOLDS_VOLUME]["configMap"] == {"name": "smollm2-thresholds", "optional": True}
    assert volumes[names.TOKEN_VOLUME]["secret"]["secretName"] == "slogate-admin-token"
    assert after["spec"]["template"]["metadata"]["labels"][names.LABEL_POLICY] == "smollm2"
    # The Deployment's selector is untouched: the rollout keeps its pods.
    assert after["spec"]["selector"] == dep["spec"]["selector"]


def test_injection_is_idempotent_and_removal_restores_the_original() -> None:
    dep = deployment()
    once = patched(dep, injected_template(dep["spec"]["template"], config()))
    assert template_patch(once, injected_template(once["spec"]["template"], config())) == []
    changed = patched(once, injected_template(once["spec"]["template"], config(port=9000, admin_port=9001)))
    assert [c["name"] for c in changed["spec"]["template"]["spec"]["containers"]].count(names.SIDECAR_CONTAINER) == 1
    removed = patched(changed, removed_template(changed["spec"]["template"]))
    assert removed["spec"]["template"] == dep["spec"]["template"]
    bare = deployment()
    del bare["spec"]["template"]["spec"]["volumes"]
    round_trip = patched(bare, injected_template(bare["spec"]["template"], config()))
    assert (
        patched(round_trip, removed_template(round_trip["spec"]["template"]))["spec"]["template"]
        == bare["spec"]["template"]
    )


def test_a_port_without_a_name_keeps_the_sidecar_port_named_slogate() -> None:
    dep = deployment()
    del dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
    after = patched(dep, injected_template(dep["spec"]["template"], config()))
    sidecar = after["spec"]["template"]["spec"]["containers"][1]
    assert sidecar["ports"][0]["name"] == names.CLIENT_PORT_NAME
    assert patched(after, removed_template(after["spec"]["template"]))["spec"]["template"] == dep["spec"]["template"]


def test_the_llama_probes_naming_the_handed_over_port_name_the_number_and_get_the_name_back() -> None:
    dep = deployment()
    llama = dep["spec"]["template"]["spec"]["containers"][0]
    llama["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http"}}
    llama["livenessProbe"] = {"tcpSocket": {"port": 8080}}
    after = patched(dep, injected_template(dep["spec"]["template"], config()))
    injected = after["spec"]["template"]["spec"]["containers"][0]
    assert injected["readinessProbe"]["httpGet"]["port"] == 8080
    assert injected["livenessProbe"]["tcpSocket"]["port"] == 8080
    removed = patched(after, removed_template(after["spec"]["template"]))
    assert removed["spec"]["template"] == dep["spec"]["template"]


def test_removal_takes_out_only_what_the_injection_recorded() -> None:
    """A user's own container or volume that shares our names is never touched."""
    dep = deployment()
    spec = dep["spec"]["template"]["spec"]
    spec["containers"].append({"name": names.SIDECAR_CONTAINER, "image": "mine:1"})
    spec["volumes"].append({"name": names.TMP_VOLUME, "emptyDir": {}})
    assert removed_template(dep["spec"]["template"]) == dep["spec"]["template"]  # nothing was injected
    with pytest.raises(TargetClaimedError, match="container of its own"):
        injected_template(dep["spec"]["template"], config())


def test_a_template_stored_with_server_defaults_needs_no_patch() -> None:
    """The API server adds defaults the operator never writes: still the same template."""
    dep = deployment()
    once = patched(dep, injected_template(dep["spec"]["template"], config(resources={"requests": {"cpu": "0.5"}})))
    stored = copy.deepcopy(once)
    sidecar = stored["spec"]["template"]["spec"]["containers"][1]
    sidecar |= {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    sidecar["resources"]["requests"]["cpu"] = "500m"  # the server's canonical form of 0.5
    for probe in ("readinessProbe", "livenessProbe"):
        sidecar[probe] |= {"timeoutSeconds": 1, "successThreshold": 1}
        sidecar[probe]["httpGet"]["scheme"] = "HTTP"
    for volume in stored["spec"]["template"]["spec"]["volumes"]:
        if "configMap" in volume:
            volume["configMap"]["defaultMode"] = 420
    again = injected_template(stored["spec"]["template"], config(resources={"requests": {"cpu": "0.5"}}))
    assert template_patch(stored, again) == []
    moved = injected_template(stored["spec"]["template"], config(resources={"requests": {"cpu": "0.5"}}, port=9000))
    assert template_patch(stored, moved) != []


def test_patch_is_guarded_by_the_resource_version() -> None:
    dep = deployment()
    ops = template_patch(dep, injected_template(dep["spec"]["template"], config()))
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    moved_on = copy.deepcopy(dep)
    moved_on["metadata"]["resourceVersion"] = "8"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(moved_on, ops)


def test_a_template_gated_by_another_policy_is_refused() -> None:
    dep = deployment()
    other = injected_template(dep["spec"]["template"], config(policy="other"))
    with pytest.raises(TargetClaimedError, match="other"):
        injected_template(other, config())


def test_sidecar_resources_follow_the_policy() -> None:
    dep = deployment()
    resources = {"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    after = patched(dep, injected_template(dep["spec"]["template"], config(resources=resources)))
    assert after["spec"]["template"]["spec"]["containers"][1]["resources"] == resources
    valid(after)


# ------------------------------------------------------------------------------ ConfigMap, Secret, Event


def test_configmap_secret_and_event_are_valid() -> None:
    cm = builders.thresholds_configmap(POLICY, {"thresholds.json": "{}"}, {names.ANNOTATION_POLICY_DIGEST: "x"})
    valid(cm)
    assert cm["metadata"]["name"] == "smollm2-thresholds"
    secret = builders.admin_token_secret("llm", "slogate-admin-token", "t0ken", [POLICY])
    valid(secret)
    assert builders.secret_token(secret) == "t0ken"
    assert secret["metadata"]["ownerReferences"][0]["controller"] is False  # shared by the namespace's policies
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    event = builders.event(
        POLICY, kind="Warning", reason="CalibrationFailed", message="x" * 5000, now=now, instance="op-0"
    )
    valid(event)
    assert len(event["message"]) == 1024
    again = builders.event(POLICY, kind="Warning", reason="TargetNotFound", message="y", now=now, instance="op-0")
    assert again["metadata"]["name"] != event["metadata"]["name"]


def test_long_policy_names_still_make_valid_objects() -> None:
    long_name = "x" * 250
    policy = builders.PolicyRef(name=long_name, namespace="llm", uid="u")
    valid(builders.thresholds_configmap(policy, {}, {}))
    assert len(builders.policy_label_value(long_name)) <= 63
    valid(builders.event(policy, kind="Normal", reason="R", message="m", now=datetime.now(UTC), instance="i"))
