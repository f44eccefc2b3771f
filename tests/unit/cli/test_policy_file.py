"""``--policy FILE`` takes the AdmissionPolicy a user applies: YAML or JSON, the whole object, its
spec or the policy alone; operator-only fields are left out with a note, unknown ones refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from canned_profiles import smollm2_profile
from slogate_cli.policy_file import read_policy

EXAMPLES = Path(__file__).parents[3] / "examples"


def the_example() -> dict[str, object]:
    """examples/policy-autoscaling.yaml's AdmissionPolicy, as a user applies it."""
    return yaml.safe_load((EXAMPLES / "policy-autoscaling.yaml").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("form", ["yaml", "json-object", "json-spec", "yaml-spec"])
def test_every_form_of_the_applied_policy_reads_as_one_policy(tmp_path: Path, form: str) -> None:
    whole = the_example()
    spec = whole["spec"]
    assert isinstance(spec, dict)
    body = {
        "yaml": yaml.safe_dump(whole),
        "json-object": json.dumps(whole),
        "json-spec": json.dumps(spec),
        "yaml-spec": yaml.safe_dump(spec),
    }[form]
    path = tmp_path / "policy"
    path.write_text(body)
    read = read_policy(path)
    assert read.policy.slo.ttft_seconds == spec["slo"]["ttftSeconds"]  # type: ignore[index]
    assert set(read.ignored) == {"targetRef", "autoscaling"}
    note = read.note()
    assert note is not None
    assert note.startswith("note: ignoring ")
    assert note.endswith(": only the operator reads them")  # in the file's order: targetRef, autoscaling


def test_a_file_with_a_deployment_beside_the_policy_reads_the_policy() -> None:
    read = read_policy(EXAMPLES / "smollm2.yaml")
    assert read.policy.classes  # the example's classes
    assert "targetRef" in read.ignored


def test_a_bare_policy_needs_no_note(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"slo": {"ttftSeconds": 2}, "shedding": {"order": "cost"}}))
    read = read_policy(path)
    assert read.policy.shedding.order == "cost"
    assert read.ignored == ()
    assert read.note() is None


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("slo: {ttftSeconds: 2}\nsloo: 1\n", "sloo"),  # a typo is refused, as the API server would
        ("kind: Deployment\napiVersion: apps/v1\n", "holds no AdmissionPolicy (found Deployment)"),
        ("", "is empty"),
        ("slo: [", "not YAML or JSON"),
        ("kind: AdmissionPolicy\napiVersion: slogate.dev/v1alpha1\nspec: 3\n", "spec must be an object"),
        (
            "kind: AdmissionPolicy\nmetadata: {name: a}\nspec: {}\n---\nkind: AdmissionPolicy\nmetadata: {name: b}\n",
            "holds 2 AdmissionPolicys (a, b)",
        ),
    ],
)
def test_a_file_that_is_no_policy_is_one_line_naming_it(tmp_path: Path, body: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ValueError, match=r"bad\.yaml") as raised:
        read_policy(path)
    assert fragment in str(raised.value)
    assert "\n" not in str(raised.value)


def slogate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slogate_cli.main", *args], capture_output=True, text=True, check=False, timeout=60
    )


def test_derive_takes_the_example_a_user_applies_and_says_what_it_ignores(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(smollm2_profile().model_dump_json(by_alias=True))
    done = slogate("derive", "--profile", str(profile), "--policy", str(EXAMPLES / "policy-autoscaling.yaml"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["classes"]
    assert "note: ignoring targetRef, autoscaling: only the operator reads them" in done.stderr


def test_a_policy_file_with_the_flags_it_replaces_is_an_error(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(smollm2_profile().model_dump_json(by_alias=True))
    policy = EXAMPLES / "policy-minimal.yaml"
    done = slogate("derive", "--profile", str(profile), "--policy", str(policy), "--slo-ttft", "3")
    assert done.returncode == 2
    assert "give --policy or --slo-ttft, not both" in done.stderr
