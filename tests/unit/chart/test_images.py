"""The Dockerfiles, read statically (no Docker engine here; `make e2e` builds them)."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys

from chart_tools import REPO, one, render

DOCKERFILE = (REPO / "Dockerfile").read_text()


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
    # Every package the console script dispatches to is copied.
    copied = {source for *sources, _ in copies for source in sources}
    assert {"admission", "calibration", "sidecar", "operator", "bench", "cli", "pyproject.toml"} <= copied


def test_the_entrypoint_needs_only_runtime_dependencies() -> None:
    """The image installs pyproject's runtime dependencies only: `slogate --help` (which the
    build runs) and the operator, sidecar and calibrator code must not import a dev extra."""
    probe = (
        "import sys, slogate_cli.main as m, slogate_operator.handlers, slogate_sidecar.app, "
        "slogate_calibration.calibrate; m.build_parser(); print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded = {name.split(".")[0] for name in done.stdout.split()}
    dev_only = {"matplotlib", "pytest", "hypothesis", "kmock", "kubernetes_validate", "jsonschema", "helm_python",
                "schemathesis", "mypy"}  # fmt: skip
    assert loaded & dev_only == set()
    assert {"kopf", "aiohttp", "pydantic", "prometheus_client"} <= loaded
