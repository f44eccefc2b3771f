"""The Dockerfiles, read statically (no Docker engine here; `make e2e` builds them)."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib

import yaml
from chart_tools import CHART, REPO, load_values, notes, one, render

from slogate_operator import settings

DOCKERFILE = (REPO / "Dockerfile").read_text()
MODEL_DOCKERFILE = (REPO / "e2e" / "model.Dockerfile").read_text()


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


def final_stage(text: str) -> list[tuple[str, str]]:
    steps = instructions(text)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def test_slogate_image_runs_slogate_as_a_numeric_non_root_user() -> None:
    final = final_stage(DOCKERFILE)
    assert final[0][1].split()[0] == "${PYTHON_IMAGE}"
    assert "slim" in re.search(r"ARG PYTHON_IMAGE=(\S+)", DOCKERFILE).group(1)  # type: ignore[union-attr]
    users = [args for op, args in final if op == "USER"]
    # Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
    assert users == ["65532:65532"]
    assert ("ENTRYPOINT", '["slogate"]') in final
    # The chart's containers and the injected sidecars run as this user.
    operator = one(render(), "Deployment", "-operator").obj["spec"]["template"]["spec"]
    assert operator["securityContext"]["runAsUser"] == 65532


def test_slogate_image_writes_nothing_outside_tmp_at_run_time() -> None:
    env = " ".join(args for op, args in final_stage(DOCKERFILE) if op == "ENV")
    for variable in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR"):
        value = re.search(rf"\b{variable}=(\S+)", env)
        assert value, variable
        assert value.group(1).startswith("/tmp"), variable
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    # Bytecode is compiled at build time instead.
    assert "compileall" in DOCKERFILE


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]  # fmt: skip
    for must_be_ignored in (".git", ".venv", "tests", "e2e", ".slogate"):
        assert must_be_ignored in ignored, must_be_ignored
    copies = [args.split() for op, args in instructions(DOCKERFILE) if op == "COPY" and "--from" not in args]
    assert copies
    for *sources, _destination in copies:
        for source in sources:
            assert (REPO / source).exists(), source
            assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), f"{source} is .dockerignored"
    # Every folder the distribution finds its packages in is copied: the image builds the one
    # distribution, so a folder left out is a package missing at run time (sim/ once was).
    copied = {source for *sources, _ in copies for source in sources}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = set(project["tool"]["setuptools"]["packages"]["find"]["where"])
    assert "sim" in folders
    assert folders | {"pyproject.toml"} <= copied, sorted(folders - copied)


def test_the_entrypoint_needs_only_runtime_dependencies() -> None:
    """The image installs pyproject's runtime dependencies only: `slogate --help` (which the
    build runs) and the operator, sidecar and calibrator code must not import a dev extra."""
    probe = (
        "import sys, slogate_cli.main as m, slogate_operator.handlers, slogate_sidecar.app, "
        "slogate_calibration.calibrate; m.build_parser(); print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded = {name.split(".")[0] for name in done.stdout.split()}
    dev_only = {"matplotlib", "pytest", "hypothesis", "kubernetes_validate", "jsonschema", "helm_python",
                "schemathesis", "mypy"}  # fmt: skip
    assert loaded & dev_only == set()
    assert {"kopf", "aiohttp", "pydantic", "prometheus_client"} <= loaded


# ---------------------------------------------------------------- names: nothing pretends


def example_images() -> list[str]:
    example = yaml.safe_load_all((REPO / "examples" / "smollm2.yaml").read_text())
    (deployment,) = [d for d in example if d and d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    return [c["image"] for c in [*pod.get("initContainers", []), *pod["containers"]]]


def test_every_default_image_of_ours_is_the_local_name_its_build_gives() -> None:
    """No registry publishes slogate's images: the chart, the operator, the example and the
    e2e suite default to the names `docker build` gives them here, which `kind load` puts on
    a kind cluster and docs/install.md tells everyone else to push and set."""
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert load_values(CHART / "values.yaml")["image"]["repository"] == "slogate"
    assert f"slogate:{app_version}" == settings.DEFAULT_IMAGE
    assert load_values(REPO / "e2e" / "values.yaml")["image"]["repository"] == "slogate"
    (model,) = [image for image in example_images() if "gguf" in image]
    assert "/" not in model, "the model image is ours to build: a local name, as the slogate image"
    (upstream,) = [image for image in example_images() if image != model]
    assert upstream.startswith("ghcr.io/ggml-org/llama.cpp:"), "llama.cpp's own, published image"
    builds = {
        settings.DEFAULT_IMAGE: f"docker build -t {settings.DEFAULT_IMAGE} .",
        model: f"docker build -t {model} -f e2e/model.Dockerfile e2e",
    }
    install = (REPO / "docs" / "install.md").read_text()
    loads = [line.split() for line in install.splitlines() if line.startswith("kind load docker-image ")]
    for image, build in builds.items():
        assert build in install, build
        assert any(image in load for load in loads), f"docs/install.md loads no {image} into kind"
        assert f"docker push $REGISTRY/{image}" in install, image
    assert builds[settings.DEFAULT_IMAGE] in DOCKERFILE
    assert builds[model] in MODEL_DOCKERFILE


def test_no_file_names_a_registry_or_repository_that_is_not_ours() -> None:
    files = [
        *(p for p in CHART.rglob("*") if p.is_file()),
        REPO / "Dockerfile",
        *(REPO / "e2e").glob("*.py"),
        *(REPO / "e2e").glob("*.yaml"),
        REPO / "e2e" / "model.Dockerfile",
        *(REPO / "examples").glob("*.yaml"),
        *(REPO / "docs").glob("*.md"),
        *(REPO / "operator" / "slogate_operator").glob("*.py"),
        REPO / "README.md",
    ]
    for path in files:
        text = path.read_text()
        for pretended in ("ghcr.io/slogate", "github.com/slogate", "docker.io/slogate"):
            assert pretended not in text, f"{path.relative_to(REPO)} names {pretended}"


def test_the_notes_say_when_the_image_is_a_local_name() -> None:
    local = notes()
    assert "slogate:0.1.0 is a local name, which no registry serves" in local
    assert "kind load docker-image slogate:0.1.0" in local
    pushed = notes({"image": {"repository": "registry.example.com/team/slogate"}})
    assert "Image: registry.example.com/team/slogate:0.1.0" in pushed
    assert "local name" not in pushed
    sidecar = notes(
        {"image": {"repository": "registry.example.com/team/slogate"}, "operator": {"sidecarImage": "slogate:dev"}}
    )
    assert "slogate:dev is a local name" in sidecar
    assert "set operator.sidecarImage" in sidecar


def test_the_image_carries_the_license_pyproject_declares() -> None:
    license_text = (REPO / "LICENSE").read_text()
    assert license_text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert 'license = { text = "Apache-2.0" }' in (REPO / "pyproject.toml").read_text()
    assert ("COPY", "LICENSE /usr/share/doc/slogate/LICENSE") in final_stage(DOCKERFILE)
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in DOCKERFILE
