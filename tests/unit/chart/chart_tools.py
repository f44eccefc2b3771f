"""Render the Helm chart offline and hand its parts to the tools that check them; load the
end-to-end suite's modules for the tests of its parts that run without a cluster.

Shared by the chart tests here and by tests/integration/test_alerting_shedding.py (which
imports it as ``unit.chart.chart_tools``: tests/ is on sys.path through its conftest).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "slogate"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
RELEASE = "slogate"
NAMESPACE = "slogate-system"
E2E = REPO / "e2e"

# API groups whose objects are custom resources (no built-in schema in kubernetes-validate).
CUSTOM_GROUPS = frozenset({"slogate.dev", "kopf.dev", "monitoring.coreos.com"})


@dataclass(frozen=True)
class Rendered:
    """One object the chart renders, and the template it came from."""

    template: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def group(self) -> str:
        api_version = str(self.obj["apiVersion"])
        return api_version.split("/", maxsplit=1)[0] if "/" in api_version else ""


def load_values(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text()) or {}
    assert isinstance(loaded, dict), f"{path}: values must be a mapping"
    return loaded


def render_files(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered text, exactly as `helm template` would produce it."""
    chart = helm_python.Chart.load(str(CHART))
    try:
        return chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
    finally:
        chart.close()


def render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[Rendered]:
    """Every object the chart renders for these values (NOTES.txt excluded)."""
    objects: list[Rendered] = []
    for template, text in sorted(render_files(values, namespace=namespace).items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(Rendered(template, doc))
    return objects


def notes(values: dict[str, Any] | None = None) -> str:
    return next(text for path, text in render_files(values).items() if path.endswith("NOTES.txt"))


def one(objects: list[Rendered], kind: str, name_suffix: str = "") -> Rendered:
    found = [o for o in objects if o.kind == kind and o.name.endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {[o.name for o in found]}"
    return found[0]


def chart_crds() -> list[dict[str, Any]]:
    """The CRDs the chart installs from its crds/ (Helm never templates these)."""
    docs: list[dict[str, Any]] = []
    for path in sorted((CHART / "crds").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """spec.groups of the rendered PrometheusRule: the project's alert rules."""
    rules = one(render(values), "PrometheusRule")
    groups: list[dict[str, Any]] = rules.obj["spec"]["groups"]
    return groups


def alerts_by_name(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def write_rules_file(path: Path, values: dict[str, Any] | None = None) -> Path:
    """A plain Prometheus rules file (what the PrometheusRule hands Prometheus)."""
    path.write_text(yaml.safe_dump({"groups": rule_groups(values)}, sort_keys=False))
    return path


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard, as the rendered ConfigMap carries it."""
    configmap = one(render(), "ConfigMap", "-dashboard")
    loaded: dict[str, Any] = json.loads(configmap.obj["data"]["slogate.json"])
    return loaded


def dashboard_exprs(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every query of every panel and annotation."""
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
        for inner in panel.get("panels", []):  # collapsed rows keep their panels inside
            for target in inner.get("targets", []):
                yield f"panel {inner['title']!r} target {target['refId']}", target["expr"]
    for annotation in board.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            yield f"annotation {annotation['name']!r}", annotation["expr"]


def concrete(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced, so Prometheus can parse it."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


_METRIC = re.compile(r"\b(slogate_[a-z0-9_]+|kube_[a-z0-9_]+)\b")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (slogate_* and kube-state-metrics' kube_*)."""
    return set(_METRIC.findall(expr))


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: `make prometheus` installs Debian's prometheus package"
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def load_e2e(relative: str) -> ModuleType:
    """An e2e/ module by its path under e2e/ without ``.py`` (``"suite"``, ``"kube/machine_lock"``),
    under a name no test module uses."""
    # e2e modules import each other, and e2e/kube's (conftest puts both on the path), by bare name
    sys.path[:0] = [str(E2E), str(E2E / "kube")]
    try:
        name = "slogate_e2e_" + relative.replace("/", "_")
        spec = importlib.util.spec_from_file_location(name, E2E / f"{relative}.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(E2E))
        sys.path.remove(str(E2E / "kube"))
