"""The autoscaling query's text: what it selects and how it is built (the real Prometheus
evaluates it in tests/integration/test_autoscaling_prometheus.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from slogate_operator.demand_query import OFFERED_WORK, demand_query, ratio_query


def test_every_series_is_selected_by_the_workload_and_rated_over_the_window() -> None:
    query = demand_query("llm", "smollm2", window_s=45)
    selector = '{namespace="llm",workload="smollm2"}'
    assert f"{OFFERED_WORK}{selector}[45s]" in query
    assert query.startswith("sum(rate(")
    assert query.endswith("or vector(0)")


def test_the_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1 s"):
        ratio_query('workload="x"', 0)


def test_promtool_parses_the_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make prometheus` installs Debian's prometheus package", pytrace=False)
    rules = {"groups": [{"name": "q", "rules": [{"record": "slogate:demand_pods", "expr": demand_query("llm", "a")}]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yaml")], check=False, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
