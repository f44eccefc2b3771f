"""spec.sidecar's tunable sidecar settings (classHeader, clientReadTimeoutSeconds,
upstreamReadTimeoutSeconds): the CRD and the models take and refuse the same values, and
the injected container's command line, parsed by the real `slogate sidecar` parser, gives
the sidecar exactly those settings, and its own defaults for what the policy leaves unset.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from injected_sidecar import sidecar_settings
from manifests import admission_policy, llama_deployment
from project_files import SCHEMA
from slogate_operator import names
from slogate_operator.injection import injected_template, template_patch
from slogate_operator.sidecar import SidecarConfig, sidecar_container
from slogate_operator.spec import SidecarSpec, SpecError, parse_spec
from slogate_sidecar.settings import SidecarSettings

TUNED = {
    "classHeader": "X-Tier",
    "clientReadTimeoutSeconds": 90,
    "upstreamReadTimeoutSeconds": 300.5,
    "overloadStatus": 529,
}


def policy_with(sidecar: dict[str, Any]) -> dict[str, Any]:
    return admission_policy(sidecar=sidecar)


def crd_errors(policy: dict[str, Any]) -> list[str]:
    """The openAPIV3Schema's verdict (these fields have no CEL rule of their own)."""
    return [error.message for error in jsonschema.Draft4Validator(SCHEMA).iter_errors(policy)]


def model_errors(policy: dict[str, Any]) -> list[str]:
    try:
        parse_spec(policy["spec"])
    except SpecError as error:
        return [str(error)]
    return []


def config_for(sidecar: SidecarSpec) -> SidecarConfig:
    """What the reconcile pass builds from a policy's spec.sidecar."""
    return SidecarConfig(
        policy="smollm2", image="slogate:0.1.0", port=sidecar.port, admin_port=sidecar.admin_port,
        upstream_port=8080, prompt_counting=sidecar.prompt_counting, token_secret="slogate-admin-token",
        settings_flags=sidecar.settings_flags(),
    )  # fmt: skip


# ------------------------------------------------------------------------------ CRD and models


@pytest.mark.parametrize(
    "sidecar",
    [TUNED, {"classHeader": "x-slogate-tier"}, {"clientReadTimeoutSeconds": 0.5}, {"upstreamReadTimeoutSeconds": 3600}],
)
def test_tuned_settings_pass_the_crd_and_the_models(sidecar: dict[str, Any]) -> None:
    policy = policy_with(sidecar)
    assert crd_errors(policy) == []
    assert model_errors(policy) == []


INVALID = {
    "header with a space": {"classHeader": "X Tier"},
    "header with a colon": {"classHeader": "X-Tier:"},
    "empty header": {"classHeader": ""},
    "header past 256 characters": {"classHeader": "X" * 257},
    "zero client timeout": {"clientReadTimeoutSeconds": 0},
    "negative upstream timeout": {"upstreamReadTimeoutSeconds": -1},
    "upstream timeout past an hour": {"upstreamReadTimeoutSeconds": 3601},
    "timeout not a number": {"clientReadTimeoutSeconds": "30s"},
    "overload status not one of 429, 503, 529": {"overloadStatus": 500},
    "overload status as text": {"overloadStatus": "429"},
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_settings_are_refused_by_both(case: str) -> None:
    policy = policy_with(INVALID[case])
    assert crd_errors(policy), f"the CRD accepts: {case}"
    assert model_errors(policy), f"the models accept: {case}"


def test_every_tunable_field_has_a_crd_description_naming_its_flag() -> None:
    properties = SCHEMA["properties"]["spec"]["properties"]["sidecar"]["properties"]
    # One flag per tuned field, in the fields' order (zip's strict: as many of each).
    flags = zip(SidecarSpec.model_validate(TUNED).settings_flags()[::2], TUNED, strict=True)
    for flag, field in flags:
        assert f"slogate sidecar {flag}" in properties[field]["description"], field
        assert "default" not in properties[field], f"{field}: the default is the sidecar's, stated once"


# ------------------------------------------------------------------------------ spec -> container -> sidecar


def test_set_settings_reach_the_sidecar_through_its_command_line(tmp_path: Path) -> None:
    spec = parse_spec(policy_with(TUNED)["spec"]).operator.sidecar
    container = sidecar_container(config_for(spec))
    args = container["args"]
    assert args[args.index("--class-header") + 1] == "X-Tier"
    settings = sidecar_settings(container, tmp_path)
    assert settings.class_header == "X-Tier"
    assert settings.client_read_timeout_s == 90.0
    assert settings.upstream_read_timeout_s == 300.5
    assert settings.overload_status == 529


def test_unset_settings_leave_the_sidecars_own_defaults(tmp_path: Path) -> None:
    spec = parse_spec(policy_with({})["spec"]).operator.sidecar
    container = sidecar_container(config_for(spec))
    flags = {"--class-header", "--client-read-timeout", "--upstream-read-timeout", "--overload-status"}
    assert not flags & set(container["args"])
    settings = sidecar_settings(container, tmp_path)
    defaults = SidecarSettings(upstream=settings.upstream)
    for field in ("class_header", "client_read_timeout_s", "upstream_read_timeout_s", "overload_status"):
        assert getattr(settings, field) == getattr(defaults, field), field


def test_one_setting_alone_passes_one_flag() -> None:
    spec = SidecarSpec.model_validate({"upstreamReadTimeoutSeconds": 120})
    assert spec.settings_flags() == ("--upstream-read-timeout", "120.0")
    args = sidecar_container(config_for(spec))["args"]
    assert args[-2:] == ["--upstream-read-timeout", "120.0"]


def test_changing_a_setting_patches_the_template_and_keeping_it_does_not() -> None:
    deployment = llama_deployment()
    deployment["metadata"] |= {"namespace": "llm", "resourceVersion": "7"}
    before = config_for(SidecarSpec.model_validate({"classHeader": "X-Tier"}))
    deployment["spec"]["template"] = injected_template(deployment["spec"]["template"], before)
    assert template_patch(deployment, injected_template(deployment["spec"]["template"], before)) == []
    after = config_for(SidecarSpec.model_validate({"classHeader": "X-Team"}))
    patch = template_patch(deployment, injected_template(copy.deepcopy(deployment["spec"]["template"]), after))
    (replace,) = [op for op in patch if op["op"] == "replace"]
    (sidecar,) = [c for c in replace["value"]["spec"]["containers"] if c["name"] == names.SIDECAR_CONTAINER]
    assert sidecar["args"][sidecar["args"].index("--class-header") + 1] == "X-Team"
